"""BC minibatches of SmolLM2 on CustomerService, as `configs/customer_service_smollm2.yaml` trains them, with and
without `actor.shared_prefix` (the system prompt every demonstration opens with run once per micro-batch), side by
side in one process: the arms take turns, each minibatch's forward + backward timed, medians printed.

    taskset -c 1 .venv/bin/python benchmarks/shared_prefix.py --threads 1 --repeats 3

``--part pairs``: the refusal and contrast pairs of `configs/customer_service_constrained_smollm2.yaml` (fork
pairs; ``--max-pairs`` of each kind, 4: the config's 16 + 16 take ~4 min a pass on two threads), from 64 of its
demonstrations replayed: each update's three passes over them (the reference's
and the policy's summed log-probs before and after; one timed) and the term's forward + backward over a minibatch's
draw of them, with each pair's context run once (one pair a micro-batch) against the pairs run whole.

(about 20 minutes on one AVX2 core in fp32; the 4096 arm needs ~12 GB free: the kernel killed it once at 11.9
GB, 2026-12-07, docs/smollm2.md). The demonstrations are the config's (the exact expert with
explained thoughts), tokenized as BC reads them. ``--quick``: the tiny preset on the same env, 8 demonstrations
(48 for the pairs), one repeat, both parts: that they run (their figures mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.train.batch import MicroStats, common_prefix
from polyturn.train.pairs import summed_logprobs
from polyturn.train.refusals import RefusalTerm
from polyturn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
#: (name, actor.shared_prefix, actor.microbatch_tokens)
#: (A whole minibatch of 8 in one pass, ~12.6k tokens, needed over 13 GB: the kernel killed it, 2026-12-07.)
ARMS = [("one pass a demonstration (shipped: budget 1024)", False, 1024),
        ("shared prefix, budget 2048", True, 2048),
        ("shared prefix, budget 4096", True, 4096)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="minibatches per arm")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--part", choices=["bc", "pairs"], default="bc")
    ap.add_argument("--max-pairs", type=int, default=4, help="--part pairs: refusal pairs, and as many contrast pairs")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    _quiet_libraries()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats = 1
        return max(bc_part(args), pairs_part(args))
    return bc_part(args) if args.part == "bc" else pairs_part(args)


def pairs_part(args: argparse.Namespace) -> int:
    """The refusal term's passes over its pairs, each pair's context run once against the pairs run whole."""
    pairs_cfg = ["ppo.refusal_pairs.rejected=fork", f"ppo.refusal_pairs.contrast={args.max_pairs}",
                 f"ppo.refusal_pairs.max_pairs={args.max_pairs}", "ppo.refusal_pairs.nll=0.0"]
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            cfg = load_config(ROOT / "configs" / "test_tiny.yaml", [
                f"run.out_dir={tmp}/run", "env.id=polyturn/CustomerService-v0", "rollout.system_prompt=true",
                "bc.episodes=48", "rollout.context_budget=2048", "rollout.max_action_tokens=96", "ppo.algo=rft",
                "critic.kind=none", "critic.group_size=2", "ppo.refusal_pairs={weight: 0.3}", *pairs_cfg])
        else:
            cfg = load_config(ROOT / "configs" / "customer_service_constrained_smollm2.yaml", [
                f"run.out_dir={tmp}/run", f"run.precision={args.precision}", "bc.episodes=64",
                f"run.train_threads={args.threads}", f"run.rollout_threads={args.threads}", *pairs_cfg])
        tr = Trainer(cfg)
        policy, actor = tr.policy, tr.policy.actor
        # Every demonstration replayed (its actions forced): the states it passes give the pairs an update would.
        tasks = [{"seed": r["seed"], "prefix": [actor.encode(t["action"]) + [actor.stop_id] for t in r["turns"]]}
                 for r in tr.demos]
        episodes = tr.collector.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(0))
        policy.set_reference()
        term = RefusalTerm.build(policy, episodes, temperature=1.0, metrics={})
        assert term is not None, "no demonstration reached a forbidden or an allowed state: more bc.episodes"
        n_tok = [len(pr.context) + max(len(pr.chosen.ids), len(pr.rejected.ids)) for pr in term.pairs]
        print(f"{cfg.actor.preset}, {args.precision}, {args.threads} thread(s): {len(term.pairs)} pairs "
              f"({term.n_refusals} refusal, {len(term.pairs) - term.n_refusals} contrast) of "
              f"{statistics.mean(len(pr.context) for pr in term.pairs):.0f} context tokens and up to "
              f"{max(n_tok)} in all; draws of {cfg.ppo.minibatch_episodes}", flush=True)
        params = actor.trainable_parameters()
        names = {False: "pairs run whole (shipped)", True: "each pair's context once"}
        times: dict[str, dict[bool, list[float]]] = {"logprobs": {False: [], True: []}, "term": {False: [], True: []}}
        out: dict[bool, list[torch.Tensor]] = {False: [], True: []}
        for rep in range(args.repeats):
            for share in (False, True):
                t0 = time.perf_counter()
                out[share].append(summed_logprobs(actor, term.pairs, temperature=1.0, chosen_prefix=True,
                                                  budget=cfg.actor.microbatch_tokens, share_context=share))
                times["logprobs"][share].append(time.perf_counter() - t0)
                term.share = share
                policy.py_rng.seed(rep)  # the same draw in both arms
                for p in params:
                    p.grad = None
                t0 = time.perf_counter()
                for loss in term(MicroStats()):
                    loss.backward()
                times["term"][share].append(time.perf_counter() - t0)
                out[share].append(torch.cat([p.grad.flatten().float() for p in params if p.grad is not None]))
                print(f"  repeat {rep}: {names[share]}: log-probs {times['logprobs'][share][-1]:.2f} s, term "
                      f"forward + backward {times['term'][share][-1]:.2f} s", flush=True)
        gap = max(float((b - a).abs().max() / a.abs().max()) for a, b in zip(out[False], out[True], strict=True))
        print(f"the same pair log-probs and gradients in both arms: largest difference {gap:.1e} of the largest"
              + ("" if gap < 1e-3 else " (NOT THE SAME: exit status 1)"))
        print("\n| refusal term, per update | pairs run whole (shipped), s | each context once, s | speed-up |\n"
              "|---|---|---|---|")
        for what, label in (("logprobs", f"summed log-probs of the {len(term.pairs)} pairs (x3 an update)"),
                            ("term", f"forward + backward of a draw of {cfg.ppo.minibatch_episodes}")):
            a, b = statistics.median(times[what][False]), statistics.median(times[what][True])
            print(f"| {label} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
        tr.close_envs()
    return 0 if gap < 1e-3 else 1


def bc_part(args: argparse.Namespace) -> int:
    """BC minibatches with and without the shared system prompt."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            cfg = load_config(ROOT / "configs" / "test_tiny.yaml", [
                f"run.out_dir={tmp}/run", "env.id=polyturn/CustomerService-v0", "rollout.system_prompt=true",
                "bc.episodes=8", "bc.batch_episodes=4", "rollout.context_budget=2048"])
        else:
            cfg = load_config(ROOT / "configs" / "customer_service_smollm2.yaml", [
                f"run.out_dir={tmp}/run", f"run.precision={args.precision}", "bc.episodes=32",
                f"run.train_threads={args.threads}", f"run.rollout_threads={args.threads}"])
        tr = Trainer(cfg)
        policy, size = tr.policy, cfg.bc.batch_episodes
        demos = policy.demos
        lengths = [sum(len(s) for s in segs) for segs in demos]
        shared = common_prefix([s.ids for segs in demos for s in segs])
        print(f"{cfg.actor.preset}, {args.precision}, {args.threads} thread(s): {len(demos)} demonstrations of "
              f"{statistics.mean(lengths):.0f} tokens on average (at most {max(lengths)}), {shared} of them the "
              f"prefix all share; minibatches of {size}", flush=True)
        policy.actor.model.train()
        for loss in policy.bc_loss(list(range(size)), MicroStats()):  # warm-up, not timed
            loss.backward()
        times: dict[str, list[float]] = {name: [] for name, _, _ in ARMS}
        losses: dict[int, list[float]] = {}  # each minibatch's BC loss in every arm: the same function
        for rep in range(args.repeats):
            idx = [i % len(demos) for i in range(rep * size, rep * size + size)]
            for name, on, budget in ARMS:
                policy.cfg = cfg.model_copy(update={"actor": cfg.actor.model_copy(
                    update={"shared_prefix": on, "microbatch_tokens": budget})})
                policy.opt.zero_grad()
                t0 = time.perf_counter()
                total = 0.0
                for loss in policy.bc_loss(idx, MicroStats()):
                    loss.backward()
                    total += loss.item()
                times[name].append(time.perf_counter() - t0)
                losses.setdefault(rep, []).append(total)
                print(f"  minibatch {rep}: {name}: {times[name][-1]:.2f} s", flush=True)
        gap = max(abs(x - v[0]) / abs(v[0]) for v in losses.values() for x in v)
        print(f"the same BC loss in every arm: largest relative difference {gap:.1e}"
              + ("" if gap < 1e-4 else " (NOT THE SAME: exit status 1)"))
        base = statistics.median(times[ARMS[0][0]])
        print("\n| BC minibatch, forward + backward | median s | vs shipped |\n|---|---|---|")
        for name, _, _ in ARMS:
            m = statistics.median(times[name])
            print(f"| {name} | {m:.2f} | {base / m:.2f}x |")
    return 0 if gap < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
