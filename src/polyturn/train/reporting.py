"""Where the trainer reports progress, and the per-iteration summary of a batch of episodes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from polyturn.config import TrainConfig
from polyturn.health.checks import new_warnings, updates_per_iter
from polyturn.health.signals import action_diversity, read_records
from polyturn.rollout.types import Episode
from polyturn.runtime import resident_bytes


#: A reporter's ``sub``: given a step's name and total units, its ``advance(n)``.
SubProgress = Callable[[str, int], Callable[[int], None]]


class Reporter(Protocol):
    """Where the trainer sends progress; the CLI shows it with rich, tests pass :class:`NullReporter`."""

    def start(self, name: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def sub(self, name: str, total: int) -> Callable[[int], None]: ...
    def metrics(self, phase: str, step: int, metrics: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...


class NullReporter:
    """Reports nothing."""

    def start(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def sub(self, name: str, total: int) -> Callable[[int], None]:
        return ignore_steps(name, total)

    def metrics(self, phase: str, step: int, metrics: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        pass


def _ignore(n: int = 1) -> None:
    pass


def ignore_steps(name: str, total: int) -> Callable[[int], None]:
    """A :data:`SubProgress` that counts nothing: the default where no reporter is given."""
    return _ignore


def summarize_episodes(episodes: Sequence[Episode]) -> dict[str, float]:
    """Success, return, turns, invalid actions and the mean of each reward term per episode."""
    n = max(1, len(episodes))
    out = {
        "charts/success_rate": sum(ep.success for ep in episodes) / n,
        "charts/return_mean": sum(ep.episode_return for ep in episodes) / n,
        "charts/turns_mean": sum(len(ep.turns) for ep in episodes) / n,
        "charts/truncated_rate": sum(ep.truncated for ep in episodes) / n,
    }
    turns = [t for ep in episodes for t in ep.turns]
    out["charts/invalid_action_rate"] = sum(not t.valid for t in turns) / max(1, len(turns))
    out["charts/episodes"] = float(len(episodes))
    out.update(action_diversity([[t.action for t in ep.turns] for ep in episodes]))
    terms: dict[str, float] = {}
    for t in turns:
        for k, v in t.reward_terms.items():
            terms[k] = terms.get(k, 0.0) + v
    out.update({f"reward/{k}": v / n for k, v in sorted(terms.items())})
    return out


def sampling_speed(episodes: Sequence[Episode], gen_s: float) -> dict[str, float]:
    """Turns and action tokens sampled per second of an iteration's collection (``gen_s`` seconds)."""
    n_turns = sum(len(ep.turns) for ep in episodes)
    n_tokens = sum(len(tr.action_ids) for ep in episodes for tr in ep.turns)
    return {"perf/turns_per_s": n_turns / gen_s, "perf/tokens_per_s": n_tokens / gen_s}


def iteration_metrics(episodes: Sequence[Episode], timings: dict[str, float], *, extra: Mapping[str, Any],
                      released: int, schedule: Mapping[str, float], skipped: int) -> dict[str, Any]:
    """An RL iteration's logged figures besides its updates': the episodes' summary, the stage ``timings`` with the
    resident memory after the iteration and what the C heap handed back (``released`` bytes; GB, where measurable),
    the collection's ``extra`` figures, the sampling speed, the ``schedule`` (``schedule/<name>``) and the guard's
    count of skipped updates so far."""
    rss = resident_bytes()
    if rss is not None:
        timings = {**timings, "perf/rss_gb": rss / 2**30, "perf/released_gb": released / 2**30}
    return {**summarize_episodes(episodes), **timings, **extra, **sampling_speed(episodes, timings["perf/gen_s"]),
            **{f"schedule/{k}": v for k, v in schedule.items()}, "guard/skipped_total": skipped}


def report_new_warnings(cfg: TrainConfig, metrics: Path, *, seen: list[str], out: Path, rep: Reporter) -> list[str]:
    """The checks of ``polyturn diagnose`` on the log so far (``metrics``, a run's ``metrics.jsonl``); each new warning
    goes to ``rep`` at once (warnings already reported, kept in ``seen``, the run state's, are not repeated). Returns
    the new messages."""
    new = new_warnings(read_records(metrics), updates_per_iter=updates_per_iter(cfg), seen=seen,
                       plot_dir=out / "diagnose", drawn_by=f"polyturn diagnose --run {out} --episodes 0")
    for m in new:
        rep.message(m)
    return new
