"""Fixtures of the trainer tests: demonstrations made once, the tiny test config, a local pretrained model."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyturn.config import TrainConfig, load_config

CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"


@pytest.fixture(scope="session")
def demos(tmp_path_factory) -> Path:
    """16 noisy-expert demonstrations, generated once for the session."""
    from polyturn.demos import generate_demos, write_jsonl

    path = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    write_jsonl(path, generate_demos("polyturn/SQLAnalyst-v0", episodes=16, noise=0.3, seed=0))
    return path


def tiny_cfg(out: Path, demos: Path, *extra: str) -> TrainConfig:
    """configs/test_tiny.yaml writing to ``out``, reading ``demos``, with ``--set`` style overrides."""
    return load_config(CFG, [f"run.out_dir={out}", f"bc.demos={demos}", *extra])


@pytest.fixture(scope="session")
def make_cfg(demos):
    """``make_cfg(out_dir, *overrides)``: the tiny test config on the session's demonstrations."""
    return lambda out, *extra: tiny_cfg(out, demos, *extra)


@pytest.fixture(scope="session")
def local_model(tmp_path_factory, demos) -> Path:
    """A small random Llama saved with ``save_pretrained`` as a plain local HF directory (``actor.preset: local``).

    Its tokenizer is trained on the demonstrations' text, so BC and rollouts read real tokens.
    """
    import gymnasium as gym

    from polyturn.demos import read_jsonl
    from polyturn.models.actor import ACTOR_META
    from polyturn.train.setup import build_actor

    d = tmp_path_factory.mktemp("local_llama")
    cfg = tiny_cfg(d / "unused", demos)
    env = gym.make("polyturn/SQLAnalyst-v0").unwrapped
    actor = build_actor(cfg, read_jsonl(demos), env.tool_docs())
    actor.save_pretrained(d)
    (d / ACTOR_META).unlink()  # a plain HF directory, as a user's local model would be
    return d
