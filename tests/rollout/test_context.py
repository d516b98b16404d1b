"""BC's view of a demonstration: actions cut at the rollout's token cap are counted, never hidden."""

from __future__ import annotations

from polyturn.rollout.context import RolloutSettings, demo_segments, tokenize_demo

SHORT = "Action: list_tables[{}]"
LONG = "Thought: " + "inspect the schema first and then the sales table " * 6 + "\nAction: list_tables[{}]"


def _record(*actions: str) -> dict:
    return {"question": "q", "turns": [{"observation": f"obs {i}", "action": a} for i, a in enumerate(actions)]}


def test_cut_actions_are_counted_and_closed_at_the_cap(tiny_actor):
    cap = len(tiny_actor.encode(SHORT)) + 1  # the short action and its stop token fit exactly
    settings = RolloutSettings(max_action_tokens=cap, context_budget=4096)
    demo = tokenize_demo(tiny_actor, settings, _record(SHORT, LONG, SHORT))
    assert (demo.n_actions, demo.n_cut) == (3, 1)
    assert demo.longest_action == len(tiny_actor.encode(LONG)) + 1 > cap
    (seg,) = demo.segments
    per_turn = [[i for i, t in zip(seg.ids, seg.turn_index) if t == k] for k in range(3)]
    assert per_turn[0] == per_turn[2] == tiny_actor.encode(SHORT) + [tiny_actor.stop_id]  # not cut, one stop token
    assert len(per_turn[1]) == cap and per_turn[1][-1] == tiny_actor.stop_id
    assert per_turn[1][:-1] == tiny_actor.encode(LONG)[: cap - 1]
    assert demo_segments(tiny_actor, settings, _record(SHORT, LONG, SHORT))[0].ids == seg.ids


def test_nothing_cut_when_the_cap_holds_every_action(tiny_actor):
    settings = RolloutSettings(max_action_tokens=len(tiny_actor.encode(LONG)) + 1, context_budget=4096)
    demo = tokenize_demo(tiny_actor, settings, _record(SHORT, LONG))
    assert demo.n_cut == 0 and demo.longest_action == settings.max_action_tokens
