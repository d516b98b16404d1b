"""``bc`` and ``ppo`` (with ``ppo.refusal_pairs``): the policy updates, BC's and RL's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from polyturn.config._base import GroupShares, _balance_by, _check_shares, _group_shares, _Section


class BCConfig(_Section):
    """Phase 1: behaviour cloning on demonstrations (action tokens only)."""

    demos: str | None = Field(None, description="Demonstrations JSONL; generated with the noisy expert if missing.")
    episodes: int = Field(1000, ge=1, description="Demonstrations to generate when `demos` is missing.")
    noise: float = Field(0.3, ge=0, le=1, description="Noisy-expert error rate for generated demonstrations.")
    expert_options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword options of the env's scripted expert for generated "
        "demonstrations, e.g. {name_candidates: 6} for TwentyQuestions (its thoughts name the last candidates), "
        "{explain: true} for CustomerService (its thoughts state the facts behind each decision).")
    balance_by: str | None = _balance_by("the generated demonstrations")
    group_shares: GroupShares = _group_shares("the generated demonstrations", "Seeds whose group is full are "
                                              "skipped, so RL's tasks start after the last seed used.")
    epochs: float = Field(3.0, gt=0)
    lr: float = Field(2e-3, gt=0)
    batch_episodes: int = Field(32, ge=1)
    warmup_steps: int = Field(20, ge=0)

    @model_validator(mode="after")
    def _shares(self) -> "BCConfig":
        if not self.group_shares:
            return self
        if self.demos:
            raise ValueError(f"bc.group_shares shapes generated demonstrations, got bc.demos = {self.demos!r} too; "
                             "remove one of them")
        _check_shares("bc", self.balance_by, self.group_shares)
        return self


class RefusalPairsConfig(_Section):
    """Refusal preference pairs (``ppo.refusal_pairs``; docs/envs/customer-service.md, "Refusals that can be learned").

    At each state of the iteration's episodes where the env says the request is forbidden and must be refused now
    (its spec's ``refusals`` hook: CustomerService), one pair from that one state: the expert's refusal (chosen,
    tokenized as demonstrations are) against the step that carries the request on (rejected: before the customer's
    yes, the question for one; after it, the turn the policy sampled there when it called the write's tool, else
    the write as the expert writes it). Beside each minibatch of the update,
    ``weight`` x (DPO against the frozen reference policy RL starts from + ``nll`` x the NLL of the refusals).
    """

    weight: float = Field(0.1, gt=0, description="Weight of the pairs' term beside the update's own loss (rft's NLL, "
                          "PPO's) in each minibatch.")
    max_pairs: int = Field(16, ge=1, description="The most pairs an iteration trains on (those of the kind first "
                           "names first, then the others, drawn at random); each minibatch reads up to "
                           "ppo.minibatch_episodes of them.")
    first: Literal["sampled", "decision"] = Field(
        "sampled", description="Which pairs an iteration over max_pairs keeps first: sampled = those whose rejected "
        "turn is the write the policy sampled; decision = those at the turn where the request is decided (before "
        "the customer's yes: the question for one against the refusal, parting at the verdict). Logged: "
        "refusal/sampled_writes, refusal/decisions.")
    beta: float = Field(0.1, gt=0, description="DPO beta.")
    nll: float = Field(0.1, ge=0, description="Weight of the NLL of the refusals beside the DPO loss.")
    rejected: Literal["turn", "fork"] = Field(
        "turn", description="What DPO compares: turn = the two whole turns; fork = each turn through the first token "
        "where the two part (the decision; the shared tokens before it cancel, and neither turn's later tokens count). "
        "With turn, the write's later tokens, the tool call's format that every valid call shares, are pushed down "
        "too, and the refusal's later tokens can carry the margin.")
    nll_through: Literal["turn", "fork"] = Field(
        "turn", description="What the NLL reads of each chosen turn: turn = all of it; fork = its tokens through the "
        "fork token only (with rejected: fork): the decision and what leads to it, not the refusal's text after it. "
        "DPO at the fork alone lowers both forks' tokens where nothing holds them up (SmolLM2 seed 2: the thoughts "
        "looped where the decision should come); this NLL holds up the chosen one.")
    contrast: int = Field(0, ge=0, description="The most contrast pairs an iteration adds: at states the env marks "
                          "allowed (its spec's contrasts hook), the expert's next step chosen over a refusal, so that "
                          "the pairs teach where not to refuse as well (drawn at random; 0: none).")
    demo_starts: int = Field(0, ge=0, description="Groups of each RL iteration's tasks that start at a forbidden state "
                             "of a demonstration: its turns up to that state are played as forced actions, then the "
                             "policy samples (its refusals there are successes rft keeps, its writes the pairs' "
                             "rejected turns). For a policy that rarely reaches such a state itself (0: none).")

    @model_validator(mode="after")
    def _nll_through_a_fork(self) -> "RefusalPairsConfig":
        if self.nll_through == "fork" and self.rejected != "fork":
            raise ValueError("ppo.refusal_pairs.nll_through = fork reads each chosen turn through the fork token, "
                             f"which only rejected = fork has; got rejected = {self.rejected!r}: set "
                             "ppo.refusal_pairs.rejected=fork or nll_through=turn")
        return self


class PPOConfig(_Section):
    """The policy update."""

    algo: Literal["ppo", "a2c", "rft", "turn_dpo", "critic_pg", "critic_rft"] = Field(
        "ppo", description="a2c = one epoch, no clipping. rft = rejection-sampling fine-tuning (RAFT, ReST-EM): "
        "each iteration's successful episodes are imitated (token-mean NLL of their actions, `epochs` passes) and "
        "the others dropped; no advantages, clipping or KL stop. With critic.kind action: turn_dpo = DPO on "
        "candidate turns the critic ranked; critic_pg = REINFORCE with the critic's per-turn score as the "
        "advantage; critic_rft = every turn imitated with weight min(exp(A / awr_temperature), awr_max_weight).")
    dpo_states: int = Field(16, ge=1, description="turn_dpo: states drawn from each iteration's episodes.")
    dpo_candidates: int = Field(4, ge=2, description="turn_dpo: candidate turns sampled per state (top half vs "
                                "bottom half make the pairs).")
    dpo_beta: float = Field(0.1, gt=0, description="turn_dpo: DPO beta.")
    dpo_nll: float = Field(0.1, ge=0, description="turn_dpo: weight of the NLL of the preferred candidates.")
    dpo_reference: Literal["bc", "behaviour"] = Field(
        "bc", description="turn_dpo: the DPO reference policy. bc = a frozen copy of the policy RL starts from "
        "(standard DPO: the implicit rewards, and so how far the actor moves, are measured from it); behaviour = "
        "the policy that sampled the candidates, i.e. the reference moves every iteration and nothing bounds the "
        "drift (on Negotiation it collapsed to invalid actions: docs/action-critic.md).")
    awr_temperature: float = Field(1.0, gt=0, description="critic_rft: temperature of the advantage weights.")
    awr_max_weight: float = Field(20.0, gt=0, description="critic_rft: cap of a turn's weight.")
    awr_successes_only: bool = Field(
        False, description="critic_rft: imitate only the episodes rft keeps (successful; with rft_valid_only, valid "
        "throughout), each one's turn weights rescaled to mean 1: the critic decides which turns of a success are "
        "imitated most, not whether a failure is imitated (rft + the critic's turn-level credit).")
    rft_valid_only: bool = Field(
        False, description="With algo rft, imitate a successful episode only if every one of its actions was valid "
        "(a success reached through a malformed tool call teaches the malformed call too).")
    rft_skip_error_turns: bool = Field(
        False, description="With algo rft (or critic_rft), weight 0 every turn the environment answered with an "
        "error (info['error']: an invalid, failed or refused call, a repeat): a kept success's recovery is imitated, "
        "its mistakes are not. The turns stay in the context the later turns are read in.")
    rft_skip_wasted_turns: bool = Field(
        False, description="With algo rft (or critic_rft), weight 0 every turn the environment marked pointless "
        "(info['wasted']: a valid call that could not help, e.g. a Twenty Questions question asked when every "
        "object left gives the same answer, or when at most two are left): a kept success's detours are not "
        "imitated. The turns stay in the context the later turns are read in.")
    error_unlikelihood: float = Field(
        0.0, ge=0, description="With algo rft (or critic_rft): weight of an unlikelihood term on the turns the "
        "environment answered with an error (info['error']: a repeat, an invalid, failed or refused call) in every "
        "sampled episode, kept or not: -log(1 - p(action)) of the whole action, mean over those turns, a batch of "
        "minibatch_episodes such episodes beside each rft minibatch. rft never sees a failure, so the loops of "
        "failed episodes (the same call again and again) are otherwise never pushed down. 0: off.")
    clip: float = Field(0.2, gt=0)
    epochs: int = Field(2, ge=1)
    minibatch_episodes: int = Field(32, ge=1)
    target_kl: float | None = Field(
        0.05, gt=0, description="Stop the epochs early once an epoch's mean approx_kl passes this; a minibatch whose "
        "approx_kl passes twice this is not stepped and ends the update (null: neither).")
    dual_clip: float | None = Field(
        None, description="Dual-clip PPO: with a negative advantage, a token's loss stops growing once its "
        "ratio passes this (3.0 in verl's default); bounds the pull of rare or epsilon-forced tokens whose ratio "
        "explodes. Must exceed 1 + clip. null: off.")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the frozen reference (BC) policy.")
    decoupled: bool = Field(
        False, description="Decoupled PPO (AReaL), for rollout.async: the ratio is clipped around the proximal "
        "policy (the learner's weights when the update starts, one extra forward pass over the batch) and each "
        "token is weighted by pi_proximal / pi_behaviour, so a turn sampled versions ago is corrected by its "
        "recorded log-probs without the clip range being centred on that old policy. Off: the ratio divides by "
        "the behaviour log-probs (the same thing when every turn is fresh).")
    behaviour_weight_cap: float | None = Field(
        5.0, gt=0, description="With ppo.decoupled: a token whose pi_proximal / pi_behaviour passes this is left "
        "out of the loss (AReaL's cap). null: no cap.")
    lam: float = Field(0.85, ge=0, le=1, description="GAE lambda (gamma follows curriculum.gamma).")
    normalize_advantages: bool = True
    reward_scale: float = Field(
        0.1, gt=0, description="Rewards are multiplied by this before GAE and critic targets (SQLAnalyst's outcome "
        "terms are +-10; 0.1 keeps value targets near +-1). Logged returns stay unscaled.",
    )
    episodes_per_iter: int = Field(64, ge=1)
    refusal_pairs: RefusalPairsConfig | None = Field(
        None, description="Refusal preference pairs beside the update (ppo, a2c, rft, critic_pg, critic_rft) on envs "
        "that say which states are forbidden (EnvSpec.refusals: CustomerService), e.g. {weight: 0.1, max_pairs: 16}. "
        "null: none.")

    @property
    def frozen_reference(self) -> bool:
        """Whether the update reads a frozen copy of the policy RL starts from (KL penalty, turn-DPO's reference, or
        the refusal pairs' DPO reference)."""
        return (self.kl_coef > 0 or (self.algo == "turn_dpo" and self.dpo_reference == "bc")
                or self.refusal_pairs is not None)

    @model_validator(mode="after")
    def _refusal_pairs_beside_the_minibatch_loop(self) -> "PPOConfig":
        if self.refusal_pairs is not None and self.algo == "turn_dpo":
            raise ValueError("ppo.refusal_pairs joins the minibatches of ppo, a2c, rft, critic_pg or critic_rft; "
                             "ppo.algo = 'turn_dpo' takes its own DPO steps. Set ppo.algo=rft (or another), or drop "
                             "ppo.refusal_pairs")
        return self

    @model_validator(mode="after")
    def _dual_clip_above_clip(self) -> "PPOConfig":
        if self.dual_clip is not None and self.dual_clip <= 1 + self.clip:
            raise ValueError(f"ppo.dual_clip = {self.dual_clip} must exceed 1 + ppo.clip = {1 + self.clip} "
                             "(it bounds ratios past the clip range); set e.g. ppo.dual_clip=3.0, or null for off")
        return self

    @model_validator(mode="after")
    def _valid_only_needs_rft(self) -> "PPOConfig":
        filters = self.algo == "rft" or (self.algo == "critic_rft" and self.awr_successes_only)
        if self.rft_valid_only and not filters:
            raise ValueError(f"ppo.rft_valid_only = true has no effect with ppo.algo = '{self.algo}' (it filters the "
                             "episodes rft imitates); set ppo.algo=rft (or critic_rft with ppo.awr_successes_only), "
                             "or drop ppo.rft_valid_only")
        for name in ("rft_skip_error_turns", "rft_skip_wasted_turns", "error_unlikelihood"):
            if getattr(self, name) and self.algo not in ("rft", "critic_rft"):
                raise ValueError(f"ppo.{name} = {getattr(self, name)} has no effect with ppo.algo = '{self.algo}' "
                                 "(it weights the turns of rft's update); set ppo.algo=rft or critic_rft, or drop it")
        if self.awr_successes_only and self.algo != "critic_rft":
            raise ValueError(f"ppo.awr_successes_only = true has no effect with ppo.algo = '{self.algo}'; set "
                             "ppo.algo=critic_rft, or drop it")
        return self

    @model_validator(mode="after")
    def _decoupled_needs_ppo(self) -> "PPOConfig":
        if self.decoupled and self.algo != "ppo":
            raise ValueError(f"ppo.decoupled = true has no effect with ppo.algo = '{self.algo}' (only PPO-clip has "
                             "a ratio to decouple); set ppo.algo=ppo, or drop ppo.decoupled")
        return self

    @model_validator(mode="after")
    def _kl_coef_needs_ppo(self) -> "PPOConfig":
        if self.algo != "ppo" and self.kl_coef > 0:
            raise ValueError(
                f"ppo.kl_coef = {self.kl_coef} has no effect with ppo.algo = '{self.algo}' (its loss has no KL "
                "term); set ppo.kl_coef=0, or ppo.algo=ppo for a KL penalty to the BC policy"
            )
        return self


#: Policy updates that read an action-level critic (critic.kind: action).
ACTION_ALGOS = ("turn_dpo", "critic_pg", "critic_rft")
