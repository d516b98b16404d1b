"""The training tasks of each RL iteration: seeds in order from the run's task counter, shaped by the curriculum."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from polyturn.acting.episodes import SEARCH_FACTOR, GroupQuota, breakdown_of, task_group
from polyturn.config import TrainConfig
from polyturn.train.setup import make_envs
from polyturn.train.state import RunState


class TaskStream:
    """Draws each iteration's tasks: ``group`` copies of each seed (several attempts per task for the baselines and
    pairs that compare them), the curriculum stage's level, turn limit and tools, and with
    ``curriculum.group_shares`` each named group's share of the seeds.

    The next seed lives in the run state (``task_counter``), so resume continues the stream; ``rng`` draws levels.
    """

    def __init__(self, cfg: TrainConfig, state: RunState, rng: np.random.Generator) -> None:
        self.cfg, self.state, self.rng = cfg, state, rng
        self._group_of: Callable[[dict], str] | None = None
        self._probe_env: Any = None
        if cfg.curriculum.group_shares:  # RL's task mix by group (checked before the demonstrations are made):
            self._group_of = breakdown_of(cfg.env.id, cfg.curriculum.balance_by)
            self._probe_env = make_envs(cfg, 1)[0]  # an env that only sets tasks to read their group

    def next(self, n: int, progress: float, *, group: int) -> list[dict]:
        """About ``n`` tasks (a whole number of ``group``-sized groups) for the iteration at ``progress``."""
        cur = self.cfg.curriculum
        stage = cur.stage_at(progress)
        places = max(1, n // group)
        # curriculum.group_shares: seeds in order, each kept only while its group has room this iteration.
        quota = GroupQuota(places, cur.group_shares, label=str(cur.balance_by)) if cur.group_shares else None
        first, tasks = self.state.task_counter, []
        while len(tasks) < places * group:
            if quota is not None and self.state.task_counter - first >= SEARCH_FACTOR * places:
                raise ValueError("curriculum.group_shares: " + quota.shortfall(
                    f"training seeds {first}..{self.state.task_counter - 1}"))
            seed = self.state.task_counter
            self.state.task_counter += 1
            opts: dict[str, Any] = {}
            if stage.levels:
                opts["level"] = int(self.rng.choice(stage.levels))
            if stage.max_turns:
                opts["max_turns"] = stage.max_turns
            if stage.tools:
                opts["tools"] = list(stage.tools)
            if quota is not None and not quota.take(task_group(self._probe_env, self._group_of, seed=seed,
                                                               options=opts)):
                continue
            tasks += [{"seed": seed, "options": opts}] * group
        return tasks

    def close(self) -> None:
        """Close the probe environment, if one was made."""
        if self._probe_env is not None:
            self._probe_env.close()
            self._probe_env = None
