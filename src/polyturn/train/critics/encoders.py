"""The critic models a learner trains: a text encoder with value (and Q) heads, or a small causal LM."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from polyturn.config import TrainConfig
from polyturn.models.actor import Actor, build_tiny_model, load_base
from polyturn.models.causal_critic import CausalCritic, CausalCriticConfig
from polyturn.models.critic import SeparateCritic, build_separate_critic
from polyturn.models.critic_text import CRITIC_MARKERS
from polyturn.models.tokenizer import train_tokenizer
from polyturn.train.setup import corpus


def encoder_critic(cfg: TrainConfig, demos: Sequence[dict], feature_names: Sequence[str] | None) -> SeparateCritic:
    """``critic.encoder`` scratch (a BERT whose tokenizer is trained on the demonstrations' text, privileged text
    included) or minilm, with a value head (and a Q head with ``critic.q`` or ``critic.kind: action``)."""
    c = cfg.critic
    tok = None
    if c.encoder == "scratch":
        # Phrase BPE for the same reason as the actor's: ~4x fewer tokens per state on environment text.
        tok = train_tokenizer(corpus(list(demos), privileged=True), vocab_size=2048, special_tokens=CRITIC_MARKERS,
                              split_words=False, max_token_length=24)
    critic = build_separate_critic(
        encoder=c.encoder,
        tokenizer=tok,
        hidden=c.hidden,
        layers=c.layers,
        heads=c.heads,
        max_len=c.max_len,
        feature_names=list(feature_names) if c.features and feature_names is not None else None,
        q=c.q or c.kind == "action",
        include_privileged=c.privileged,
        freeze_encoder_layers=c.freeze_encoder_layers,
    )
    if c.gradient_checkpointing:
        critic.encoder.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return critic


def causal_critic(cfg: TrainConfig, actor: Actor) -> CausalCritic:
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
