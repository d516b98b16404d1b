"""``critic.kind: action``: an action-level critic trained with a trajectory-level Bradley-Terry loss.

Each iteration's episodes come in groups of ``critic.group_size`` attempts at
the same task (same seed). Within a group, every pair with different returns
is a preference: an episode's score is the sum of its turns' scores (each
divided by its token count with ``critic.length_norm``), scaled by
``critic.beta``, and :func:`polyturn.algos.preference.bradley_terry_loss` pushes
the better one's above the worse one's.

Pairwise accuracy is measured on the iteration's pairs *before* the critic
trains on them (held-out: it has never seen these episodes), overall and at
the first turn where the two episodes' actions differ (``critic/pair_acc``,
``critic/pair_acc_first_diff``; ``polyturn diagnose`` shows both).

With ``critic.branch_states`` the critic also learns from turn-level labels:
branches from states of the batch's episodes (:mod:`polyturn.rollout.branches`)
give attempts that differ first at one turn, and a turn-level Bradley-Terry
loss ranks those turns' scores by the attempts' returns. Its held-out accuracy
is ``critic/branch_acc``.

The per-turn advantage handed to the actor is the critic's score of the turn
(``critic.credit: score``), or the episode's group-relative advantage spread
over its turns by those scores (``credit: redistribute``,
:func:`polyturn.algos.preference.redistributed_advantages`).
"""

from __future__ import annotations

import pickle
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from polyturn.algos.preference import bradley_terry_loss, episode_scores, redistributed_advantages
from polyturn.config import CriticConfig, TrainConfig
from polyturn.models.action_critic import ActionCritic, EncoderActionCritic, load_action_critic
from polyturn.models.actor import Actor
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.branches import BranchPoint, branch_points, branch_tasks, replayed
from polyturn.rollout.types import Episode
from polyturn.train import distributed
from polyturn.train.critics.base import CriticLearner, episode_advantages, state_input, turn_tensors
from polyturn.train.critics.encoders import causal_critic, encoder_critic

#: A turn-level preference: (the better attempt's turn, the worse one's), both from the same state.
TurnPair = tuple[CriticInput, CriticInput]


def turn_inputs(ep: Episode) -> list[CriticInput]:
    """The critic's view of each of ``ep``'s turns: the dialogue before it, the turn, the privileged text."""
    return [state_input(ep, t) for t in range(len(ep.turns))]


def preference_pairs(episodes: Sequence[Episode]) -> list[tuple[int, int]]:
    """``(better, worse)`` index pairs of episodes of the same task (seed) whose returns differ."""
    groups: dict[object, list[int]] = {}
    for i, ep in enumerate(episodes):
        groups.setdefault((ep.seed, ep.role), []).append(i)
    pairs = []
    for idx in groups.values():
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                i, j = idx[a], idx[b]
                ri, rj = episodes[i].episode_return, episodes[j].episode_return
                if ri != rj:
                    pairs.append((i, j) if ri > rj else (j, i))
    return pairs


def first_difference(a: Episode, b: Episode) -> int | None:
    """The first turn index where the two episodes' actions differ (None: one's actions prefix the other's)."""
    for t, (x, y) in enumerate(zip(a.turns, b.turns)):
        if x.action_ids != y.action_ids:
            return t
    return None


def pair_accuracy(episodes: Sequence[Episode], scores: torch.Tensor, pairs: Sequence[tuple[int, int]],
                  *, lengths: torch.Tensor | None = None) -> dict[str, float]:
    """Share of ``pairs`` ranked right by episode score, and by turn score at their first differing turn."""
    mask = turn_tensors(episodes)["mask"]
    ep_s = episode_scores(scores, mask, lengths=lengths)
    right = [float(ep_s[i] > ep_s[j]) for i, j in pairs]
    first = []
    for i, j in pairs:
        t = first_difference(episodes[i], episodes[j])
        if t is not None:
            first.append(float(scores[i, t] > scores[j, t]))
    out = {"critic/pairs": float(len(pairs))}
    if right:
        out["critic/pair_acc"] = sum(right) / len(right)
    if first:
        out["critic/pair_acc_first_diff"] = sum(first) / len(first)
    return out


