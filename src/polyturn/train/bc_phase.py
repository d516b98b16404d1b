"""Phase 1: behaviour cloning on the demonstrations' action tokens, and the check of actions cut at the cap."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from polyturn.rollout.context import DemoTokens
from polyturn.train.batch import MicroStats, length_batches
from polyturn.train.logger import RunLogger
from polyturn.train.policy import Policy
from polyturn.train.reporting import Reporter

#: Demonstration actions cut at rollout.max_action_tokens, as a share of all of them, above which BC refuses to run.
MAX_CUT_SHARE = 0.02


def check_cut_actions(demo_tokens: Sequence[DemoTokens], *, cap: int, rep: Reporter) -> dict[str, float]:
    """Count demonstration actions cut at ``rollout.max_action_tokens`` (``cap``); report them, refuse too many."""
    n = sum(d.n_actions for d in demo_tokens)
    cut = sum(d.n_cut for d in demo_tokens)
    longest = max((d.longest_action for d in demo_tokens), default=0)
    share = cut / max(1, n)
    if cut:
        rep.message(f"BC: {cut} of {n} demonstration actions ({share:.1%}) are longer than "
                    f"rollout.max_action_tokens = {cap} and were cut (longest: {longest} tokens)")
    if share > MAX_CUT_SHARE:
        raise ValueError(
            f"Expected at most {MAX_CUT_SHARE:.0%} of demonstration actions to be longer than "
            f"rollout.max_action_tokens = {cap} tokens, got {cut} of {n} ({share:.1%}; the longest is {longest} "
            f"tokens, stop token included). BC on a cut action teaches the actor to stop early: raise "
            f"rollout.max_action_tokens to at least {longest} (and rollout.context_budget with it), or use "
            "demonstrations with shorter actions."
        )
    return {"bc/cut_actions": float(cut), "bc/cut_share": share}


def behaviour_cloning(policy: Policy, *, logger: RunLogger, rep: Reporter, extra: dict[str, float],
                      first_step: int = 0, label: str = "") -> int:
    """Maximise the likelihood of ``policy``'s demonstrations' action tokens; returns the optimizer steps taken.

    Linear warm-up, then cosine to 10% of ``bc.lr``; every 10th step's metrics (and ``extra``) are logged, at
    ``first_step`` + the step (a run that BCs several policies logs one after the other), under ``<label>/`` when a
    label is given.
    """
    cfg = policy.cfg
    b = cfg.bc
    n = len(policy.demos)
    steps = max(1, math.ceil(b.epochs * n / b.batch_episodes))
    opt = torch.optim.AdamW(policy.actor.trainable_parameters(), lr=b.lr)

    def lr_at(step: int) -> float:  # linear warm-up, then cosine to 10%
        if step < b.warmup_steps:
            return (step + 1) / b.warmup_steps
        p = (step - b.warmup_steps) / max(1, steps - b.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    torch.set_num_threads(cfg.run.train_threads)
    policy.actor.model.train()
    rep.start("bc", steps)
    lengths = [sum(len(seg) for seg in segs) for segs in policy.demos]
    batches: list[list[int]] = []
    real = padded = 0  # tokens of the micro-batches run so far (perf/bc_padding)
    for step in range(steps):
        if not batches:
            batches = length_batches(lengths, b.batch_episodes, policy.py_rng)
        idx = batches.pop()
        acc = MicroStats()
        ok, norm = policy.step(policy.bc_loss(idx, acc), opt, policy.actor.trainable_parameters(),
                               cfg.actor.max_grad_norm, where=f"bc step {step}")
        real, padded = real + acc.real, padded + acc.padded
        sched.step()
        rep.advance(1)
        if step % 10 == 0 or step == steps - 1:
            m = {**acc.result(), "bc/lr": sched.get_last_lr()[0], "grad/actor_norm": norm,
                 "perf/bc_padding": 1 - real / max(1, padded), **extra}
            m = {f"{label}/{k}": v for k, v in m.items()} if label else m
            logger.log(first_step + step, {"phase": "bc", **m})
            rep.metrics("bc", first_step + step, m)
    return steps
