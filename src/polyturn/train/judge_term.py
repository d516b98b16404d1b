"""The LLM judge as a reward term of online training (config ``judge``, docs/judge.md).

Each collected episode is judged whole (:mod:`polyturn.acting.judge`: the env's rubric, an OpenAI-compatible
endpoint, the verdict cache) and its last turn also pays ``judge/score = weight x s``, s in [0, 1]; the term is
logged as every term is (``reward/judge/score``). The episodes are judged before anything reads their rewards
(the critic's values and advantages, the update), so the term is part of the return like any env term. Branches
the action critic plays from the batch's states (``critic.branch_states``) are not judged.

The hacking guard: training episodes end with a known outcome, so every iteration logs how well the judge agrees
with it: ``judge/agreement`` (the share of episodes where ``s >= judge.threshold`` matches success),
``judge/auc`` (the chance a success scores above a failure), ``judge/spearman``, and ``judge/score_mean``.
``polyturn diagnose`` warns when the judge's reward rises while success does not
(:func:`polyturn.health.judge.check_judge_hacking`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from polyturn.acting.judge import JudgeCache, agreement, chat_completion, check_endpoint, judge_records
from polyturn.config import JudgeConfig
from polyturn.health.judge import KIND as HACKING
from polyturn.rollout.types import Episode
from polyturn.train.offline_data import JUDGE_TERM

#: The verdict cache's file in the run directory when ``judge.cache`` is null.
CACHE_FILE = "judge_cache.jsonl"


def check_judge(cfg: JudgeConfig | None, *, world_size: int = 1) -> None:
    """``ValueError`` naming the field and the fix for what the judge term cannot do."""
    if cfg is not None and world_size > 1:
        raise ValueError(f"judge: the judge term runs in one process, got {world_size} torchrun processes; run on one "
                         "process (or set judge: null)")


class JudgeTerm:
    """The run's judge: :meth:`apply` scores a batch of episodes, adds the term and returns the iteration's metrics.
    Made when the run starts, it checks that the endpoint answers (:func:`polyturn.acting.judge.check_endpoint`)."""

    def __init__(self, cfg: JudgeConfig, *, out_dir: Path) -> None:
        self.cfg = cfg
        check_endpoint(base_url=cfg.endpoint, timeout=min(cfg.timeout, 10.0))  # now, not after BC
        self.cache = JudgeCache(cfg.cache or out_dir / CACHE_FILE)
        self.ask = chat_completion(cfg.model, base_url=cfg.endpoint, timeout=cfg.timeout, max_retries=cfg.retries,
                                   scoring=cfg.scoring)

    def apply(self, episodes: Sequence[Episode], *, warned: Sequence[str] = ()) -> dict[str, float]:
        """Judge ``episodes`` (those with turns), add ``judge/score`` to each one's last turn (0 for a malformed reply
        under ``on_malformed: skip``), and return ``judge/*`` metrics and ``perf/judge_s``.

        ``warned``: the run's warnings so far (``kind:metric`` keys, the run state's). Under ``judge.guard: drop`` a
        ``judge_hacking`` among them stops the payment: the term is 0 (``judge/paid`` 0), the judging and its
        agreement go on. The keys are checkpointed with the run, so a resumed run pays as the one it continues."""
        t0 = time.perf_counter()
        paid = not (self.cfg.guard == "drop" and any(w.startswith(f"{HACKING}:") for w in warned))
        weight = self.cfg.weight if paid else 0.0
        eps = [ep for ep in episodes if ep.turns]
        verdicts = judge_records([ep.to_record() for ep in eps], self.ask, model=self.cfg.model, cache=self.cache,
                                 names=[f"the training episode of task {ep.task_id!r} (seed {ep.seed})" for ep in eps],
                                 concurrency=self.cfg.concurrency, scoring=self.cfg.scoring,
                                 on_malformed="record" if self.cfg.on_malformed == "skip" else "stop")
        for ep, v in zip(eps, verdicts):
            term = 0.0 if v.value is None else weight * v.value
            last = ep.turns[-1]
            last.reward += term
            last.reward_terms[JUDGE_TERM] = term
        scored = [(v.value, ep.success) for ep, v in zip(eps, verdicts) if v.value is not None]
        a = agreement([s for s, _ in scored], [ok for _, ok in scored], threshold=self.cfg.threshold)
        out = {"judge/malformed": float(len(verdicts) - len(scored)), "judge/paid": float(paid),
               "judge/cached": float(sum(v.cached for v in verdicts)),
               "perf/judge_s": time.perf_counter() - t0}
        if scored:
            out["judge/score_mean"] = sum(s for s, _ in scored) / len(scored)
        out.update({f"judge/{name}": float(a[k]) for name, k in (("agreement", "accuracy"), ("auc", "auc"),
                                                                  ("spearman", "spearman")) if a[k] is not None})
        return out
