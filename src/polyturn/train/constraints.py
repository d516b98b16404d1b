"""Constrained RL in the training loop (config ``constraints``): Lagrange multipliers, cost critics, and what the
policy updates read of them. The maths is in :mod:`polyturn.algos.lagrange`.

A run with constraints holds one :class:`Constraints` in its policy (``Policy.constraints``). Each RL iteration
(:meth:`Constraints.learn`, called by ``Policy.learn`` after the reward critic's advantages):

1. measures the batch's mean cost per episode of each constrained term;
2. in the phases that update the actor (not the critic warm-up, when the policy cannot answer), steps each
   multiplier: ``lambda <- clip(lambda + lr * (cost - limit), 0, max)``, kept in the run state (checkpoints keep
   it, resume restores it);
3. trains each term's cost critic on that term's costs as rewards: the critic learner of its kind (the registry's,
   :func:`~polyturn.train.critics.build_critic` on a copy of the config, ``constraints.critic`` in place of
   ``critic``), with the same values -> GAE -> update as the reward's critic, on copies of the episodes whose turn
   rewards are that term's costs (unscaled: a cost critic's values are costs to come);
4. for the policy-gradient updates (ppo, a2c, critic_pg), gives the actor ``A_reward - sum_k lambda_k A_cost_k``
   (then whitened with the rest, ``ppo.normalize_advantages``).

The imitation updates (rft, critic_rft) call :meth:`Constraints.imitated` instead: an episode with any cost over
its limit is never imitated, and each kept one is weighted ``max(0, 1 - sum_k lambda_k c_k)`` (its costs priced
at the multipliers; a weight of 0 drops it too).

Units: a cost advantage is in cost units, the reward's in scaled reward (``ppo.reward_scale``), so
``lambda = 1`` prices one unit of cost (one violation) at ``1 / reward_scale`` of raw reward: 10 with the default
0.1, a success's worth on CustomerService. rft's weight reads the multipliers in the same units (a success = 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from polyturn.algos.lagrange import cost_weights, lagrange_update, lagrangian_advantages
from polyturn.algos.value import explained_variance
from polyturn.config import ConstraintsConfig, TrainConfig
from polyturn.models.actor import Actor
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime
from polyturn.train.batch import TokenBatch
from polyturn.train.critics import CriticLearner, build_critic, turn_tensors
from polyturn.train.setup import make_envs
from polyturn.train.state import RunState


def cost_critic_kind(cfg: TrainConfig) -> str:
    """The cost critics' kind: ``constraints.critic.kind``, else ``critic.kind`` (none for an action critic)."""
    assert cfg.constraints is not None
    return cfg.constraints.critic.kind or ("none" if cfg.critic.kind == "action" else cfg.critic.kind)


def env_cost_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The cost terms the run's environment reports (``cost_names``), read off one env made and closed."""
    env = make_envs(cfg, 1)[0]
    try:
        return tuple(getattr(env, "cost_names", ()))  # an env on neither polyturn base class declares none
    finally:
        env.close()


