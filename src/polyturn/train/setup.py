"""Building a run's parts from its config: demonstrations, the actor and its tokenizer, environments (the critic:
:func:`polyturn.train.critics.build_critic`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from polyturn.acting.episodes import generate_demos
from polyturn.acting.hierarchy import hierarchical_demos, make_hierarchical
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.acting.registry import make_env
from polyturn.envs.multi_agent import is_multi_agent
from polyturn.config import TrainConfig
from polyturn.models.actor import Actor, load_actor, pretrained_actor, tiny_actor
from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
from polyturn.models.tokenizer import train_tokenizer
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.vllm_engine import VLLMEngine
from polyturn.train.state import AGENT


def make_envs(cfg: TrainConfig, n: int) -> list[gym.Env]:
    """``n`` independent environments (no gymnasium wrappers that would alter text I/O)."""
    try:
        if cfg.hierarchy is not None:  # a manager and a worker over the env (polyturn.train.hierarchy)
            return [make_hierarchical(cfg.env.id, cfg.env.kwargs, cfg.hierarchy) for _ in range(n)]
        return [make_env(cfg.env.id, cfg.env.kwargs).unwrapped for _ in range(n)]
    except ValueError as e:
        raise ValueError(f"env.id / env.kwargs: {e}") from None


def load_or_make_demos(cfg: TrainConfig, out_dir: Path, progress: Callable[[int], None] | None = None) -> list[dict]:
    """The BC demonstrations: ``bc.demos`` if given, else generated once with the noisy expert into the run dir.

    Demonstrations use training seeds from ``train_seed_start`` (``bc.episodes`` of them, more with
    ``bc.group_shares``); RL tasks continue after them (:func:`first_rl_seed`), and held-out seeds start at
    ``eval_seed_start``.
    """
    if cfg.bc.demos:
        path = Path(cfg.bc.demos)
        if not path.is_file():
            raise FileNotFoundError(
                f"bc.demos = {cfg.bc.demos!r} does not exist; create it with `polyturn demos --out {cfg.bc.demos}` "
                "or remove bc.demos to generate demonstrations automatically"
            )
        return read_jsonl(path)
    path = out_dir / "demos.jsonl"
    if path.is_file():
        return read_jsonl(path)
    if cfg.hierarchy is not None:  # the expert cut into subgoals: a manager's record and a worker's per task
        records = list(hierarchical_demos(cfg.env.id, episodes=cfg.bc.episodes, noise=cfg.bc.noise,
                                          seed=cfg.env.train_seed_start, k=cfg.hierarchy.k, mode=cfg.hierarchy.mode,
                                          env_kwargs=cfg.env.kwargs,
                                          expert_options=cfg.bc.expert_options, progress=progress))
        write_jsonl(path, records)
        return records
    records = list(
        generate_demos(
            cfg.env.id,
            episodes=cfg.bc.episodes,
            noise=cfg.bc.noise,
            seed=cfg.env.train_seed_start,
            env_kwargs=cfg.env.kwargs,
            progress=progress,
            expert_options=cfg.bc.expert_options,
            balance_by=cfg.bc.balance_by,
            group_shares=cfg.bc.group_shares,
        )
    )
    write_jsonl(path, records)
    return records


def first_rl_seed(cfg: TrainConfig, demos: list[dict]) -> int:
    """The first training seed RL draws: past ``bc.episodes`` seeds and past every demonstration's own training
    seed (below ``eval_seed_start``)."""
    seeds = [r["seed"] for r in demos if isinstance(r.get("seed"), int) and r["seed"] < cfg.env.eval_seed_start]
    return max([cfg.env.train_seed_start + cfg.bc.episodes, *(s + 1 for s in seeds)])


def corpus(demos: list[dict], *, privileged: bool) -> list[str]:
    """Text a tokenizer is trained on: every observation and action (and the privileged text for the critic)."""
    out = []
    for rec in demos:
        for t in rec["turns"]:
            out.append(t["observation"])
            out.append(t["action"])
            if privileged:
                out.append(t.get("info", {}).get("privileged", ""))
        out.append(rec.get("final_observation", ""))
        if privileged:
            out.append(rec.get("privileged", ""))
    return [t for t in out if t]


def build_actor(cfg: TrainConfig, demos: list[dict], tool_docs: str) -> Actor:
    """The configured actor; the tiny preset trains its tokenizer on the demonstrations' text first."""
    a = cfg.actor
    if a.preset == "tiny":
        tok = train_tokenizer(corpus(demos, privileged=False) + [tool_docs], vocab_size=a.vocab_size,
                              special_tokens=SIMPLE_SPECIAL_TOKENS, split_words=a.tokenizer == "word",
                              max_token_length=24 if a.tokenizer == "phrase" else None)
        return tiny_actor(tok, arch=a.arch, hidden=a.hidden, layers=a.layers, heads=a.heads,
                          kv_heads=a.kv_heads,
                          max_positions=max(2048, cfg.rollout.context_budget), seed=cfg.run.seed)
    lora = a.lora.model_dump() if a.lora else None
    return pretrained_actor(a.preset, path=a.path, lora=lora)