def branch_pairs(episodes: Sequence[Episode], points: Sequence[BranchPoint], branches: Sequence[Episode],
                 k: int) -> tuple[list[TurnPair], dict[str, float]]:
    """Turn-level preferences from ``k`` branches per point (``branches`` in point order): at each state, every
    two attempts (the episode and its replayed branches) whose returns differ and whose turn-``t`` actions differ
    give ``(better turn, worse turn)``. Also counts branches that did not replay their prefix, and how often two
    attempts that took the same turn-``t`` action still ended with different returns (the labels' noise: the
    continuation alone decided those)."""
    pairs: list[TurnPair] = []
    mismatched = same = split = 0
    for n, p in enumerate(points):
        orig = episodes[p.episode]
        group = [orig]
        for br in branches[n * k : (n + 1) * k]:
            if replayed(orig, br, p.turn):
                group.append(br)
            else:
                mismatched += 1
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                x, y = group[a], group[b]
                if x.turns[p.turn].action_ids == y.turns[p.turn].action_ids:
                    same += 1
                    split += x.episode_return != y.episode_return
                    continue
                if x.episode_return == y.episode_return:
                    continue
                better, worse = (x, y) if x.episode_return > y.episode_return else (y, x)
                pairs.append((state_input(better, p.turn), state_input(worse, p.turn)))
    stats = {"critic/branch_pairs": float(len(pairs)), "critic/branch_mismatched": float(mismatched)}
    if same:
        stats["critic/branch_same_action_split"] = split / same
    return pairs, stats


def collect_branch_pairs(collector, tasks: Sequence[dict], episodes: Sequence[Episode], *, states: int, k: int,  # noqa: ANN001 - a Collector
                         rng: random.Random, temperature: float, generator: torch.Generator | None) -> tuple[
                             list[TurnPair], dict[str, float]]:
    """Play ``k`` branches from each of ``states`` states of ``episodes`` (``tasks[i]`` produced ``episodes[i]``;
    under torchrun every rank plays its share) and return their turn-level preferences, with the branches'
    sampled turns and episodes for the budget."""
    points = branch_points(episodes, states, rng)
    todo = branch_tasks(tasks, points, episodes, k=k)
    branches = distributed.gather_in_order(collector.collect(distributed.shard(todo), temperature=temperature,
                                                             generator=generator))
    pairs, stats = branch_pairs(episodes, points, branches, k)
    sampled = sum(len(br.turns) - p.turn for n, p in enumerate(points) for br in branches[n * k : (n + 1) * k])
    return pairs, {**stats, "rollout/branch_episodes": float(len(branches)), "rollout/branch_turns": float(sampled)}


