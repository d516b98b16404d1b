"""``constraints`` (with ``constraints.cost_critic``), ``offline`` and ``judge``: what training optimises beyond the env's reward, and from which data."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from polyturn.config._base import _Section


class CostCriticConfig(_Section):
    """The cost critics (one per constrained cost term): each the critic learner of its kind, built from ``critic``
    with these settings in place of its own, and trained on that term's costs as rewards. Unset (null) settings
    follow ``critic``."""

    kind: Literal["separate", "shared", "none"] | None = Field(
        None, description="separate, shared or none (group-relative costs: needs several episodes per task, "
        "critic.kind none or action). null: critic.kind, and none for an action-level critic.")
    privileged: bool | None = Field(None, description="Let the cost critic read info['privileged']. null: "
                                    "critic.privileged.")
    lr: float | None = Field(None, gt=0, description="Cost critic learning rate. null: critic.lr.")


class ConstraintsConfig(_Section):
    """Constrained RL (PPO-Lagrangian): keep each named cost term's mean per episode under its limit.

    One Lagrange multiplier per limit, updated every RL iteration that updates the actor from the batch's mean cost:
    ``lambda <- clip(lambda + lr * (cost - limit), 0, max)``. PPO and A2C follow ``A_reward - sum lambda * A_cost``
    (cost advantages from a cost critic per term); rft and critic_rft never imitate an episode over a limit and
    weight the others ``max(0, 1 - sum lambda * cost)`` (docs/envs/customer-service.md, "Constrained RL").
    """

    limits: dict[str, float] = Field(
        description="Cost term -> the most it may cost per episode on average, e.g. {cost/violation: 0.1}. The "
        "names are the env's cost terms (info['cost_terms']; CustomerService: cost/violation, cost/error_response).")
    lr: float = Field(0.05, ge=0, description="The multipliers' learning rate (0: they stay at init).")
    init: float = Field(0.0, ge=0, description="Each multiplier's value when the run starts.")
    max: float = Field(10.0, gt=0, description="Each multiplier's upper clip: how far one constraint can outweigh "
                       "the (scaled) reward.")
    critic: CostCriticConfig = Field(default_factory=CostCriticConfig)

    @model_validator(mode="after")
    def _limits(self) -> "ConstraintsConfig":
        if not self.limits:
            raise ValueError("Expected constraints.limits to name at least one cost term, got none; e.g. "
                             "constraints.limits={cost/violation: 0.1}, or drop the constraints section")
        bad = sorted(k for k in self.limits if not k.startswith("cost/"))
        if bad:
            raise ValueError(f"Expected constraints.limits keys naming cost terms (cost/<name>), got {bad}; e.g. "
                             "cost/violation")
        negative = {k: v for k, v in self.limits.items() if not 0 <= v < float("inf")}
        if negative:
            raise ValueError(f"Expected constraints.limits >= 0 and finite (a mean cost per episode), got {negative}")
        if self.init > self.max:
            raise ValueError(f"Expected constraints.init <= constraints.max, got init = {self.init} and max = "
                             f"{self.max}; lower init or raise max")
        return self


class OfflineConfig(_Section):
    """Offline RL from recorded episodes (``polyturn train --offline DATA``; docs/offline.md): a phase that replaces
    BC (or follows it, ``after_bc``) and hands its actor and critic to the RL phases."""

    data: list[str] = Field(min_length=1, description="Episode JSONL files of env.id: demonstrations, evaluation "
                            "episodes, rollouts, `serve --record` sessions.")
    algo: Literal["filtered_bc", "awr", "iql", "cql", "none"] = Field(
        "awr", description="filtered_bc (imitate the best episodes), awr (advantage-weighted regression on V), iql "
        "(expectile V, Q, AWR on Q - V), cql (conservative Q, AWR on Q - V), none (value_pretrain only).")
    after_bc: bool = Field(False, description="false: the offline phase replaces BC; true: BC on bc.demos first.")
    value_pretrain: bool = Field(False, description="Fit the critic's V to the dataset's returns before RL (awr "
                                 "always does), reporting its held-out explained variance.")
    rounds: int = Field(1, ge=1, description="Critic, then actor, this many times (cql samples its candidates from "
                        "the actor as each round starts).")
    critic_epochs: int = Field(3, ge=0, description="Critic passes over the training split's turns per round.")
    epochs: float = Field(2.0, gt=0, description="Actor passes over the imitated episodes per round.")
    lr: float = Field(1e-3, gt=0, description="Actor learning rate of the offline phase (linear warm-up).")
    batch_episodes: int = Field(16, ge=1, description="Episodes per actor step.")
    warmup_steps: int = Field(10, ge=0)
    top_fraction: float | None = Field(0.5, gt=0, le=1, description="filtered_bc: imitate the episodes whose return "
                                       "is in this top fraction (null: no cut).")
    min_return: float | None = Field(None, description="filtered_bc: imitate only episodes returning at least this.")
    temperature: float = Field(1.0, gt=0, description="awr, iql, cql: T in the turn weight min(exp(A / T), max).")
    max_weight: float = Field(20.0, gt=0, description="awr, iql, cql: the cap of a turn's weight.")
    normalize_advantages: bool = Field(True, description="Whiten A over the dataset's turns before exp(A / T).")
    gamma: float | None = Field(None, ge=0, le=1, description="Discount over turns. null: curriculum.gamma.start.")
    lam: float = Field(1.0, ge=0, le=1, description="Lambda of the returns V regresses on (awr, value_pretrain) "
                       "and of AWR's advantages; 1: Monte-Carlo returns.")
    expectile: float = Field(0.7, gt=0, lt=1, description="iql: the expectile tau of V's regression on Q.")
    cql_alpha: float = Field(1.0, ge=0, description="cql: weight of the conservative penalty.")
    cql_candidates: int = Field(2, ge=1, description="cql: actions sampled from the actor per state (K).")
    cql_temperature: float = Field(1.0, gt=0, description="cql: sampling temperature of the candidates.")
    held_out: float = Field(0.1, ge=0, lt=1, description="Share of the dataset's tasks the critic never trains on, "
                            "for its held-out explained variance.")
    judge: bool = Field(True, description="A record `polyturn judge` scored whose outcome is not known (a session "
                        "closed mid-episode) ends with the reward term judge/score (docs/judge.md).")
    judge_range: tuple[float, float] = Field((-5.0, 10.0), description="judge/score for a judge score of 1 and of 10 "
                                             "(linear between); default outcome/failure's and outcome/success's.")

    @field_validator("data", mode="before")
    @classmethod
    def _one_path(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _algo_options(self) -> "OfflineConfig":
        if self.algo == "none" and not self.value_pretrain:
            raise ValueError("offline.algo = 'none' trains nothing without offline.value_pretrain; set "
                             "offline.value_pretrain=true, or choose offline.algo (filtered_bc, awr, iql, cql)")
        if self.value_pretrain and self.algo in ("iql", "cql"):
            raise ValueError(f"offline.value_pretrain = true with offline.algo = '{self.algo}': its V is the "
                             "algorithm's own (not a regression on the returns); drop offline.value_pretrain, or set "
                             "offline.algo=awr (or filtered_bc, none)")
        if self.judge_range[0] >= self.judge_range[1]:
            raise ValueError(f"offline.judge_range: Expected [low, high] with low < high (the term for a judge score "
                             f"of 1, then of 10), got {list(self.judge_range)}")
        if self.min_return is not None and self.algo != "filtered_bc":
            raise ValueError(f"offline.min_return = {self.min_return} has no effect with offline.algo = "
                             f"'{self.algo}'; set offline.algo=filtered_bc, or drop offline.min_return")
        return self

    @property
    def trains_critic(self) -> bool:
        """Whether the phase trains the critic (every algo but filtered_bc without value pre-training)."""
        return self.algo != "filtered_bc" or self.value_pretrain


class JudgeConfig(_Section):
    """An LLM judge's score as a reward term of online training (docs/judge.md): each collected episode's last turn
    also pays ``judge/score = weight x s``, s in [0, 1] the judge's 1-10 score mapped by ``(N - 1) / 9``. Asked
    through an OpenAI-compatible endpoint; every iteration logs the judge's agreement with the env's outcome
    (``judge/agreement``, ``judge/auc``), the hacking guard that ``polyturn diagnose`` reads."""

    model: str = Field(min_length=1, description="The judge model's name on the endpoint.")
    endpoint: str | None = Field(None, description="OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1 for "
                                 "`polyturn serve`). null: $OPENAI_BASE_URL, else https://api.openai.com/v1; the key "
                                 "is $OPENAI_API_KEY (none for a local server).")
    weight: float = Field(1.0, gt=0, description="judge/score of a perfect score (10); a score of 1 pays 0.")
    timeout: float = Field(60.0, gt=0, description="Seconds one call may take.")
    retries: int = Field(2, ge=0, description="Retries of a call that timed out or got HTTP 408/409/429/5xx.")
    concurrency: int = Field(8, ge=1, description="Calls in flight at most.")
    cache: str | None = Field(None, description="Verdict cache (JSONL); null: judge_cache.jsonl in run.out_dir. "
                              "An episode judged before (same conversation, model and prompt) is not sent again.")
    threshold: float = Field(0.5, ge=0, le=1, description="A score s >= this counts as the judge calling the episode "
                             "a success, for judge/agreement.")
    guard: Literal["warn", "drop"] = Field(
        "warn", description="The hacking guard: warn: the live check (run.diagnose_every) and polyturn diagnose warn "
        "judge_hacking; drop: also stop paying the term from the iteration after that warning (episodes are still "
        "judged, so judge/agreement stays logged; judge/paid says 0).")
    scoring: Literal["score", "yes_no"] = Field(
        "score", description="score: a reply ending 'Score: N' (1-10); yes_no: s = P(Yes) / (P(Yes) + P(No)) from the "
        "first token's top log-probs (an endpoint that returns them: vLLM, OpenAI).")
    on_malformed: Literal["skip", "stop"] = Field(
        "skip", description="A reply without 'Score: N' (yes_no: without Yes or No among the top tokens): skip "
        "(the episode pays judge/score 0, counted in "
        "judge/malformed) or stop the run with the episode named.")
