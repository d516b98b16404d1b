"""``critic.kind: separate``: the asymmetric critic, with its own model, tokenizer, optimizer and learning rate.

It reads the state as text, plus privileged text when ``critic.privileged``. Trained on GAE returns, or on TD
targets from a Polyak-averaged target network over a replay buffer (``critic.target: td``; the target network
exists only then).
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

from polyturn.algos.gae import next_state_values
from polyturn.algos.value import polyak_update, td_targets, value_loss
from polyturn.config import CriticConfig, TrainConfig
from polyturn.models.actor import Actor
from polyturn.models.critic import SeparateCritic, make_target
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime
from polyturn.train import distributed
from polyturn.train.batch import MicroStats, TokenBatch, length_batches, micro_batches
from polyturn.train.critics.base import CriticLearner, bootstraps, clip_args, state_input, turn_duration, turn_tensors
from polyturn.train.critics.encoders import encoder_critic


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
        #: (state, reward, next state, done, duration): a semi-MDP turn of ``duration`` steps bootstraps by
        #: ``gamma ** duration``.
        self.replay: list[tuple[CriticInput, float, CriticInput, bool, int]] = []
        self.rng = random.Random(seed)

    @classmethod
    def check(cls, cfg: TrainConfig, *, world_size: int = 1) -> None:
        super().check(cfg, world_size=world_size)
        if cfg.critic.target == "td" and world_size > 1:
            raise ValueError("Expected one process per run with critic.target = td (one replay buffer), got --nproc "
                             f"{world_size}: use critic.target=gae with --nproc, or train in one process")

    @classmethod
    def build(cls, cfg: TrainConfig, *, demos: Sequence[dict], actor: Actor,
              feature_names: Sequence[str] | None) -> CriticLearner:
        return cls(encoder_critic(cfg, demos, feature_names), cfg.critic, seed=cfg.run.seed)

    def to(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.critic.to(runtime.device)
        if self.target is not None:
            self.target.to(runtime.device)

    def scorer(self) -> Callable[[Sequence[CriticInput]], list[float]] | None:
        """With ``critic.q``: Q(s, a) of candidate turns (no grad, eval mode), in the units of the critic's returns
        (``rollout.best_of_rank: cost`` reads it); None without a Q head."""
        if not self.critic.config.q:
            return None

        def score(inputs: Sequence[CriticInput]) -> list[float]:
            self.critic.eval()
            with torch.no_grad(), self.runtime.autocast():
                return self.critic.q_values(list(inputs), batch_size=128).float().cpu().tolist()

        return score

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
            vl = value_loss(out["value"], ret, ones, **clip_args(old, self.cfg.value_clip))
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
                self.replay.append((state_input(ep, t), turn.reward * reward_scale, state_input(ep, t + 1), done,
                                    turn_duration(turn, where=f"turn {t} of episode seed {ep.seed}")))
        del self.replay[: max(0, len(self.replay) - self.cfg.replay_size)]
        n_new = sum(len(ep.turns) for ep in episodes)
        self.critic.train()
        losses, norms = [], []
        for _ in range(self.cfg.epochs * max(1, n_new // self.cfg.minibatch)):
            mb = self.rng.sample(self.replay, min(self.cfg.minibatch, len(self.replay)))
            with torch.no_grad(), self.runtime.autocast():
                nxt = self.target.values([x[2] for x in mb], batch_size=len(mb)).float().cpu()
            durations = torch.tensor([float(x[4]) for x in mb])
            # A float gamma unless some turn spans several steps: one-step runs keep their exact numbers.
            discount = gamma ** durations if bool((durations != 1).any()) else gamma
            y = td_targets(
                torch.tensor([x[1] for x in mb]), nxt, torch.tensor([x[3] for x in mb]), gamma=discount
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
                # Buffers saved before semi-MDP turns hold one-step transitions without a duration.
                self.replay = [x if len(x) == 5 else (*x, 1) for x in pickle.load(f)]
        if (directory / "critic_rng.pt").is_file():
            with (directory / "critic_rng.pt").open("rb") as f:
                self.rng.setstate(pickle.load(f))


def encoded_rows(enc: dict[str, torch.Tensor], rows: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows of a right-padded :meth:`SeparateCritic.encode` batch, cut to their longest: as encoding them alone."""
    n = int(enc["attention_mask"][rows].sum(1).max())
    return {k: v[rows] if k == "features" else v[rows, :n] for k, v in enc.items()}
