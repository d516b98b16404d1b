"""The three critic kinds behind one interface (:class:`CriticLearner`), so the trainer never asks which it has.

* ``separate`` — :class:`SeparateLearner`: the asymmetric critic, its own model,
  tokenizer, optimizer and learning rate; reads the state as text, plus
  privileged text when configured. Trained on GAE returns, or on TD targets
  from a Polyak-averaged target network over a replay buffer
  (``critic.target: td``; the target network exists only then).
* ``shared`` — :class:`SharedLearner`: a value head on the actor's hidden states
  (the symmetric baseline). Its loss joins the actor's step (the trunk is
  shared), except during critic warm-up where only the head trains.
* ``none`` — :class:`NoCritic`: values are zero; the trainer uses the
  group-relative baseline over episodes of the same task.

Every kind follows one rule for the state after an episode's last turn
(:func:`bootstraps`, docs/ARCHITECTURE.md "Episode ends and bootstrapping").
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from polyturn.algos.baselines import group_relative_advantages
from polyturn.algos.gae import next_state_values, turn_gae
from polyturn.algos.value import polyak_update, td_targets, value_loss
from polyturn.config import CriticConfig
from polyturn.models.actor import Actor
from polyturn.models.critic import SeparateCritic, ValueHead, make_target
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.types import Episode
from polyturn.runtime import CPU, Runtime
from polyturn.train import distributed
from polyturn.train.batch import MicroStats, TokenBatch, length_batches, micro_batches


def _clip(old_values: torch.Tensor, clip_range: float | None) -> dict:
    """Value-clipping arguments for :func:`value_loss`: both or neither."""
    return {"old_values": old_values, "clip_range": clip_range} if clip_range is not None else {}


def turn_tensors(episodes: Sequence[Episode]) -> dict[str, torch.Tensor]:
    """``rewards``, ``terminated``, ``truncated``, ``mask`` as ``[E, T]`` (T the longest episode)."""
    e, t = len(episodes), max(len(ep.turns) for ep in episodes)
    out = {k: torch.zeros(e, t) for k in ("rewards", "terminated", "truncated", "mask")}
    for i, ep in enumerate(episodes):
        for j, turn in enumerate(ep.turns):
            out["rewards"][i, j] = turn.reward
            out["terminated"][i, j] = float(turn.terminated)
            out["truncated"][i, j] = float(turn.truncated and not turn.terminated)
            out["mask"][i, j] = 1.0
    return out


def bootstraps(ep: Episode) -> bool:
    """Whether credit assignment bootstraps from V of the state after ``ep``'s last turn.

    Only a truncation that is not part of the task does. A terminated episode has
    nothing after it. The env's own turn limit is part of the task: the state
    counts the turns left (feature ``turns_left``) and the env scores reaching it
    as an outcome (``outcome/timeout``), so the state after it, with no turn left,
    is worth exactly 0 and no critic is asked (it never trains on such a state).
    A truncation whose final state still has turns left (or that does not count
    them) cut a task that could have gone on: V of that state stands in for the rest.
    """
    return ep.truncated and ep.final_features.get("turns_left", 1.0) > 0


def state_input(ep: Episode, t: int) -> CriticInput:
    """The critic's view of the state before turn ``t`` (``t == len(turns)``: the state after the last turn)."""
    if t < len(ep.turns):
        turn = ep.turns[t]
        return CriticInput(
            task=ep.question, history=ep.history(t), privileged=turn.privileged, action=turn.action,
            features=turn.features,
        )
    return CriticInput(
        task=ep.question, history=ep.history(t), privileged=ep.final_privileged, action=None,
        features=ep.final_features,
    )