def check_constraints(cfg: TrainConfig) -> None:
    """``ValueError`` naming the field and the fix when ``cfg.constraints`` cannot run (before the run makes
    anything): a cost name the environment does not report, an update or cost-critic kind that cannot use them, a
    best-of-n by cost (``rollout.best_of_rank: cost``) without cost critics that rank actions."""
    c = cfg.constraints
    if cfg.rollout.best_of_rank == "cost":
        if c is None:
            raise ValueError("rollout.best_of_rank = 'cost' ranks candidates by the cost critics, got no constraints; "
                             "add constraints (e.g. constraints.limits={cost/violation: 0.05}) or set "
                             "rollout.best_of_rank=action_critic")
        if cost_critic_kind(cfg) != "separate":
            raise ValueError(f"rollout.best_of_rank = 'cost' reads the cost critics' Q(s, a), got cost critics of kind "
                             f"'{cost_critic_kind(cfg)}' (constraints.critic.kind, else critic.kind), which have none; "
                             "set constraints.critic.kind=separate")
        if cfg.rollout.workers:
            raise ValueError(f"rollout.best_of_rank = 'cost' ranks candidates with the learner's cost critics, got "
                             f"rollout.workers = {cfg.rollout.workers} (workers sample plainly); set rollout.workers=0 "
                             "or drop rollout.best_of_rank")
    if c is None:
        return
    if cfg.ppo.algo == "turn_dpo":
        raise ValueError("constraints with ppo.algo = 'turn_dpo': its DPO step reads neither advantages nor an "
                         "imitation set to constrain; set ppo.algo to ppo, a2c, rft, critic_pg or critic_rft, or "
                         "drop constraints")
    if cost_critic_kind(cfg) == "none" and cfg.critic.kind not in ("none", "action"):
        raise ValueError(f"constraints.critic.kind = 'none' baselines each episode's cost against the other attempts "
                         f"at its task, but critic.kind = '{cfg.critic.kind}' collects one episode per task; set "
                         "constraints.critic.kind to separate or shared, or critic.kind=none")
    names = env_cost_names(cfg)
    unknown = sorted(set(c.limits) - set(names))
    if unknown:
        have = ", ".join(names) if names else "none"
        raise ValueError(f"constraints.limits names {unknown}, which {cfg.env.id} does not report; its cost terms: "
                         f"{have}. Name those in constraints.limits, or drop constraints")


def cost_critic_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``critic`` replaced by the cost critics' settings (``constraints.critic`` over ``critic``)."""
    c = cfg.constraints
    assert c is not None
    encoder = "scratch" if cfg.critic.encoder == "causal" else cfg.critic.encoder  # causal: an action critic's
    over = {"kind": cost_critic_kind(cfg), "encoder": encoder}
    if cfg.rollout.best_of_rank == "cost":  # a Q head, so that the cost critics rank candidate turns
        over["q"] = True
    over |= {k: v for k, v in (("privileged", c.critic.privileged), ("lr", c.critic.lr)) if v is not None}
    return cfg.model_copy(update={"critic": cfg.critic.model_copy(update=over)})


def cost_episodes(episodes: Sequence[Episode], name: str) -> list[Episode]:
    """Copies of ``episodes`` whose turn rewards are cost term ``name`` (turns and tokens shared otherwise): what a
    critic learner reads as rewards, so its values, advantages and update are the cost's."""
    return [dataclasses.replace(ep, turns=[dataclasses.replace(t, reward=t.cost_terms.get(name, 0.0), reward_terms={})
                                           for t in ep.turns]) for ep in episodes]


def forked_rng(runtime: Runtime) -> contextlib.AbstractContextManager:
    """Torch's global RNG (and the run's CUDA device's) restored on exit: what runs inside draws from no stream the
    rest of the run reads."""
    dev = runtime.device
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    return torch.random.fork_rng(devices=cuda)


def candidate_scorer(cfg: TrainConfig, critic: CriticLearner, constraints: Constraints | None
                     ) -> Callable[[Sequence[CriticInput]], list[float]] | None:
    """What ``rollout.best_of`` ranks training collection's candidate turns by: the action critic's scores
    (``rollout.best_of_rank: action_critic``), or the Lagrangian of the critics' Q (``cost``: the reward critic's Q
    only when it is a separate critic with ``critic.q``)."""
    if cfg.rollout.best_of_rank == "cost" and constraints is not None:
        return constraints.scorer(critic.scorer() if cfg.critic.kind == "separate" else None)
    return critic.scorer()


def _slug(name: str) -> str:
    return name.replace("/", "_")


