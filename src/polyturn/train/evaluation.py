"""Held-out evaluation during training: the policy on task seeds it never trains on, recorded in the run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from polyturn.acting.checkpoint import held_out_tasks, run_actor
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.config import TrainConfig
from polyturn.models.actor import Actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.types import Episode
from polyturn.runtime import release_host_memory
from polyturn.train.logger import RunLogger
from polyturn.train.reporting import Reporter, summarize_episodes
from polyturn.train.state import RunState


#: ``play(tasks, temperature=, label=, progress=)``: the policy's episodes on held-out ``tasks``, in task order.
Play = Callable[..., list[Episode]]


def play_alone(collector: Collector, tasks: Sequence[dict], *, temperature: float, label: str,
               progress: Callable[[int], None], seed: int) -> list[Episode]:
    """The collector's actor on ``tasks`` in a single-agent env (:func:`polyturn.acting.checkpoint.run_actor`)."""
    return run_actor(collector, tasks, temperature=temperature, seed=seed, progress=progress, label=label)


class HeldOut:
    """Greedy (and, when configured, sampled) evaluation of ``actor`` on held-out seeds (``play`` plays them:
    alone in a single-agent env, or seated against scripted partners in a multi-role one); results go to the run
    state, the metrics log and ``eval_<tag>.jsonl``. ``before`` runs first (the critic's update beside sampling is
    joined, so the metrics log stays in order)."""

    def __init__(self, *, cfg: TrainConfig, actor: Actor, play: Play, out: Path, logger: RunLogger, rep: Reporter,
                 state: RunState, before: Callable[[], None]) -> None:
        self.cfg, self.actor, self.play, self.out, self.logger = cfg, actor, play, out, logger
        self.rep, self.state, self.before = rep, state, before

    def all(self, tag: str) -> None:
        """Greedy evaluation ``tag`` (and ``<tag>_sampled``, with ``rollout.eval_sampled_temperature``)."""
        self.state.eval[tag] = self.run(tag, temperature=self.cfg.rollout.eval_temperature)
        if self.cfg.rollout.eval_sampled_temperature is not None:
            self.state.eval[f"{tag}_sampled"] = self.run(
                f"{tag}_sampled", temperature=self.cfg.rollout.eval_sampled_temperature)

    def copy(self, src: str, dst: str) -> None:
        """Record held-out evaluation ``src`` (and its sampled twin) again as ``dst``, episodes relabelled: for a
        policy that has not changed since ``src`` (a run without RL iterations), instead of sampling it again."""
        for suffix in ("", "_sampled"):
            if f"{src}{suffix}" not in self.state.eval:
                continue
            records = read_jsonl(self.out / f"eval_{src}{suffix}.jsonl")
            write_jsonl(self.out / f"eval_{dst}{suffix}.jsonl", [{**r, "policy": f"{dst}{suffix}"} for r in records])
            self.state.eval[f"{dst}{suffix}"] = res = dict(self.state.eval[f"{src}{suffix}"])
            self.log(f"{dst}{suffix}", res)

    def log(self, tag: str, res: dict[str, float]) -> None:
        """Write evaluation ``tag``'s results to the run's metrics log."""
        self.logger.log(self.state.bc_step + self.state.iter,
                        {"phase": f"eval_{tag}", **{f"eval/{k}": v for k, v in res.items()}})

    def run(self, tag: str, *, temperature: float) -> dict[str, float]:
        """Success on held-out task seeds (never trained on)."""
        self.before()
        cfg = self.cfg
        torch.set_num_threads(cfg.run.rollout_threads)
        self.actor.model.eval()
        tasks = held_out_tasks(cfg, cfg.env.eval_episodes)
        self.rep.start(f"eval {tag}", len(tasks))
        episodes = self.play(tasks, temperature=temperature, label=tag, progress=self.rep.advance)
        write_jsonl(self.out / f"eval_{tag}.jsonl", [ep.to_record() for ep in episodes])
        m = summarize_episodes(episodes)
        res = {"success_rate": m["charts/success_rate"], "return_mean": m["charts/return_mean"],
               "turns_mean": m["charts/turns_mean"], "invalid_action_rate": m["charts/invalid_action_rate"],
               "episodes": len(episodes), "temperature": temperature}
        del episodes
        release_host_memory()
        self.log(tag, res)
        self.rep.metrics(f"eval_{tag}", self.state.iter, {f"eval/{k}": v for k, v in res.items()})
        return res
