"""``run`` and ``env``: where outputs go, how the machine is used, which environment and tasks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from polyturn.config._base import _Section


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
