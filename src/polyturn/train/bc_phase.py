"""Phase 1 of the trainer: behaviour cloning on the demonstrations' action tokens (a :class:`Trainer` mixin)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from polyturn.algos.bc import bc_loss
from polyturn.rollout.context import DemoTokens
from polyturn.train import distributed
from polyturn.train.batch import MicroStats, action_tokens, length_batches, make_token_batch, micro_batches, policy_output

#: Demonstration actions cut at rollout.max_action_tokens, as a share of all of them, above which BC refuses to run.
MAX_CUT_SHARE = 0.02


class BehaviourCloning:
    """BC: the demonstrations' cut-action check, the BC loss of a batch of them, and phase 1 itself."""

    def _check_cut_actions(self, demo_tokens: Sequence[DemoTokens]) -> dict[str, float]:
        """Count demonstration actions cut at ``rollout.max_action_tokens``; report them, refuse too many."""
        n = sum(d.n_actions for d in demo_tokens)
        cut = sum(d.n_cut for d in demo_tokens)
        longest = max((d.longest_action for d in demo_tokens), default=0)
        share = cut / max(1, n)
        cap = self.cfg.rollout.max_action_tokens
        if cut:
            self.rep.message(f"BC: {cut} of {n} demonstration actions ({share:.1%}) are longer than "
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

    def _bc_batch_loss(self, idx: Sequence[int], acc: MicroStats, *, weight: float = 1.0) -> Iterator[torch.Tensor]:
        """``weight`` x the BC loss of demonstrations ``idx``, as micro-batch losses (see :meth:`update_actor`).

        Each is weighted by its share of the batch's action tokens (``bc_loss`` is a token mean);
        ``losses/bc_loss`` and ``bc/token_accuracy`` of the whole batch go into ``acc``.
        """
        demos = [self._demo_items[i] for i in idx]
        n_act = max(1, sum(action_tokens(segs) for segs in demos))
        for micro in distributed.shard(micro_batches([[len(s) for s in segs] for segs in demos],
                                                     self.cfg.actor.microbatch_tokens)):
            sub = [demos[k] for k in micro]
            acc.count([[len(s) for s in segs] for segs in sub])
            batch = make_token_batch([(j, seg) for j, segs in enumerate(sub) for seg in segs],
                                     pad_id=self.actor.pad_id, device=self.runtime.device)
            po = policy_output(self.actor, batch)
            out = bc_loss(po.logprobs, batch.action_mask, correct=po.correct)
            share = sum(action_tokens(segs) for segs in sub) / n_act
            acc.add({"losses/bc_loss": out["loss"], "bc/token_accuracy": out["token_accuracy"]}, share)
            yield weight * share * out["loss"]

    def behaviour_cloning(self) -> None:
        """Phase 1: maximise the likelihood of the demonstrations' action tokens."""
        b = self.cfg.bc
        n = len(self._demo_items)
        steps = max(1, math.ceil(b.epochs * n / b.batch_episodes))
        opt = torch.optim.AdamW(self.actor.trainable_parameters(), lr=b.lr)

        def lr_at(step: int) -> float:  # linear warm-up, then cosine to 10%
            if step < b.warmup_steps:
                return (step + 1) / b.warmup_steps
            p = (step - b.warmup_steps) / max(1, steps - b.warmup_steps)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        torch.set_num_threads(self.cfg.run.train_threads)
        self.actor.model.train()
        self.rep.start("bc", steps)
        lengths = [sum(len(seg) for seg in segs) for segs in self._demo_items]
        batches: list[list[int]] = []
        real = padded = 0  # tokens of the micro-batches run so far (perf/bc_padding)
        for step in range(steps):
            if not batches:
                batches = length_batches(lengths, b.batch_episodes, self.py_rng)
            idx = batches.pop()
            acc = MicroStats()
            ok, norm = self._guarded_step(self._bc_batch_loss(idx, acc), opt, self.actor.trainable_parameters(),
                                          self.cfg.actor.max_grad_norm, where=f"bc step {step}")
            real, padded = real + acc.real, padded + acc.padded
            sched.step()
            self.rep.advance(1)
            if step % 10 == 0 or step == steps - 1:
                m = {**acc.result(), "bc/lr": sched.get_last_lr()[0], "grad/actor_norm": norm,
                     "perf/bc_padding": 1 - real / max(1, padded), **self.demo_cut}
                self.logger.log(step, {"phase": "bc", **m})
                self.rep.metrics("bc", step, m)
        self.state["bc_step"] = steps