def initial_actor(cfg: TrainConfig, demos: list[dict], tool_docs: str, *,
                  resume_from: Path | None) -> tuple[Actor, bool]:
    """The actor a run starts from, and whether it was given (``actor.init_from``: it replaces phase 1): the
    resumed checkpoint's, the given checkpoint's, or a new one (:func:`build_actor`)."""
    if resume_from is not None:
        return load_actor(resume_from / "actor"), False
    if cfg.actor.init_from:
        src = Path(cfg.actor.init_from)
        src = src / "actor" if (src / "actor").is_dir() else src
        if not src.is_dir():
            raise FileNotFoundError(f"actor.init_from = {cfg.actor.init_from!r}: no such checkpoint directory")
        return load_actor(src), True
    return build_actor(cfg, demos, tool_docs), False


def env_outline(env: gym.Env, *, seed: int) -> tuple[tuple[str, ...], list[str], str]:
    """What a run reads off its environment before building anything: its roles (``(agent,)`` for a single-agent
    env), its feature names, and the first role's tool docs (a task reset with ``seed``)."""
    env = env.unwrapped
    if is_multi_agent(env):
        roles = tuple(env.roles)
        info = env.reset(seed=seed)[roles[0]][1]
        return roles, sorted(info.get("features", {})), env.tool_docs(roles[0])
    _, info = env.reset(seed=seed)
    return (AGENT,), sorted(info.get("features", {})), env.tool_docs()


def vllm_settings(cfg: TrainConfig) -> dict[str, Any]:
    """:class:`VLLMEngine`'s settings for this run, less the actor and the directory (the learner's engine and each
    rollout worker's are made alike)."""
    r = cfg.rollout
    return dict(python=r.vllm_python, precision=cfg.run.precision,
                max_model_len=r.context_budget + r.max_action_tokens + 16, threads=cfg.run.rollout_threads)


#: Said when a LoRA actor samples through vLLM on a CPU (docs/vllm.md, measured 2026-12-06).
VLLM_LORA_ON_CPU = ("rollout.engine = vllm with a LoRA actor on a CPU: vLLM's CPU build sampled through adapters "
                    "4.5x slower than the home engine (SmolLM2, LoRA r 16, CustomerService; docs/vllm.md), so "
                    "rollout.engine=home is the faster engine on this machine")


def vllm_engine(cfg: TrainConfig, actor: Actor, out: Path,
                on_message: Callable[[str], None] = lambda text: None) -> VLLMEngine | None:
    """With ``rollout.engine = vllm``, the run's vLLM server on ``actor``'s weights, started (its files under
    ``out/vllm``); else None. ``on_message`` hears :data:`VLLM_LORA_ON_CPU` where it applies."""
    if cfg.rollout.engine != "vllm":
        return None
    if actor.is_lora and actor.runtime.device.type == "cpu":
        on_message(VLLM_LORA_ON_CPU)
    return VLLMEngine(actor, out / "vllm", **vllm_settings(cfg)).start()


def make_collectors(cfg: TrainConfig, actor: Actor, envs: list[gym.Env], settings: RolloutSettings, *,
                    scorer: Callable | None, vllm: VLLMEngine | None = None) -> tuple[Collector, Collector]:
    """The collector of held-out evaluation, and the one of training episodes: the same, or with
    ``rollout.best_of > 1`` one that plays the critic's (``scorer``) favourite of several candidate turns.
    Evaluation samples plainly, since a critic that reads privileged text cannot act at deployment. ``vllm``:
    the engine that samples (:func:`vllm_engine`)."""
    plain = Collector(actor, envs, env_id=cfg.env.id, settings=settings, env_threads=cfg.rollout.env_threads,
                      vllm=vllm)
    if cfg.rollout.best_of <= 1:
        return plain, plain
    return plain, Collector(actor, envs, env_id=cfg.env.id, settings=settings, env_threads=cfg.rollout.env_threads,
                            best_of=cfg.rollout.best_of, scorer=scorer)