class CriticLearner:
    """What the trainer asks of a critic; this base class is the critic-free baseline's (values 0, no training).

    * :meth:`values` — ``V(s_t)`` and ``V(s_{t+1})`` for GAE (no grad);
    * :meth:`advantages` — per-turn advantages and returns (turn-level GAE here);
    * :attr:`task_group` — episodes collected per task (several for baselines and pairs that compare them);
    * :meth:`update` — the critic's own optimizer steps on the batch's targets;
    * :meth:`actor_loss`, :meth:`joint_parameters`, :meth:`joint_optimizer` —
      loss terms the actor's step adds, and the parameters and optimizer that
      step then also clips and steps (a critic that shares the actor's trunk);
    * :meth:`optimizers`, :meth:`save`, :meth:`load` — checkpoint state.
    """

    kind = "none"
    runtime: Runtime = CPU
    #: Whether :meth:`update` reads only its arguments and the critic's own modules, never the actor (nor state the
    #: next collection sets): the trainer may then run it beside the next iteration's sampling.
    update_apart = False

    def to(self, runtime: Runtime) -> None:
        """Move the critic's modules to ``runtime.device``; its forward passes then run under its autocast.

        Values come back to the host as float32 ``[E, T]`` (GAE is tiny and runs there).
        """
        self.runtime = runtime

    def values(self, episodes: Sequence[Episode], batch: TokenBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, next_values)``, both ``[E, T]``, for :func:`polyturn.algos.gae.turn_gae`."""
        tt = turn_tensors(episodes)
        z = torch.zeros_like(tt["rewards"])
        return z, z

    @property
    def task_group(self) -> int:
        """Episodes the trainer collects per task seed."""
        return 1

    @property
    def has_values(self) -> bool:
        """Whether :meth:`values` are state values worth an explained-variance figure."""
        return True

    def advantages(self, episodes: Sequence[Episode], tt: dict[str, torch.Tensor], values: torch.Tensor,
                   next_values: torch.Tensor, *, gamma: float, lam: float,
                   reward_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` ``[E, T]`` from the batch's (reward-scaled) ``tt``: turn-level GAE."""
        return turn_gae(tt["rewards"], values, next_values, tt["terminated"], tt["mask"], gamma=gamma, lam=lam)

    def update(self, episodes: Sequence[Episode], returns: torch.Tensor, old_values: torch.Tensor, *, gamma: float,
               reward_scale: float = 1.0, with_actor: bool = False) -> dict[str, float]:
        """Train on the batch's return targets (already reward-scaled); returns logged metrics.

        ``with_actor``: an actor step follows on this batch (a learner that trains
        inside it, through :meth:`actor_loss`, skips its own update then).
        """
        return {}

    def actor_loss(self, episodes: Sequence[Episode], batch: TokenBatch, hidden: torch.Tensor, returns: torch.Tensor,
                   old_values: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Loss terms to add to the actor's loss on a minibatch (None: none), and their metrics."""
        return None, {}

    def joint_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters that :meth:`actor_loss` trains inside the actor's step (clipped with the actor's)."""
        return []

    def joint_optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer of :meth:`joint_parameters`, stepped with the actor's."""
        return None

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimizers whose state a checkpoint keeps, by name."""
        return {}

    def save(self, directory: Path) -> None:
        """Write the critic's part of a checkpoint into ``directory`` (nothing for the critic-free baseline)."""

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote (before the optimizer states are loaded into :meth:`optimizers`)."""


def episode_advantages(episodes: Sequence[Episode], reward_scale: float) -> torch.Tensor:
    """``[E]``: each episode's (scaled) return against the other attempts at its task (RLOO; an episode's seed is
    its task's)."""
    rets = torch.tensor([ep.episode_return for ep in episodes]) * reward_scale
    return group_relative_advantages(rets, torch.tensor([ep.seed for ep in episodes]))