class Constraints:
    """The multipliers (in the run state) and a cost critic per constrained term (see the module docstring).

    Args:
        cfg: the ``constraints`` section.
        critics: a critic learner per constrained term, on the run's device.
        state: the run state, where the multipliers live (``RunState.multipliers``).
    """

    def __init__(self, cfg: ConstraintsConfig, critics: dict[str, CriticLearner], state: RunState,
                 runtime: Runtime) -> None:
        self.cfg = cfg
        self.critics = critics
        self.state = state
        self.names = list(cfg.limits)
        self.runtime = runtime
        self._scored: dict[str, float] = {}  # best-of-n by cost: candidates scored, summed Q per term

    @classmethod
    def build(cls, cfg: TrainConfig, *, demos: Sequence[dict], actor: Actor, feature_names: Sequence[str] | None,
              state: RunState, runtime: Runtime) -> Constraints | None:
        """The run's constraints (None without a ``constraints`` section)."""
        if cfg.constraints is None:
            return None
        sub = cost_critic_config(cfg)
        # Building draws random initial weights: fork, so the run's own RNG streams are the unconstrained run's.
        with forked_rng(runtime):
            critics = {name: build_critic(sub, demos, actor, feature_names) for name in cfg.constraints.limits}
        for critic in critics.values():
            critic.to(runtime)
        return cls(cfg.constraints, critics, state, runtime)

    # ---- the multipliers ---------------------------------------------------------------------
    def multipliers(self) -> torch.Tensor:
        """``[K]`` float64: each term's multiplier now (``constraints.init`` until first stepped)."""
        return torch.tensor([self.state.multipliers.get(n, self.cfg.init) for n in self.names], dtype=torch.float64)

    def limits(self) -> torch.Tensor:
        """``[K]`` float64: each term's limit."""
        return torch.tensor([self.cfg.limits[n] for n in self.names], dtype=torch.float64)

    def episode_costs(self, episodes: Sequence[Episode]) -> torch.Tensor:
        """``[E, K]`` float64: each episode's summed cost of each constrained term."""
        return torch.tensor([[ep.costs.get(n, 0.0) for n in self.names] for ep in episodes], dtype=torch.float64)

    # ---- one iteration ---------------------------------------------------------------------------
    def learn(self, episodes: Sequence[Episode], batch: TokenBatch, adv: torch.Tensor, *, gamma: float, lam: float,
              step: bool, combine: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """Steps 1-4 of the module docstring on one batch: the (penalised, with ``combine``) ``[E, T]`` advantages
        and the metrics (``constraint/<name>/lambda``, ``cost``, ``margin``, and the cost critic's
        ``explained_variance`` and losses). ``step``: the multipliers take their step (the actor updates);
        ``batch``: the episodes' token batch (a shared cost critic reads the actor's hidden states)."""
        cost = self.episode_costs(episodes).mean(0)
        if step:
            new = lagrange_update(self.multipliers(), cost, self.limits(), lr=self.cfg.lr, max_value=self.cfg.max)
            self.state.multipliers.update(zip(self.names, new.tolist()))
        lam_k = self.multipliers()
        metrics: dict[str, float] = self._best_of_metrics()
        cost_adv = []
        for k, name in enumerate(self.names):
            pre = f"constraint/{name}/"
            metrics |= {pre + "lambda": float(lam_k[k]), pre + "cost": float(cost[k]),
                        pre + "margin": self.cfg.limits[name] - float(cost[k])}
            a, m = self._cost_critic(name, cost_episodes(episodes, name), batch, gamma=gamma, lam=lam)
            cost_adv.append(a)
            metrics |= {pre + key: v for key, v in m.items()}
        if combine:
            adv = lagrangian_advantages(adv, torch.stack(cost_adv), lam_k)
        return adv, metrics

    def _cost_critic(self, name: str, episodes: list[Episode], batch: TokenBatch, *, gamma: float,
                     lam: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Term ``name``'s cost advantages ``[E, T]`` from its critic (values -> GAE or the group baseline), then
        the critic's update on the cost returns; its explained variance (before the update) and losses."""
        critic = self.critics[name]
        tt = turn_tensors(episodes)
        values, next_values = critic.values(episodes, batch)
        adv, returns = critic.advantages(episodes, tt, values, next_values, gamma=gamma, lam=lam, reward_scale=1.0)
        out = {}
        if critic.has_values:
            out["explained_variance"] = float(explained_variance(values, returns, tt["mask"]))
        # In line, apart from the actor's step (a shared cost head trains on the actor's features alone); forked
        # so its dropout draws leave the run's RNG streams as they were.
        with forked_rng(self.runtime):
            m = critic.update(episodes, returns, values, gamma=gamma, reward_scale=1.0, with_actor=False)
        out |= {k.split("/")[-1]: v for k, v in m.items() if k.startswith("losses/")}
        return adv, out

    def imitated(self, episodes: Sequence[Episode], chosen: list[int], weights: torch.Tensor,
                 metrics: dict[str, float]) -> tuple[list[int], torch.Tensor]:
        """An imitation update's episodes under the constraints: ``chosen`` without any episode whose cost passes a
        limit or whose weight ``max(0, 1 - sum_k lambda_k c_k)`` is 0, and ``weights`` (``[E, T]``) scaled by it.
        Logs ``constraint/successes_dropped`` (successes left out for their costs) and ``constraint/weight_mean``
        (over the episodes kept); ``rft/kept`` becomes the number kept."""
        costs = self.episode_costs(episodes)
        within = (costs <= self.limits()).all(1)
        w = cost_weights(costs, self.multipliers())
        kept = [i for i in chosen if within[i] and w[i] > 0]
        metrics["constraint/successes_dropped"] = float(sum(episodes[i].success for i in chosen if i not in kept))
        metrics["constraint/weight_mean"] = float(w[kept].mean()) if kept else 0.0
        if "rft/kept" in metrics:
            metrics["rft/kept"] = len(kept)
        return kept, weights * w.to(weights.dtype)[:, None]

    # ---- best-of-n by cost -------------------------------------------------------------------------
    def scorer(self, reward: Callable[[Sequence[CriticInput]], list[float]] | None
               ) -> Callable[[Sequence[CriticInput]], list[float]]:
        """``rollout.best_of_rank: cost``: each candidate turn's ``Q_reward(s, a) - sum_k lambda_k Q_cost_k(s, a)``
        (``reward``: the reward critic's Q, in scaled reward like the advantages; None counts 0), the multipliers
        read when it scores. Over each collection it counts the candidates scored and their mean predicted cost per
        term, logged by the next :meth:`learn` (``constraint/best_of_candidates``,
        ``constraint/<term>/best_of_q``)."""
        cost_q = {name: critic.scorer() for name, critic in self.critics.items()}

        def score(inputs: Sequence[CriticInput]) -> list[float]:
            lam = self.multipliers()
            total = torch.tensor(reward(inputs), dtype=torch.float64) if reward else torch.zeros(len(inputs),
                                                                                              dtype=torch.float64)
            for k, name in enumerate(self.names):
                q = torch.tensor(cost_q[name](inputs), dtype=torch.float64)
                total -= lam[k] * q
                self._scored[name] = self._scored.get(name, 0.0) + float(q.sum())
            self._scored["n"] = self._scored.get("n", 0.0) + len(inputs)
            return total.tolist()

        return score

    def _best_of_metrics(self) -> dict[str, float]:
        """What :meth:`scorer` counted since the last call (nothing when it scored none), then reset."""
        scored, self._scored = self._scored, {}
        if not scored:
            return {}
        n = scored.pop("n")
        return {"constraint/best_of_candidates": n, **{f"constraint/{k}/best_of_q": v / n for k, v in scored.items()}}

    # ---- checkpoints ------------------------------------------------------------------------------
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The cost critics' optimizers, as a checkpoint keeps them (``costs/<term>/<name>``)."""
        return {f"costs/{_slug(n)}/{k}": o for n, c in self.critics.items() for k, o in c.optimizers().items()}

    def save(self, directory: Path) -> None:
        """Each cost critic's part under ``directory/costs/<term>/`` (``cost_violation`` for ``cost/violation``)."""
        for name, critic in self.critics.items():
            d = directory / "costs" / _slug(name)
            d.mkdir(parents=True, exist_ok=True)
            critic.save(d)

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote (before the optimizer states load); a term the checkpoint holds no
        critic for (constraints added on resume) keeps its new one."""
        for name, critic in self.critics.items():
            d = directory / "costs" / _slug(name)
            if d.is_dir():
                critic.load(d)
