"""Fixtures of the trainer tests: demonstrations made once, the tiny test config, a local pretrained model."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyturn.config import TrainConfig, load_config

CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"


@pytest.fixture(scope="session")
def demos(tmp_path_factory) -> Path:
    """16 noisy-expert demonstrations, generated once for the session."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    path = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    write_jsonl(path, generate_demos("polyturn/SQLAnalyst-v0", episodes=16, noise=0.3, seed=0))
    return path


def tiny_cfg(out: Path, demos: Path, *extra: str) -> TrainConfig:
    """configs/test_tiny.yaml writing to ``out``, reading ``demos``, with ``--set`` style overrides."""
    return load_config(CFG, [f"run.out_dir={out}", f"bc.demos={demos}", *extra])


def stopped_copy(straight: Path, copy: Path, *, at: str, later: tuple[str, ...]) -> None:
    """``copy``: finished run ``straight`` as it stood when stopped right after writing checkpoint ``at`` (the
    ``later`` checkpoints removed), ready for ``Trainer(..., resume=True)``."""
    import shutil

    shutil.copytree(straight, copy)
    (copy / "latest").write_text(at)
    for d in later:
        shutil.rmtree(copy / d)


def assert_same_weights(a: Path, b: Path, parts: tuple[str, ...] = ("critic",)) -> None:
    """Checkpoints ``a`` and ``b`` hold the same actor and critic (``parts``) weights, bit for bit."""
    import torch
    from transformers import AutoModelForCausalLM

    from polyturn.models.critic import SeparateCritic

    wa = AutoModelForCausalLM.from_pretrained(a / "actor").state_dict()
    for k, v in AutoModelForCausalLM.from_pretrained(b / "actor").state_dict().items():
        assert torch.equal(v, wa[k]), k
    for part in parts:
        ca = SeparateCritic.from_pretrained(a / part).state_dict()
        assert all(torch.equal(v, ca[k]) for k, v in SeparateCritic.from_pretrained(b / part).state_dict().items()), part


@pytest.fixture(scope="session")
def make_cfg(demos):
    """``make_cfg(out_dir, *overrides)``: the tiny test config on the session's demonstrations."""
    return lambda out, *extra: tiny_cfg(out, demos, *extra)


@pytest.fixture(scope="session")
def local_model(tmp_path_factory, demos) -> Path:
    """A small random Llama saved with ``save_pretrained`` as a plain local HF directory (``actor.preset: local``).

    Its tokenizer is trained on the demonstrations' text, so BC and rollouts read real tokens. Grouped-query
    attention (2 key/value heads for 4 query heads), as most pretrained models have.
    """
    import gymnasium as gym

    from polyturn.acting.jsonl import read_jsonl
    from polyturn.models.actor import ACTOR_META
    from polyturn.train.setup import build_actor

    d = tmp_path_factory.mktemp("local_llama")
    cfg = tiny_cfg(d / "unused", demos, "actor.kv_heads=2")
    env = gym.make("polyturn/SQLAnalyst-v0").unwrapped
    actor = build_actor(cfg, read_jsonl(demos), env.tool_docs())
    assert actor.model.config.num_key_value_heads == 2
    actor.save_pretrained(d)
    (d / ACTOR_META).unlink()  # a plain HF directory, as a user's local model would be
    return d


def _episode(actor, *, n_turns: int, end: str):
    """An episode played through the rollout's own context code; ``end`` in success | turn_limit | cut."""
    from polyturn.rollout.context import Conversation, RolloutSettings
    from polyturn.rollout.types import Episode, Turn

    conv = Conversation(actor, RolloutSettings(context_budget=4096), task="Which product sold most?", system=None)
    ep = Episode(env_id="e", seed=0, task_id="t", question="Which product sold most?", level=1, ambiguous=False,
                 key_actions=[])
    ep.segments = conv.segments
    for t in range(n_turns):
        last = t == n_turns - 1
        text = "Action: list_tables[{}]"
        ids = actor.encode(text) + [actor.stop_id]
        conv.add_action(ids, [0.0] * len(ids), turn=t, text=text)
        turns_left = float(n_turns - t - 1) + (2.0 if end == "cut" else 0.0)
        ep.turns.append(Turn(observation=f"obs {t}", action=text, action_ids=ids, logprobs=[0.0] * len(ids),
                             reward=-5.0 if last and end != "success" else (10.0 if last else -0.01),
                             reward_terms={}, terminated=last and end == "success",
                             truncated=last and end != "success",
                             info={"success": True} if last and end == "success" else {}, privileged="p",
                             features={"turns_left": turns_left + 1.0}))
        if not last:
            conv.add_observation(f"Tables: sales {t}", close_action=False)
        else:
            ep.final_observation = "Tables: sales (end)"
            ep.final_features = {"turns_left": turns_left}
            if end != "success":  # the collector appends the state after a truncated last turn
                conv.add_observation(ep.final_observation, close_action=False)
    return ep


@pytest.fixture(scope="session")
def make_episodes():
    """``make_episodes(actor)``: 2-3 turn episodes ending in success, at the turn limit, and cut with turns left."""
    return lambda actor: [_episode(actor, n_turns=2, end="success"), _episode(actor, n_turns=3, end="turn_limit"),
                          _episode(actor, n_turns=2, end="cut")]
