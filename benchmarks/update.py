"""Update speed and padding, side by side in one run.

1. Actor-update tokens/s: :meth:`Policy.update_actor` (token-level PPO-clip,
   logits only at action tokens) with each ``actor.microbatch_tokens`` given
   (``none``: the whole minibatch in one forward, as before micro-batching),
   against a bare loop over random minibatches of the same size (forward with
   full logits, log-likelihood of the action tokens, backward, AdamW step),
   whole and in the same micro-batches. Tokens are real (non-pad) tokens;
   the passes are interleaved.
2. Padding: the share of pad positions in PPO minibatches (episodes' token
   segments) and critic minibatches (turn states as critic text), drawn at
   random, length-bucketed (sort windows of 8 minibatches by length, then
   shuffle the minibatches), and what the update paths actually ran: the
   ``perf/actor_padding`` and ``perf/critic_padding`` they report (PPO
   minibatches as drawn, in micro-batches; critic minibatches bucketed, in
   micro-batches of ``critic.microbatch_tokens``).

Run by hand, on the episodes a checkpoint collects (64 at temperature 1)::

    .venv/bin/python benchmarks/update.py --checkpoint runs/demo/<ts>/ckpt-final
    .venv/bin/python benchmarks/update.py --quick   # 16 episodes, one pass, benchmarks/quick.py's tiny run
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

import polyturn  # noqa: F401
from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.train.batch import length_batches, make_token_batch, micro_batches
from polyturn.train.trainer import Trainer


def padding_share(lengths: list[int], batches: list[list[int]]) -> float:
    """Pad positions over all positions when each minibatch is padded to its longest member."""
    real = sum(lengths[i] for b in batches for i in b)
    total = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - real / total


def random_batches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(n))
    rng.shuffle(order)
    return [order[k : k + size] for k in range(0, n, size)]


def bare_loop(trainer: Trainer, episodes, batches: list[list[int]], budget: int | None) -> tuple[float, int]:
    """Forward (full logits) + NLL of action tokens + backward per micro-batch, AdamW step per minibatch."""
    actor = trainer.actor
    opt = torch.optim.AdamW(actor.trainable_parameters(), lr=1e-6)
    actor.model.train()
    tokens, t0 = 0, time.perf_counter()
    for mb in batches:
        opt.zero_grad(set_to_none=True)
        n_act = sum(sum(s.action_mask[1:]) for i in mb for s in episodes[i].segments)
        for micro in micro_batches([[len(s) for s in episodes[i].segments] for i in mb], budget):
            eps = [episodes[mb[j]] for j in micro]
            batch = make_token_batch([(j, s) for j, ep in enumerate(eps) for s in ep.segments], pad_id=actor.pad_id)
            logits = actor.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
            (-(lp * batch.action_mask).sum() / n_act).backward()
            tokens += int(batch.attention_mask.sum())
        opt.step()
    return time.perf_counter() - t0, tokens


def _budget(text: str) -> int | None:
    return None if text.lower() in ("none", "null") else int(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a run's ckpt-* directory (its demos.jsonl is one level up)")
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="passes of each side, interleaved")
    p.add_argument("--budgets", default=None,
                   help="comma-separated actor.microbatch_tokens to time (none = whole minibatch); "
                        "default: none and the config's")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the updates (default: run.train_threads)")
    p.add_argument("--quick", action="store_true",
                   help="16 episodes, one pass, on the BC checkpoint of benchmarks/quick.py's tiny run: that it runs")
    args = p.parse_args()
    if args.quick:
        from quick import TINY_CONFIG, tiny_run

        args.checkpoint = args.checkpoint or str(tiny_run() / "ckpt-bc")
        args.config, args.episodes, args.repeats = str(TINY_CONFIG), 16, 1
    if not args.checkpoint:
        p.error("Expected --checkpoint DIR (or --quick)")
    _quiet_libraries()
    ckpt = Path(args.checkpoint)
    demos = ckpt.parent / "demos.jsonl"
    out = tempfile.mkdtemp(prefix="polyturn-bench-update-")
    cfg = load_config(args.config, [f"actor.init_from={ckpt}", f"bc.demos={demos}", f"run.out_dir={out}",
                                    "run.tensorboard=false", "ppo.epochs=1", "ppo.target_kl=null"])
    budgets = ([_budget(b) for b in args.budgets.split(",")] if args.budgets
               else [None, cfg.actor.microbatch_tokens])
    trainer = Trainer(cfg)
    torch.set_num_threads(cfg.run.rollout_threads)
    trainer.actor.model.eval()
    tasks = [{"seed": 3_000_000 + k, "options": {}} for k in range(args.episodes)]
    episodes = trainer.collector.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(0))
    threads = args.threads or cfg.run.train_threads
    torch.set_num_threads(threads)
    n_turns = max(len(ep.turns) for ep in episodes)
    adv = torch.randn(len(episodes), n_turns, generator=torch.Generator().manual_seed(0))
    zeros = torch.zeros(len(episodes), n_turns)
    size = cfg.ppo.minibatch_episodes
    rng = random.Random(0)
    seg_len = [sum(len(s) for s in ep.segments) for ep in episodes]

    # name -> [seconds, tokens, padding reported]
    rows: dict[str, list[float]] = {}

    def add(name: str, s: float, n: int, pad: float | None = None) -> None:
        r = rows.setdefault(name, [0.0, 0, 0.0])
        r[0] += s
        r[1] += n
        r[2] = pad if pad is not None else r[2]

    learner = trainer.critic
    critic_budgets = [None, cfg.critic.microbatch_tokens] if cfg.critic.kind == "separate" else []
    if cfg.critic.target != "gae":
        critic_budgets = []
    crit: dict[int | None, list[float]] = {}  # budget -> [seconds, padding reported]
    for _ in range(args.repeats):
        for budget in critic_budgets:
            learner.cfg.microbatch_tokens = budget
            t0 = time.perf_counter()
            cm = learner.update(episodes, zeros, zeros, gamma=0.99)
            crit.setdefault(budget, [0.0, 0.0])[0] += time.perf_counter() - t0
            crit[budget][1] = cm["perf/critic_padding"]
        batches = random_batches(len(episodes), size, rng)  # the bare loop's; the trainer shuffles its own
        for budget in budgets:
            tag = "whole minibatch" if budget is None else f"micro-batches <= {budget} tokens"
            trainer.cfg.actor.microbatch_tokens = budget
            t0 = time.perf_counter()
            m = trainer.policy.update_actor(trainer.algo, episodes, adv, zeros, zeros, temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0)
            add(f"Policy.update_actor (PPO-clip), {tag}", time.perf_counter() - t0, sum(seg_len),
                m["perf/actor_padding"])
            s, n = bare_loop(trainer, episodes, batches, budget)
            add(f"bare forward+backward+step (full logits), {tag}", s, n)

    states = sum(len(ep.turns) for ep in episodes)
    print(f"\n{ckpt}: {len(episodes)} episodes, {sum(seg_len)} tokens, {states} turn states; PPO minibatch {size} "
          f"episodes, threads {threads}, {args.repeats} interleaved passes each")
    base = rows["bare forward+backward+step (full logits), whole minibatch"] if None in budgets else None
    print("| update | tokens/s | share of bare loop (whole) | share of bare loop (same micro-batches) "
          "| padding run |")
    print("|---|---|---|---|---|")
    for name, (s, n, pad) in sorted(rows.items(), key=lambda kv: kv[0].startswith("Trainer")):
        rate = n / s
        whole = f"{rate / (base[1] / base[0]):.0%}" if base else "-"
        same = "-"
        if name.startswith("Trainer"):
            twin = rows["bare forward+backward+step (full logits), " + name.split("), ", 1)[1]]
            same = f"{rate / (twin[1] / twin[0]):.0%}"
        print(f"| {name} | {rate:.0f} | {whole} | {same} | {f'{pad:.1%}' if name.startswith('Trainer') else '-'} |")

    print("\n| batches | padding, random minibatches | padding, length-bucketed | padding, as the update runs them |")
    print("|---|---|---|---|")
    r = [padding_share(seg_len, random_batches(len(seg_len), size, random.Random(k))) for k in range(20)]
    b = [padding_share(seg_len, length_batches(seg_len, size, random.Random(k))) for k in range(20)]
    ran = {k.split("), ", 1)[1]: v[2] for k, v in rows.items() if k.startswith("Trainer")}
    ran_s = "; ".join(f"{v:.1%} ({k})" for k, v in ran.items())
    print(f"| PPO ({size} episodes) | {sum(r) / len(r):.1%} | {sum(b) / len(b):.1%} | {ran_s} |")
    if critic_budgets:
        from polyturn.train.critics import state_input

        enc = learner.critic.encode([state_input(ep, t) for ep in episodes for t in range(len(ep.turns))])
        crit_len = enc["attention_mask"].sum(1).tolist()
        mb = cfg.critic.minibatch
        r = [padding_share(crit_len, random_batches(len(crit_len), mb, random.Random(k))) for k in range(20)]
        b = [padding_share(crit_len, length_batches(crit_len, mb, random.Random(k))) for k in range(20)]
        ran_c = []
        for budget, (sec, pad) in crit.items():
            tag = "bucketed, whole" if budget is None else f"bucketed, micro-batches <= {budget} tokens"
            ran_c.append(f"{pad:.1%} ({tag}; {states * args.repeats / sec:.0f} states/s)")
        print(f"| critic ({mb} states) | {sum(r) / len(r):.1%} | {sum(b) / len(b):.1%} | {'; '.join(ran_c)} |")


if __name__ == "__main__":
    main()
