"""Update speed and padding, side by side in one run.

1. PPO-update tokens/s: :meth:`Trainer.update_actor` (token-level PPO-clip,
   logits only at action tokens) against a bare loop over the same minibatches
   (forward with full logits, log-likelihood of the action tokens, backward,
   AdamW step). Tokens are real (non-pad) tokens of the minibatches.
2. Padding: the share of pad positions in PPO minibatches (episodes' token
   segments) and critic minibatches (turn states as critic text), drawn at
   random as the trainer does, and with length bucketing (sort windows of
   8 minibatches by length, then shuffle the minibatches).

Run by hand, on the episodes a checkpoint collects (64 at temperature 1)::

    .venv/bin/python benchmarks/update.py --checkpoint runs/demo/<ts>/ckpt-final
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
from polyturn.train.batch import make_token_batch
from polyturn.train.critics import state_input
from polyturn.train.trainer import Trainer, length_batches


def padding_share(lengths: list[int], batches: list[list[int]]) -> float:
    """Pad positions over all positions when each minibatch is padded to its longest member."""
    real = sum(lengths[i] for b in batches for i in b)
    total = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - real / total


def random_batches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(n))
    rng.shuffle(order)
    return [order[k : k + size] for k in range(0, n, size)]


def bare_loop(trainer: Trainer, episodes, batches: list[list[int]]) -> tuple[float, int]:
    """Forward (full logits) + NLL of action tokens + backward + AdamW step per minibatch; (seconds, tokens)."""
    actor = trainer.actor
    opt = torch.optim.AdamW(actor.trainable_parameters(), lr=1e-6)
    actor.model.train()
    tokens, t0 = 0, time.perf_counter()
    for mb in batches:
        batch = make_token_batch([(j, s) for j, i in enumerate(mb) for s in episodes[i].segments], pad_id=actor.pad_id)
        logits = actor.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        loss = -(lp * batch.action_mask).sum() / batch.action_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        tokens += int(batch.attention_mask.sum())
    return time.perf_counter() - t0, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a run's ckpt-* directory (its demos.jsonl is one level up)")
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="passes of each side, interleaved")
    args = p.parse_args()
    _quiet_libraries()
    ckpt = Path(args.checkpoint)
    demos = ckpt.parent / "demos.jsonl"
    out = tempfile.mkdtemp(prefix="polyturn-bench-update-")
    cfg = load_config(args.config, [f"actor.init_from={ckpt}", f"bc.demos={demos}", f"run.out_dir={out}",
                                    "run.tensorboard=false", "ppo.epochs=1", "ppo.target_kl=null"])
    trainer = Trainer(cfg)
    torch.set_num_threads(cfg.run.rollout_threads)
    trainer.actor.model.eval()
    tasks = [{"seed": 3_000_000 + k, "options": {}} for k in range(args.episodes)]
    episodes = trainer.collector.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(0))
    torch.set_num_threads(cfg.run.train_threads)
    n_turns = max(len(ep.turns) for ep in episodes)
    adv = torch.randn(len(episodes), n_turns)
    zeros = torch.zeros(len(episodes), n_turns)
    size = cfg.ppo.minibatch_episodes
    rng = random.Random(0)
    seg_len = [sum(len(s) for s in ep.segments) for ep in episodes]

    ppo_s = bare_s = 0.0
    ppo_tok = bare_tok = 0
    for _ in range(args.repeats):
        # The trainer shuffles its own minibatches; the bare loop gets random ones of the same size.
        t0 = time.perf_counter()
        trainer.update_actor(episodes, adv, zeros, zeros, temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0)
        ppo_s += time.perf_counter() - t0
        ppo_tok += sum(seg_len)
        s, n = bare_loop(trainer, episodes, random_batches(len(episodes), size, rng))
        bare_s += s
        bare_tok += n

    crit_items = [state_input(ep, t) for ep in episodes for t in range(len(ep.turns))]
    crit_len = [int(trainer.critic.critic.encode([x])["attention_mask"].sum()) for x in crit_items] \
        if hasattr(trainer.critic, "critic") else []
    print(f"\n{ckpt}: {len(episodes)} episodes, {sum(seg_len)} tokens, PPO minibatch {size} episodes, "
          f"threads {cfg.run.train_threads}, {args.repeats} interleaved passes each")
    print("| update | tokens/s | share of bare loop |")
    print("|---|---|---|")
    print(f"| bare forward+backward+step (full logits) | {bare_tok / bare_s:.0f} | 100% |")
    print(f"| Trainer.update_actor (PPO-clip, logits at action tokens) | {ppo_tok / ppo_s:.0f} "
          f"| {(ppo_tok / ppo_s) / (bare_tok / bare_s):.0%} |")
    print("\n| batches | padding, random minibatches | padding, length-bucketed |")
    print("|---|---|---|")
    r = [padding_share(seg_len, random_batches(len(seg_len), size, random.Random(k))) for k in range(20)]
    b = [padding_share(seg_len, length_batches(seg_len, size, random.Random(k))) for k in range(20)]
    print(f"| PPO ({size} episodes) | {sum(r) / len(r):.1%} | {sum(b) / len(b):.1%} |")
    if crit_len:
        mb = cfg.critic.minibatch
        r = [padding_share(crit_len, random_batches(len(crit_len), mb, random.Random(k))) for k in range(20)]
        b = [padding_share(crit_len, length_batches(crit_len, mb, random.Random(k))) for k in range(20)]
        print(f"| critic ({mb} states) | {sum(r) / len(r):.1%} | {sum(b) / len(b):.1%} |")


if __name__ == "__main__":
    main()
