"""``rollout``, ``selfplay`` and ``hierarchy``: how episodes are played, by whom."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from polyturn.config._base import _Section
from polyturn.config.objectives import JudgeConfig


class RolloutConfig(_Section):
    """Sampling and context policy (see polyturn.rollout.collector), and rollout workers (polyturn.rollout.workers)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    num_envs: int = Field(32, ge=1, description="Conversations sampled together.")
    engine: Literal["home", "vllm"] = Field(
        "home", description="What samples the actions. home: polyturn's batched KV-cache decoder on the actor "
        "itself. vllm: a vLLM server started from rollout.vllm_python, prompt token ids in, sampled ids and "
        "log-probs out (docs/vllm.md).",
    )
    vllm_python: str = Field(
        ".venv-vllm/bin/python", description="With rollout.engine = vllm: the interpreter of vLLM's own virtual "
        "environment (`make vllm-venv` installs it).",
    )
    env_threads: int = Field(
        1, ge=1, description="Threads that step environments while other rows still decode (SQLite releases "
        "the GIL); 1 steps them in the decoding thread after each round. Results do not depend on it.",
    )
    workers: int = Field(
        0, ge=0, description="Rollout workers as Ray actors (pip install 'polyturn[ray]'), each holding "
        "num_envs / workers environments and a copy of the actor; 0 collects in the training process.",
    )
    worker_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves for each rollout worker (0: CPU workers).")
    async_: bool = Field(
        False, alias="async", description="With workers: keep collecting while the learner updates (episodes may "
        "be sampled by older policy versions, at most rollout.max_staleness behind).",
    )
    max_staleness: int = Field(1, ge=0, description="With rollout.async: the most versions a trained turn may lag.")
    partial: Literal["finish", "drop"] = Field(
        "finish", description="With rollout.async: an episode that spans a weight update is finished by the new "
        "version (each turn records its version) or dropped and its task played again.",
    )
    max_action_tokens: int = Field(96, ge=4)
    context_budget: int = Field(1024, ge=64)
    keep_last_turns: int = Field(4, ge=1)
    system_prompt: bool = Field(False, description="Put the tool docs in a system message (pretrained actors).")
    top_p: float = Field(1.0, gt=0, le=1)
    eval_temperature: float = Field(0.0, ge=0, description="Decoding for held-out evaluation (0 = greedy).")
    eval_sampled_temperature: float | None = Field(
        None, gt=0, description="Also evaluate with sampling at this temperature (the policy as trained)."
    )
    best_of: int = Field(
        1, ge=1, description="Collection samples this many candidate turns per state and plays the action critic's "
        "favourite (critic.kind action; rollout.best_of_rank cost: the cost critics'). 1: plain sampling.")
    best_of_rank: Literal["action_critic", "cost"] = Field(
        "action_critic", description="How rollout.best_of ranks the candidates of training collection. action_critic: "
        "the action critic's score. cost: Q_reward(s, a) - sum_k lambda_k Q_cost_k(s, a), the Lagrangian the "
        "constrained update follows, from the cost critics' Q heads (constraints.critic.kind separate; Q_reward "
        "only with critic.kind separate and critic.q, else 0: the lowest priced predicted cost). Evaluation samples "
        "plainly either way.")

    @model_validator(mode="after")
    def _workers_fit(self) -> "RolloutConfig":
        if self.workers > self.num_envs:
            raise ValueError(f"Expected rollout.workers <= rollout.num_envs (each worker holds at least one "
                             f"environment), got workers = {self.workers} and num_envs = {self.num_envs}")
        if self.best_of_rank == "cost" and self.best_of < 2:
            raise ValueError("rollout.best_of_rank = 'cost' ranks candidate turns, got rollout.best_of = 1 (plain "
                             "sampling); set rollout.best_of to 2 or more, or drop rollout.best_of_rank")
        if self.engine == "vllm" and self.best_of > 1:
            raise ValueError(f"rollout.engine = 'vllm' samples without best-of-n for now; got rollout.best_of = "
                             f"{self.best_of}: set rollout.best_of=1, or rollout.engine=home")
        if self.async_ and not self.workers:
            raise ValueError("rollout.async = true needs rollout workers to collect while the learner updates: "
                             "set rollout.workers to 1 or more, or rollout.async=false")
        return self


