"""``curriculum``: the phases' lengths and the schedules of gamma, temperature, epsilon and entropy."""

from __future__ import annotations

from pydantic import Field, model_validator

from polyturn.config._base import GroupShares, _balance_by, _check_shares, _group_shares, _Section


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
