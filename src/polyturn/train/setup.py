"""Building a run's parts from its config: demonstrations, tokenizers, actor, critic, environments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gymnasium as gym

from polyturn.acting.episodes import generate_demos
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.acting.registry import make_env
from polyturn.config import TrainConfig
from polyturn.models.action_critic import EncoderActionCritic
from polyturn.models.actor import Actor, build_tiny_model, load_base, pretrained_actor, tiny_actor
from polyturn.models.causal_critic import CausalCritic, CausalCriticConfig
from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
from polyturn.models.critic import build_separate_critic
from polyturn.models.critic_text import CRITIC_MARKERS
from polyturn.models.tokenizer import train_tokenizer
from polyturn.train.action_learner import ActionLearner
from polyturn.train.critics import CriticLearner, NoCritic, SeparateLearner, SharedLearner


def make_envs(cfg: TrainConfig, n: int) -> list[gym.Env]:
    """``n`` independent environments (no gymnasium wrappers that would alter text I/O)."""
    try:
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


def build_critic(cfg: TrainConfig, demos: list[dict], actor: Actor, feature_names: list[str] | None) -> CriticLearner:
    """The configured critic learner (``separate``, ``shared``, ``none`` or ``action``)."""
    c = cfg.critic
    if c.kind == "none":
        return NoCritic(group_size=c.group_size)
    if c.kind == "shared":
        return SharedLearner(actor, c)
    if c.kind == "action" and c.encoder == "causal":
        return ActionLearner(build_causal_critic(cfg, actor), c, seed=cfg.run.seed)
    tok = None
    if c.encoder == "scratch":
        # Phrase BPE for the same reason as the actor's: ~4x fewer tokens per state on environment text.
        tok = train_tokenizer(corpus(demos, privileged=True), vocab_size=2048, special_tokens=CRITIC_MARKERS,
                              split_words=False, max_token_length=24)
    critic = build_separate_critic(
        encoder=c.encoder,
        tokenizer=tok,
        hidden=c.hidden,
        layers=c.layers,
        heads=c.heads,
        max_len=c.max_len,
        feature_names=feature_names if c.features else None,
        q=c.q or c.kind == "action",
        include_privileged=c.privileged,
        freeze_encoder_layers=c.freeze_encoder_layers,
    )
    if c.gradient_checkpointing:
        critic.encoder.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if c.kind == "action":
        return ActionLearner(EncoderActionCritic(critic), c, seed=cfg.run.seed)
    return SeparateLearner(critic, c, seed=cfg.run.seed)


def build_causal_critic(cfg: TrainConfig, actor: Actor) -> CausalCritic:
    """``critic.encoder: causal``: SmolLM2 (``critic.path: smollm2-135m``), a local HF causal LM, or (null) a small
    Llama built from a config with the actor's tokenizer (a smaller model of the tiny actor's family)."""
    c = cfg.critic
    if c.path is None:
        model, tok = build_tiny_model(actor.tokenizer, arch="llama", hidden=c.hidden, layers=c.layers, heads=c.heads,
                                      max_positions=max(512, c.max_len), seed=cfg.run.seed + 1), actor.tokenizer
    elif c.path == "smollm2-135m":
        model, tok, _ = load_base("smollm2-135m")
    else:
        if not Path(c.path).is_dir():
            raise FileNotFoundError(f"critic.path = {c.path!r}: expected 'smollm2-135m' or a local HF causal-LM "
                                    "directory, got neither")
        model, tok, _ = load_base("local", c.path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    config = CausalCriticConfig(param=c.param, include_privileged=c.privileged, max_len=c.max_len,
                                freeze_layers=c.freeze_encoder_layers)
    return CausalCritic(model=model, tokenizer=tok, config=config)