class PartnerMix(_Section):
    """Self-play: the share of games whose other seat is each kind of partner (normalised to sum 1)."""

    latest: float = Field(1.0, ge=0, description="The current policy itself (both seats learn).")
    pool: float = Field(0.0, ge=0, description="An earlier checkpoint from the opponent pool (frozen).")
    scripted: float = Field(0.0, ge=0, description="One of the env's scripted training partners "
                                                     "(selfplay.scripted; the env spec's partners).")

    @model_validator(mode="after")
    def _some(self) -> "PartnerMix":
        if self.latest + self.pool + self.scripted <= 0:
            raise ValueError("Expected selfplay.mix to give some partner a share above 0, got all 0; e.g. "
                             "selfplay.mix={latest: 0.5, pool: 0.3, scripted: 0.2}")
        return self

    def shares(self) -> dict[str, float]:
        """Partner kind -> probability."""
        total = self.latest + self.pool + self.scripted
        return {"latest": self.latest / total, "pool": self.pool / total, "scripted": self.scripted / total}


class SelfPlayConfig(_Section):
    """Self-play on a multi-role environment (e.g. ``env.kwargs: {opponent: self}`` for Negotiation-v0); ignored
    by single-agent environments."""

    weights: Literal["shared", "per_role"] = Field(
        "shared", description="shared: one policy plays every role (its role told by the role's own introduction); "
        "per_role: a policy (and critic) per role, each started from the same actor.")
    mix: PartnerMix = Field(default_factory=PartnerMix)
    pool_size: int = Field(5, ge=1, description="Earlier checkpoints the opponent pool keeps (the oldest leave).")
    snapshot_every: int = Field(5, ge=1, description="RL iterations between snapshots into the pool (one is taken "
                                                     "when RL starts).")
    scripted: list[str] = Field(default_factory=list, description="Scripted training partners by name (the env "
                                "spec's partners); empty: all of them.")


class HierarchyConfig(_Section):
    """Hierarchical agents (docs/hierarchy.md): a manager policy sets subgoals from the env spec's menu and a worker
    policy (the actor) carries each out, two policies trained in one run (:mod:`polyturn.envs.hierarchy`)."""

    mode: Literal["menu", "free"] = Field("menu", description="menu: the manager names an entry of the env spec's "
                                          "subgoals; free: it writes the subgoal's text.")
    k: int = Field(4, ge=1, description="The most worker turns on one subgoal before the manager sets one again.")
    intrinsic: float = Field(1.0, ge=0, description="The worker's reward for reaching its subgoal (the env's check "
                             "of it), once per subgoal an episode; 0: none.")
    unreached: float = Field(0.0, ge=0, description="The worker's penalty on its last turn on a checked subgoal "
                             "that ends unreached (declared done, k turns spent, or the game over): what ignoring "
                             "the manager's subgoal costs; 0: nothing (the subgoal binds only through the "
                             "intrinsic reward).")
    max_subgoals: int | None = Field(None, ge=1, description="The manager's turns in an episode; null: the env's "
                                     "turn limit.")
    manager_every: int | None = Field(1, ge=1, description="RL iterations between the manager's updates (the "
                                      "worker updates every iteration; the manager's episodes of the iterations "
                                      "between are not trained on); null: never, the manager stays at its BC "
                                      "weights.")
    manager_kl: float | None = Field(None, ge=0, description="The manager's own KL penalty to its BC policy "
                                     "(ppo.kl_coef for the manager alone; needs ppo.algo ppo): keeps its plan near "
                                     "the demonstrations' while the worker learns freely. null: ppo.kl_coef.")
    judge: JudgeConfig | None = Field(
        None, description="An LLM judge for the subgoals the env cannot check (a menu entry without a check; every "
        "subgoal in free mode): when the worker declares one done, the judge reads its turns on it, and a score >= "
        "judge.threshold pays the intrinsic reward. null: unchecked subgoals pay none.")
