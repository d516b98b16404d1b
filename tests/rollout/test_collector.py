"""Batched multi-turn collection: token-in/token-out, the context policy, exploration."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from polyturn.rollout.collector import Collector
from polyturn.rollout.context import Conversation, RolloutSettings, demo_segments
from polyturn.train.batch import actor_logprobs, make_token_batch


def _envs(n):
    return [gym.make("polyturn/SQLAnalyst-v0", disable_env_checker=True).unwrapped for _ in range(n)]


def _actor(tok):
    from polyturn.models.actor import tiny_actor

    return tiny_actor(tok, hidden=32, layers=2, heads=4, seed=1)


def test_token_in_token_out(tiny_tokenizer):
    actor = _actor(tiny_tokenizer)
    settings = RolloutSettings(max_action_tokens=24, context_budget=4096)
    col = Collector(actor, _envs(3), env_id="polyturn/SQLAnalyst-v0", settings=settings)
    eps = col.collect([{"seed": s} for s in range(5)], temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert [ep.seed for ep in eps] == list(range(5))
    for ep in eps:
        # The step's cost terms are copied from its info, beside the reward terms.
        assert all(t.cost_terms == t.info["cost_terms"] and set(t.cost_terms) == {"cost/sandbox"} for t in ep.turns)
        assert len(ep.segments) == 1  # no context overflow: one append-only sequence
        seg = ep.segments[0]
        sampled = [tok for tok, m in zip(seg.ids, seg.action_mask) if m]
        # The ids trained on are exactly the ids sampled, turn by turn, never re-tokenized.
        assert sampled == [i for t in ep.turns for i in t.action_ids]
        for t, turn in enumerate(ep.turns):
            ids_t = [tok for tok, ti in zip(seg.ids, seg.turn_index) if ti == t]
            assert ids_t == turn.action_ids
            assert actor.tokenizer.decode(turn.action_ids[:-1] if not turn.hit_cap else turn.action_ids) == turn.action
    # Behaviour log-probs equal the training forward's log-probs on the stored ids.
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=actor.pad_id)
    with torch.no_grad():
        logp = actor_logprobs(actor, batch, temperature=1.0)
    m = batch.action_mask.bool()
    assert torch.allclose(logp[m], batch.old_logprobs[m], atol=1e-4)


def test_context_policy_rebuilds_and_keeps_notes(tiny_tokenizer):
    actor = _actor(tiny_tokenizer)
    settings = RolloutSettings(max_action_tokens=16, context_budget=160, keep_last_turns=2)
    conv = Conversation(actor, settings, task="Find the top product.", system=None)
    for t in range(6):
        if conv.needs_rebuild():
            conv.rebuild()
        text = 'Action: remember[{"note": "zone is East China"}]' if t == 0 else "Action: list_tables[{}]"
        ids = actor.encode(text) + [actor.stop_id]
        conv.add_action(ids, [0.0] * len(ids), turn=t, text=text)
        conv.add_observation("Tables: orders, products, regions " * 2, close_action=False)
    assert len(conv.segments) > 1
    last = actor.tokenizer.decode(conv.segments[-1].ids)
    assert "Find the top product." in last and "zone is East China" in last
    # Every action was written inside the budget (the observation after it may overflow; the next turn rebuilds).
    for s in conv.segments:
        assert max(i for i, m in enumerate(s.action_mask) if m) < settings.context_budget
    # Each new segment holds only the newest turns (at most keep_last_turns) as context.
    assert last.count("list_tables") <= settings.keep_last_turns + 1


def test_collector_across_rebuilds_keeps_logprobs_exact(tiny_tokenizer):
    actor = _actor(tiny_tokenizer)
    settings = RolloutSettings(max_action_tokens=24, context_budget=200, keep_last_turns=2)
    col = Collector(actor, _envs(2), env_id="polyturn/SQLAnalyst-v0", settings=settings)
    eps = col.collect([{"seed": s} for s in range(3)], temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert any(len(ep.segments) > 1 for ep in eps)
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=actor.pad_id)
    with torch.no_grad():
        logp = actor_logprobs(actor, batch, temperature=1.0)
    m = batch.action_mask.bool()
    assert torch.allclose(logp[m], batch.old_logprobs[m], atol=1e-4)
    for ep in eps:  # every action token of every turn is in exactly one segment
        n = sum(sum(s.action_mask) for s in ep.segments)
        assert n == sum(len(t.action_ids) for t in ep.turns)


def test_epsilon_forces_valid_actions(tiny_tokenizer):
    actor = _actor(tiny_tokenizer)
    col = Collector(actor, _envs(2), env_id="polyturn/SQLAnalyst-v0", settings=RolloutSettings(max_action_tokens=64))
    eps = col.collect([{"seed": s, "options": {"max_turns": 3}} for s in range(2)], temperature=1.0,
                      epsilon=1.0, rng=np.random.default_rng(0), generator=torch.Generator().manual_seed(0))
    turns = [t for ep in eps for t in ep.turns]
    assert turns and all(t.forced for t in turns)
    assert all(t.info["action_valid"] for t in turns)


def test_demo_segments_mask_only_actions(tiny_tokenizer):
    actor = _actor(tiny_tokenizer)
    rec = {"question": "q", "turns": [
        {"observation": "Which product?", "action": "Action: list_tables[{}]"},
        {"observation": "Tables: sales", "action": 'Action: submit_answer[{"answer": "Rice"}]'},
    ]}
    (seg,) = demo_segments(actor, RolloutSettings(), rec)
    acted = [i for i, m in zip(seg.ids, seg.action_mask) if m]
    expect = actor.encode("Action: list_tables[{}]") + [actor.stop_id] + actor.encode('Action: submit_answer[{"answer": "Rice"}]') + [actor.stop_id]
    assert acted == expect
    assert "Tables: sales" in actor.tokenizer.decode(seg.ids)


def test_env_threads_and_cache_reuse_do_not_change_episodes(tiny_tokenizer):
    """Stepping envs in threads while other rows decode, or re-encoding every turn, plays the same episodes."""
    actor = _actor(tiny_tokenizer)
    settings = RolloutSettings(max_action_tokens=12, context_budget=4096)
    runs = []
    for kwargs in ({}, {"env_threads": 3}, {"reuse_cache": False}):
        col = Collector(actor, _envs(4), env_id="polyturn/SQLAnalyst-v0", settings=settings, **kwargs)
        eps = col.collect([{"seed": s} for s in range(6)], temperature=1.0, generator=torch.Generator().manual_seed(0))
        runs.append([[(t.action_ids, t.reward, t.terminated) for t in ep.turns] for ep in eps])
    assert runs[0] == runs[1]
    # Re-encoding runs the same math in other shapes: ids may differ only through float rounding of logits.
    assert sum(a == b for a, b in zip(runs[0], runs[2])) >= 5
