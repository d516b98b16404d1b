"""Rollout speed, side by side in one run: the home engine against vLLM's CPU build (``rollout.engine: vllm``).

Both play the same task seeds (``--env``: SQLAnalyst, or CustomerService with its simulated customer) with
SmolLM2-135M-Instruct (system prompt on, temperature 1) through the same
:class:`~polyturn.rollout.collector.Collector`, one after the other, alternating ``--repeats`` times; the home
engine on one torch thread in this process, vLLM in its server process on ``--vllm-threads`` threads (the server's
start is timed apart). Prints environment turns/s and generated tokens/s for each run. Run by hand
(``make vllm-venv`` first; minutes)::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/vllm_rollout.py --episodes 32 --num-envs 32
    .venv/bin/python benchmarks/vllm_rollout.py --quick   # 4 tasks, 1 turn: that it runs

``--shape qwen2.5-0.5b``: random weights of Qwen2.5-0.5B's shape (896 wide, 24 layers, 14 query and 2 key/value
heads, 4864 intermediate; its architecture) around SmolLM2's tokenizer and chat format, whose 49,152-token
vocabulary stands in for Qwen's 151,936 (0.40B parameters instead of 0.49B): the speed of that shape where its
weights are not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import torch

from polyturn.config import load_config
from polyturn.models.actor import build_tiny_model, pretrained_actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.vllm_engine import VLLMEngine
from polyturn.runtime import Runtime


#: The SmolLM2 config whose LoRA section ``--lora`` applies.
LORA_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "customer_service_smollm2.yaml"
ENVS = {"sql": "polyturn/SQLAnalyst-v0", "cs": "polyturn/CustomerService-v0"}
#: Qwen2.5-0.5B's shape (its config.json), for ``--shape qwen2.5-0.5b``.
QWEN_05B = dict(arch="qwen2", hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, max_positions=32768)


def qwen_shaped(actor):
    """``actor`` (SmolLM2) with its model replaced by random weights of Qwen2.5-0.5B's shape."""
    model = build_tiny_model(actor.tokenizer, **QWEN_05B)
    model.config.eos_token_id = actor.model.config.eos_token_id  # the tiny preset's own stop token is not SmolLM2's
    model.generation_config.eos_token_id = actor.model.generation_config.eos_token_id
    return dataclasses.replace(actor, model=model, meta={**actor.meta, "shape": "qwen2.5-0.5b"})


def play(col: Collector, tasks: list[dict], seed: int) -> tuple[float, int, int]:
    """Seconds, turns and generated tokens of one collection of ``tasks``."""
    t = time.perf_counter()
    eps = col.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(seed))
    s = time.perf_counter() - t
    return s, sum(len(ep.turns) for ep in eps), sum(len(tu.action_ids) for ep in eps for tu in ep.turns)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=sorted(ENVS), default="sql")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-action-tokens", type=int, default=32)
    p.add_argument("--context-budget", type=int, default=2048)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--vllm-threads", type=int, default=1)
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    p.add_argument("--compile", action="store_true", help="let vLLM compile the model (slower start)")
    p.add_argument("--workdir", help="the served weights and the server's log (default: a temporary directory)")
    p.add_argument("--lora", action="store_true",
                   help="wrap the actor with the LoRA adapters configs/customer_service_smollm2.yaml trains (r 16 on "
                   "every projection; vLLM then samples through its adapter path)")
    p.add_argument("--shape", choices=["smollm2", "qwen2.5-0.5b"], default="smollm2",
                   help="smollm2: SmolLM2-135M-Instruct's weights; qwen2.5-0.5b: random weights of that shape")
    p.add_argument("--quick", action="store_true", help="4 tasks, 1 turn, 1 repeat")
    p.add_argument("--device", default="cpu", help="where the home engine's actor runs (cpu, cuda)")
    args = p.parse_args()
    if args.lora and args.shape != "smollm2":
        p.error("--lora needs SmolLM2's weights (vLLM serves adapters over a base model directory)")
    if args.quick:
        args.episodes, args.num_envs, args.max_turns, args.repeats = 4, 4, 1, 1
    torch.set_num_threads(1)
    lora = load_config(LORA_CONFIG).actor.lora.model_dump() if args.lora else None
    actor = pretrained_actor("smollm2-135m", lora=lora)
    if args.shape == "qwen2.5-0.5b":
        actor = qwen_shaped(actor)
    actor.to(Runtime.from_config(args.device, args.precision))
    settings = RolloutSettings(max_action_tokens=args.max_action_tokens, context_budget=args.context_budget,
                               system_prompt=True)
    env_id = ENVS[args.env]
    envs = [gym.make(env_id, disable_env_checker=True).unwrapped for _ in range(args.num_envs)]
    tasks = [{"seed": 10_000 + i, "options": {"max_turns": args.max_turns}} for i in range(args.episodes)]
    with tempfile.TemporaryDirectory() as tmp:
        engine = VLLMEngine(actor, args.workdir or tmp, python=args.vllm_python, precision=args.precision,
                            max_model_len=args.context_budget + args.max_action_tokens + 16,
                            threads=args.vllm_threads, compile=args.compile)
        with engine:
            engine.sync(actor)  # a LoRA actor's adapters (a full actor's weights are there already)
            print(f"{env_id}, {args.shape} ({sum(p.numel() for p in actor.model.parameters()) / 1e6:.0f}M "
                  f"parameters), LoRA {'r ' + str(lora['r']) if lora else 'none'}; vLLM server start: "
                  f"{engine.server.startup_s:.1f} s "
                  f"(precision {args.precision}, "
                  f"{args.vllm_threads} thread(s), compile={args.compile})")
            cols = {"home": Collector(actor, envs, env_id=env_id, settings=settings),
                    "vllm": Collector(actor, envs, env_id=env_id, settings=settings, vllm=engine)}
            play(cols["vllm"], tasks[:2], 0)  # a warm-up request (vLLM's first batch shapes)
            print("| engine | run | turns | tokens | s | turns/s | tokens/s |\n|---|---|---|---|---|---|---|")
            for r in range(args.repeats):
                for name, col in cols.items():
                    s, turns, toks = play(col, tasks, r)
                    print(f"| {name} | {r} | {turns} | {toks} | {s:.1f} | {turns / s:.2f} | {toks / s:.1f} |",
                          flush=True)
    for env in envs:
        env.close()


if __name__ == "__main__":
    main()
