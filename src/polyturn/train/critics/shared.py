"""``critic.kind: shared``: a value head on the actor's hidden states (the symmetric baseline).

Its loss joins the actor's step (the trunk is shared), except during critic warm-up where only the head trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from polyturn.algos.gae import next_state_values
from polyturn.algos.value import value_loss
from polyturn.config import CriticConfig, TrainConfig
from polyturn.models.actor import Actor
from polyturn.models.critic import ValueHead
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime
from polyturn.train.batch import TokenBatch, make_token_batch
from polyturn.train.critics.base import CriticLearner, bootstraps, clip_args, turn_tensors


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

    @classmethod
    def check(cls, cfg: TrainConfig, *, world_size: int = 1) -> None:
        super().check(cfg, world_size=world_size)
        if cfg.ppo.algo == "rft":
            raise ValueError(
                "ppo.algo = 'rft' with critic.kind = 'shared': the shared critic learns inside the actor's step, "
                "which rft takes on the successful episodes only (a biased value target); set critic.kind=separate "
                "or critic.kind=none")

    @classmethod
    def build(cls, cfg: TrainConfig, *, demos: Sequence[dict], actor: Actor,
              feature_names: Sequence[str] | None) -> CriticLearner:
        return cls(actor, cfg.critic)

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
        vl = value_loss(values, returns[:, :t].to(dev), mask, **clip_args(old_values[:, :t].to(dev), self.cfg.value_clip))
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