class ActionLearner(CriticLearner):
    """The action-level critic with its own optimizer; advantages are its per-turn scores."""

    kind = "action"

    def __init__(self, critic: ActionCritic, cfg: CriticConfig, *, seed: int = 0) -> None:
        self.critic = critic
        self.cfg = cfg
        self.opt = self._make_opt()
        self.rng = random.Random(seed)
        #: ``(episodes, their turn scores)`` from the last :meth:`advantages`, read once by :meth:`update`.
        self._scored: tuple[Sequence[Episode] | None, torch.Tensor | None] = (None, None)
        #: credit redistribute: how uneven the last :meth:`advantages` split was (logged by :meth:`update`).
        self._credit_stats: dict[str, float] = {}
        #: Turn-level preferences from branches (``critic.branch_states``), trained on by the next :meth:`update`.
        self.turn_pairs: list[TurnPair] = []

    @classmethod
    def check(cls, cfg: TrainConfig, *, world_size: int = 1) -> None:
        if world_size > 1:
            raise ValueError(f"Expected one process per run with critic.kind = action (its update is not sharded "
                             f"yet), got --nproc {world_size}: use a value critic or none with --nproc, or train in "
                             "one process")
        if cfg.critic.branch_states and cfg.rollout.workers:
            raise ValueError(f"critic.branch_states = {cfg.critic.branch_states} plays its branches in the training "
                             f"process, got rollout.workers = {cfg.rollout.workers}; set rollout.workers=0 or "
                             "critic.branch_states=0")

    @classmethod
    def build(cls, cfg: TrainConfig, *, demos: Sequence[dict], actor: Actor,
              feature_names: Sequence[str] | None) -> CriticLearner:
        """An encoder that ranks turns (BERT/MiniLM) or, with ``critic.encoder: causal``, a small causal LM."""
        if cfg.critic.encoder == "causal":
            return cls(causal_critic(cfg, actor), cfg.critic, seed=cfg.run.seed)
        return cls(EncoderActionCritic(encoder_critic(cfg, demos, feature_names)), cfg.critic, seed=cfg.run.seed)

    def collect_extra(self, collector: Any, tasks: Sequence[dict], episodes: Sequence[Episode], *, rng: Any,
                      temperature: float, generator: torch.Generator | None) -> dict[str, float]:
        """With ``critic.branch_states``: branches from states of the batch, whose turn-level preferences the next
        :meth:`update` trains on."""
        if not self.cfg.branch_states:
            return {}
        t = time.perf_counter()
        self.turn_pairs, extra = collect_branch_pairs(collector, tasks, episodes, states=self.cfg.branch_states,
                                                      k=self.cfg.branch_candidates, rng=rng, temperature=temperature,
                                                      generator=generator)
        return {**extra, "perf/branch_gen_s": time.perf_counter() - t}

    def scorer(self) -> Callable[[Sequence[CriticInput]], list[float]]:
        return lambda inputs: self.score_candidates(inputs).tolist()

    def _make_opt(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.critic.parameters() if p.requires_grad], lr=self.cfg.lr)

    @property
    def task_group(self) -> int:
        return self.cfg.group_size

    @property
    def has_values(self) -> bool:
        return False

    def to(self, runtime) -> None:  # noqa: ANN001 - Runtime, as the base class
        self.runtime = runtime
        self.critic.to(runtime.device)

    def _lengths(self, episodes: Sequence[Episode]) -> torch.Tensor | None:
        if not self.cfg.length_norm:
            return None
        out = torch.zeros(len(episodes), max(len(ep.turns) for ep in episodes))
        for i, ep in enumerate(episodes):
            for t, turn in enumerate(ep.turns):
                out[i, t] = float(len(turn.action_ids))
        return out

    def turn_scores(self, episodes: Sequence[Episode]) -> torch.Tensor:
        """``[E, T]`` float32 scores of every turn (0 past an episode's end); gradients flow."""
        inputs = [x for ep in episodes for x in turn_inputs(ep)]
        with self.runtime.autocast():
            flat = self.critic.scores(inputs).float().cpu()
        out = torch.zeros(len(episodes), max(len(ep.turns) for ep in episodes))
        k = 0
        rows = []
        for ep in episodes:
            n = len(ep.turns)
            rows.append(torch.cat([flat[k : k + n], torch.zeros(out.shape[1] - n)]))
            k += n
        return torch.stack(rows)

    def score_candidates(self, inputs: Sequence[CriticInput]) -> torch.Tensor:
        """Scores ``[N]`` of candidate turns (no grad), for turn-DPO ranking and best-of-n."""
        self.critic.eval()
        with torch.no_grad(), self.runtime.autocast():
            return self.critic.scores(inputs).float().cpu()

    def advantages(self, episodes: Sequence[Episode], tt: dict[str, torch.Tensor], values: torch.Tensor,
                   next_values: torch.Tensor, *, gamma: float, lam: float,
                   reward_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-turn advantages from the critic's scores (``critic.credit``); returns are the reward-to-go (logged)."""
        self.critic.eval()
        with torch.no_grad():
            scores = self.turn_scores(episodes)
        self._scored = (episodes, scores)  # update() measures the held-out accuracy on these, before training
        returns = tt["rewards"].flip(1).cumsum(1).flip(1) * tt["mask"]
        if self.cfg.credit == "redistribute":
            ep_adv = episode_advantages(episodes, reward_scale)
            adv = redistributed_advantages(ep_adv, scores, tt["mask"], temperature=self.cfg.credit_temperature)
            # How uneven the split was: turn t holds A * n * share_t, so max_t |adv| / |A| = n * the largest share
            # (1 for an even split).
            moved = (ep_adv != 0) & (tt["mask"].sum(1) > 1)
            if moved.any():
                top = adv[moved].abs().amax(1) / ep_adv[moved].abs()
                self._credit_stats = {"critic/credit_top_share_x_turns": float(top.mean())}
            return adv, returns
        return scores * tt["mask"], returns

    def update(self, episodes: Sequence[Episode], returns: torch.Tensor, old_values: torch.Tensor, *, gamma: float,
               reward_scale: float = 1.0, with_actor: bool = False) -> dict[str, float]:
        """Held-out pairwise accuracy on this batch, then Bradley-Terry steps on its pairs (and on the turn pairs
        of its branches)."""
        turn_stats = self._update_turn_pairs()
        pairs = preference_pairs(episodes)
        if not pairs:
            return {"critic/pairs": 0.0, **turn_stats}
        scored, scores = self._scored
        if scored is not episodes:  # not scored by advantages() since the last update
            self.critic.eval()
            with torch.no_grad():
                scores = self.turn_scores(episodes)
        self._scored = (None, None)
        stats = {**pair_accuracy(episodes, scores, pairs, lengths=self._lengths(episodes)), **self._credit_stats}
        self._credit_stats = {}
        # Minibatches of whole groups (a pair's two episodes are scored in the same pass).
        seeds = sorted({episodes[i].seed for p in pairs for i in p}, key=str)
        per_group = max(1, self.cfg.minibatch // (2 * self.cfg.group_size))
        self.critic.train()
        losses, accs, norms = [], [], []
        for _ in range(self.cfg.epochs):
            self.rng.shuffle(seeds)
            for s in range(0, len(seeds), per_group):
                chosen = set(seeds[s : s + per_group])
                idx = [i for i, ep in enumerate(episodes) if ep.seed in chosen]
                sub = [episodes[i] for i in idx]
                where = {i: k for k, i in enumerate(idx)}
                sub_pairs = [(where[i], where[j]) for i, j in pairs if i in where and j in where]
                mask = turn_tensors(sub)["mask"]
                ep_s = episode_scores(self.turn_scores(sub), mask, lengths=self._lengths(sub))
                b, w = zip(*sub_pairs)
                out = bradley_terry_loss(ep_s[list(b)], ep_s[list(w)], beta=self.cfg.beta)
                norms.append(self._step(out["loss"]))
                losses.append(out["loss"].item())
                accs.append(float(out["accuracy"]))
        return {**stats, **turn_stats, "losses/bt_loss": sum(losses) / len(losses),
                "critic/train_pair_acc": sum(accs) / len(accs), "grad/critic_norm": sum(norms) / len(norms)}

    def _update_turn_pairs(self) -> dict[str, float]:
        """Held-out accuracy on :attr:`turn_pairs` (better turn scored above worse), then turn-level
        Bradley-Terry steps on them (``critic.epochs`` passes, ``critic.minibatch`` turns a step)."""
        pairs, self.turn_pairs = self.turn_pairs, []
        if not pairs:
            return {}
        stats = {"critic/branch_acc": self.turn_pair_accuracy(pairs)}
        losses = self.train_turn_pairs(pairs, epochs=self.cfg.epochs)
        return {**stats, "losses/branch_bt_loss": sum(losses) / len(losses)}

    def turn_pair_accuracy(self, pairs: Sequence[TurnPair]) -> float:
        """Share of ``(better, worse)`` turn pairs whose better turn the critic scores higher, a tie counting half
        (an untrained log-ratio critic scores every turn 0: 0.5, chance); no grad."""
        s = self.score_candidates([x for pr in pairs for x in pr])
        better, worse = s[0::2], s[1::2]
        return float(((better > worse).float() + 0.5 * (better == worse).float()).mean())

    def train_turn_pairs(self, pairs: Sequence[TurnPair], *, epochs: int = 1,
                         progress: Callable[[int], None] | None = None) -> list[float]:
        """Turn-level Bradley-Terry steps on ``pairs`` (``epochs`` shuffled passes, ``critic.minibatch`` turns a
        step); the loss of each step. ``progress`` is called with the pairs of each step."""
        per_step = max(1, self.cfg.minibatch // 2)
        order = list(range(len(pairs)))
        self.critic.train()
        losses = []
        for _ in range(epochs):
            self.rng.shuffle(order)
            for b in range(0, len(order), per_step):
                mb = [pairs[i] for i in order[b : b + per_step]]
                with self.runtime.autocast():
                    sc = self.critic.scores([x for pr in mb for x in pr]).float()
                out = bradley_terry_loss(sc[0::2], sc[1::2], beta=self.cfg.beta)
                self._step(out["loss"])
                losses.append(out["loss"].item())
                if progress is not None:
                    progress(len(mb))
        return losses

    def _step(self, loss: torch.Tensor) -> float:
        """One critic optimizer step on ``loss`` (gradients clipped; skipped when their norm is not finite);
        returns the pre-clip norm."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for p in self.critic.parameters() if p.requires_grad],
                                              self.cfg.max_grad_norm)
        if torch.isfinite(norm):
            self.opt.step()
        return float(norm)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic": self.opt}

    def save(self, directory: Path) -> None:
        """``critic/`` (HF-format for a causal critic) and the critic's sampling RNG."""
        self.critic.save_pretrained(directory / "critic")
        with (directory / "critic_rng.pt").open("wb") as f:
            pickle.dump(self.rng.getstate(), f)

    def load(self, directory: Path) -> None:
        self.critic = load_action_critic(directory / "critic")
        self.critic.to(self.runtime.device)
        self.opt = self._make_opt()
        if (directory / "critic_rng.pt").is_file():
            with (directory / "critic_rng.pt").open("rb") as f:
                self.rng.setstate(pickle.load(f))