class NoCritic(CriticLearner):
    """``critic.kind: none``: group-relative advantages over ``group_size`` episodes per task instead of values."""

    def __init__(self, *, group_size: int = 4) -> None:
        self.group_size = group_size

    @property
    def task_group(self) -> int:
        return self.group_size

    @property
    def has_values(self) -> bool:
        return False

    def advantages(self, episodes: Sequence[Episode], tt: dict[str, torch.Tensor], values: torch.Tensor,
                   next_values: torch.Tensor, *, gamma: float, lam: float,
                   reward_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Each episode's return minus its task group's mean (every turn shares it); returns are reward-to-go."""
        adv = episode_advantages(episodes, reward_scale)[:, None] * tt["mask"]
        return adv, tt["rewards"].flip(1).cumsum(1).flip(1) * tt["mask"]


class SeparateLearner(CriticLearner):
    """The asymmetric critic with its own optimizer (and, for ``critic.target: td``, a Polyak-averaged target)."""

    kind = "separate"
    update_apart = True

    def __init__(self, critic: SeparateCritic, cfg: CriticConfig, *, seed: int = 0) -> None:
        self.critic = critic
        # Only TD targets read the target network: no copy to update and save otherwise.
        self.target = make_target(critic) if cfg.target == "td" else None
        self.cfg = cfg
        self.opt = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=cfg.lr)
        self.replay: list[tuple[CriticInput, float, CriticInput, bool]] = []
        self.rng = random.Random(seed)

    def to(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.critic.to(runtime.device)
        if self.target is not None:
            self.target.to(runtime.device)

    def _forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The critic on an encoded minibatch, under the run's autocast; outputs in float32."""
        with self.runtime.autocast():
            out = self.critic(batch)
        return {k: v.float() for k, v in out.items()}

    @torch.no_grad()
    def values(self, episodes: Sequence[Episode], batch: TokenBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        tt = turn_tensors(episodes)
        inputs = [state_input(ep, t) for ep in episodes for t in range(len(ep.turns))]
        finals = [i for i, ep in enumerate(episodes) if bootstraps(ep)]
        inputs += [state_input(ep, len(ep.turns)) for ep in (episodes[i] for i in finals)]
        self.critic.eval()
        with self.runtime.autocast():
            v = self.critic.values(inputs, batch_size=128).float().cpu()
        values = torch.zeros_like(tt["rewards"])
        k = 0
        for i, ep in enumerate(episodes):
            n = len(ep.turns)
            values[i, :n] = v[k : k + n]
            k += n
        final = torch.zeros(len(episodes))
        for j, i in enumerate(finals):
            final[i] = v[k + j]
        return values, next_state_values(values, tt["mask"], final)

    def _step(self, losses: Iterable[torch.Tensor]) -> float:
        """One optimizer step on the summed gradients of ``losses`` (each backpropagated before the next is drawn)."""
        self.opt.zero_grad(set_to_none=True)
        for loss in losses:
            loss.backward()
        distributed.sum_gradients(self.critic.parameters())  # the other torchrun processes' micro-batches
        norm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.max_grad_norm)
        if torch.isfinite(norm):
            self.opt.step()
            if self.target is not None:
                polyak_update(self.target, self.critic, self.cfg.tau)
        return float(norm)

    def update(self, episodes: Sequence[Episode], returns: torch.Tensor, old_values: torch.Tensor, *, gamma: float,
               reward_scale: float = 1.0, with_actor: bool = False) -> dict[str, float]:
        """Value (and Q) regression on GAE returns, or TD steps over the replay buffer; the actor's step is apart."""
        if self.cfg.target == "td":
            return self._update_td(episodes, gamma=gamma, reward_scale=reward_scale)
        inputs = [state_input(ep, t) for ep in episodes for t in range(len(ep.turns))]
        targets = torch.tensor([[float(returns[i, t]), float(old_values[i, t])]
                                for i, ep in enumerate(episodes) for t in range(len(ep.turns))])
        enc = self.critic.encode(inputs)  # once: every minibatch is a slice of it
        lengths = enc["attention_mask"].sum(1).tolist()
        self.critic.train()
        stats: dict[str, list[float]] = {}
        real = padded = 0
        for _ in range(self.cfg.epochs):
            # Minibatches of similar lengths, then micro-batches under critic.microbatch_tokens: little padding.
            for mb in length_batches(lengths, self.cfg.minibatch, self.rng):
                acc = MicroStats()
                norm = self._step(self._gae_losses(enc, lengths, mb, targets, acc))
                stats.setdefault("grad/critic_norm", []).append(norm)
                for k, v in acc.result().items():
                    stats.setdefault(k, []).append(v)
                real, padded = real + acc.real, padded + acc.padded
        return {**{k: sum(v) / len(v) for k, v in stats.items()}, "perf/critic_padding": 1 - real / max(1, padded)}

    def _gae_losses(self, enc: dict[str, torch.Tensor], lengths: Sequence[int], mb: Sequence[int],
                    targets: torch.Tensor, acc: MicroStats) -> Iterator[torch.Tensor]:
        """Minibatch ``mb``'s value (and Q) loss as micro-batch losses, each weighted by its share of the rows."""
        for micro in distributed.shard(micro_batches([[lengths[i]] for i in mb], self.cfg.microbatch_tokens)):
            rows = [mb[j] for j in micro]
            acc.count([[lengths[i]] for i in rows])
            out = self._forward(encoded_rows(enc, rows))
            ret, old = targets[rows].to(self.runtime.device).unbind(1)
            ones = torch.ones_like(ret)
            vl = value_loss(out["value"], ret, ones, **_clip(old, self.cfg.value_clip))
            loss, share = vl["loss"], len(rows) / len(mb)
            acc.add({"losses/value_loss": vl["loss"]}, share)
            if "q" in out:
                ql = value_loss(out["q"], ret, ones)
                loss = loss + ql["loss"]
                acc.add({"losses/q_loss": ql["loss"]}, share)
            yield share * loss

    def _update_td(self, episodes: Sequence[Episode], *, gamma: float, reward_scale: float) -> dict[str, float]:
        """Off-policy: one-step TD targets from the target network over a replay buffer of turn transitions."""
        for ep in episodes:
            for t, turn in enumerate(ep.turns):
                # The episode-end rule of GAE (bootstraps): only a cut that is not the turn limit bootstraps.
                done = turn.terminated or (turn.truncated and not bootstraps(ep))
                self.replay.append((state_input(ep, t), turn.reward * reward_scale, state_input(ep, t + 1), done))
        del self.replay[: max(0, len(self.replay) - self.cfg.replay_size)]
        n_new = sum(len(ep.turns) for ep in episodes)
        self.critic.train()
        losses, norms = [], []
        for _ in range(self.cfg.epochs * max(1, n_new // self.cfg.minibatch)):
            mb = self.rng.sample(self.replay, min(self.cfg.minibatch, len(self.replay)))
            with torch.no_grad(), self.runtime.autocast():
                nxt = self.target.values([x[2] for x in mb], batch_size=len(mb)).float().cpu()
            y = td_targets(
                torch.tensor([x[1] for x in mb]), nxt, torch.tensor([x[3] for x in mb]), gamma=gamma
            ).to(self.runtime.device)
            v = self._forward(self.critic.encode([x[0] for x in mb]))["value"]
            vl = value_loss(v, y, torch.ones_like(y))
            losses.append(vl["loss"].item())
            norms.append(self._step([vl["loss"]]))
        return {"losses/value_loss": sum(losses) / len(losses), "grad/critic_norm": sum(norms) / len(norms)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic": self.opt}

    def save(self, directory: Path) -> None:
        """``critic/``, its sampling RNG; with TD targets also ``critic_target/`` and the replay buffer ``replay.pt``."""
        self.critic.save_pretrained(directory / "critic")
        with (directory / "critic_rng.pt").open("wb") as f:
            pickle.dump(self.rng.getstate(), f)  # minibatch order: resume continues it exactly
        if self.target is not None:
            self.target.save_pretrained(directory / "critic_target")
        if self.replay:
            with (directory / "replay.pt").open("wb") as f:
                pickle.dump(self.replay, f)

    def load(self, directory: Path) -> None:
        self.critic = SeparateCritic.from_pretrained(directory / "critic").to(self.runtime.device)
        if self.cfg.target == "td":
            # A checkpoint written with GAE targets has none: start the target from the critic, as a new run does.
            saved = directory / "critic_target"
            target = SeparateCritic.from_pretrained(saved).to(self.runtime.device) if saved.is_dir() else self.critic
            self.target = make_target(target)
        else:
            self.target = None
        self.opt = torch.optim.AdamW([p for p in self.critic.parameters() if p.requires_grad], lr=self.cfg.lr)
        if (directory / "replay.pt").is_file():
            with (directory / "replay.pt").open("rb") as f:
                self.replay = pickle.load(f)
        if (directory / "critic_rng.pt").is_file():
            with (directory / "critic_rng.pt").open("rb") as f:
                self.rng.setstate(pickle.load(f))


def encoded_rows(enc: dict[str, torch.Tensor], rows: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows of a right-padded :meth:`SeparateCritic.encode` batch, cut to their longest: as encoding them alone."""
    n = int(enc["attention_mask"][rows].sum(1).max())
    return {k: v[rows] if k == "features" else v[rows, :n] for k, v in enc.items()}


def state_positions(batch: TokenBatch, n_turns: int) -> torch.Tensor:
    """``[S, T+1]`` token positions where the shared critic reads each state (-1: the turn is not in the segment).

    Column ``t < T``: the last token before turn ``t``'s action (its hidden state
    predicts the action's first token). Column ``T``: the segment's last token,
    which after a truncated last turn is the last token of the appended
    observation and its assistant opening (the collector appends them): the
    same kind of token as every other state.
    """
    s, _ = batch.turn_index.shape
    turn_index, lengths = batch.turn_index.cpu(), batch.attention_mask.sum(1).tolist()  # host loops, one transfer
    pos = torch.full((s, n_turns + 1), -1, dtype=torch.long)
    for r in range(s):
        ti = turn_index[r]
        for t in torch.unique(ti[ti >= 0]).tolist():
            pos[r, t] = int((ti == t).nonzero()[0])  # target grid index i is token i's hidden state
        pos[r, n_turns] = int(lengths[r]) - 1
    return pos.to(batch.turn_index.device)


def values_from_hidden(head: ValueHead, hidden: torch.Tensor, batch: TokenBatch, episodes: Sequence[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn values ``[E, T]`` and the after-last-turn value ``[E]`` read from the actor's hidden states."""
    n_turns = max(len(ep.turns) for ep in episodes)
    pos = state_positions(batch, n_turns)
    seg_vals = head(hidden, positions=pos)  # [S, T+1]
    values = torch.zeros(len(episodes), n_turns + 1, device=seg_vals.device)
    for r in range(pos.shape[0]):
        e = int(batch.episode_index[r])
        have = pos[r, :n_turns] >= 0
        values[e, :n_turns] = torch.where(have, seg_vals[r, :n_turns], values[e, :n_turns])
    last_seg = {int(e): r for r, e in enumerate(batch.episode_index.tolist())}
    final = torch.stack([seg_vals[last_seg[e], n_turns] for e in range(len(episodes))])
    return values[:, :n_turns], final


class SharedLearner(CriticLearner):
    """``critic.kind: shared``: a value head on the actor's last hidden states (symmetric baseline)."""

    kind = "shared"

    def __init__(self, actor: Actor, cfg: CriticConfig) -> None:
        self.actor = actor
        self.cfg = cfg
        hidden = actor.model.config.hidden_size
        self.head = ValueHead(hidden)  # no target network: GAE returns are its only targets
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr)

    def to(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.head.to(runtime.device)

    @torch.no_grad()
    def values(self, episodes: Sequence[Episode], batch: TokenBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        assert batch is not None, "the shared critic reads the actor's hidden states: pass the token batch"
        tt = turn_tensors(episodes)
        hidden = self.actor.hidden_states(batch.input_ids, batch.attention_mask)
        values, final = (v.float().cpu() for v in values_from_hidden(self.head, hidden, batch, episodes))
        final = final * torch.tensor([float(bootstraps(ep)) for ep in episodes])
        return values, next_state_values(values, tt["mask"], final)

    def head_loss(self, episodes: Sequence[Episode], batch: TokenBatch, hidden: torch.Tensor, returns: torch.Tensor,
                  old_values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Value loss on the actor's hidden states (pass them detached to train the head alone)."""
        values, _ = values_from_hidden(self.head, hidden, batch, episodes)
        dev = values.device
        mask = turn_tensors(episodes)["mask"].to(dev)
        # A minibatch's longest episode may be shorter than the batch's: the extra columns are padding.
        t = values.shape[1]
        vl = value_loss(values, returns[:, :t].to(dev), mask, **_clip(old_values[:, :t].to(dev), self.cfg.value_clip))
        return vl["loss"], {"losses/value_loss": vl["loss"].item()}

    def actor_loss(self, episodes: Sequence[Episode], batch: TokenBatch, hidden: torch.Tensor, returns: torch.Tensor,
                   old_values: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The head's value loss through the shared trunk: the actor's step trains both."""
        return self.head_loss(episodes, batch, hidden, returns, old_values)

    def joint_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.head.parameters())

    def joint_optimizer(self) -> torch.optim.Optimizer | None:
        return self.opt

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic": self.opt}

    def update(self, episodes: Sequence[Episode], returns: torch.Tensor, old_values: torch.Tensor, *, gamma: float,
               reward_scale: float = 1.0, with_actor: bool = False) -> dict[str, float]:
        """Head-only update (critic warm-up); with an actor step the head trains inside it (:meth:`actor_loss`)."""
        from polyturn.train.batch import make_token_batch

        if with_actor:
            return {}
        batch = make_token_batch([(i, s) for i, ep in enumerate(episodes) for s in ep.segments], pad_id=self.actor.pad_id,
                                 device=self.runtime.device)
        with torch.no_grad():
            hidden = self.actor.hidden_states(batch.input_ids, batch.attention_mask)
        loss, stats = self.head_loss(episodes, batch, hidden, returns, old_values)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        return stats

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(directory / "value_head.safetensors"))

    def load(self, directory: Path) -> None:
        self.head.load_state_dict(load_file(str(directory / "value_head.safetensors"), device=str(self.runtime.device)))
