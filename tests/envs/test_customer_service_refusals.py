"""CustomerService marks the states where a forbidden request must be refused (``info["forbidden"]``), and its
spec's refusal hook writes there the very refusal the expert writes, and the forbidden write."""

from __future__ import annotations

from typing import Any

import pytest

from polyturn.acting.registry import env_spec
from polyturn.envs.actions import ToolCall, format_action, parse_action
from polyturn.envs.customer_service.customer import is_refusal
from polyturn.envs.customer_service.env import CustomerServiceEnv
from polyturn.envs.customer_service.expert import (UNFOUNDED, CustomerServiceExpert, contrast_actions,
                                                  proceed_action, refusal_actions, verdict_of, write_action)
from polyturn.envs.customer_service.goals import FORBIDDEN_CASES
from polyturn.envs.spec import load_attr

STYLES = ({}, {"explain": True}, {"explain": True, "checks": True})


def seeds_of(env: CustomerServiceEnv, case: str, *, knows: bool, n: int = 2) -> list[int]:
    """The first ``n`` seeds whose goal is ``case`` (with the order number known or not)."""
    out = []
    for seed in range(3000):
        env.reset(seed=seed)
        assert env.goal is not None
        if env.goal.case == case and env.goal.knows_order_id == knows:
            out.append(seed)
            if len(out) == n:
                return out
    raise AssertionError(f"no seeds for {case}")


def play(env: CustomerServiceEnv, expert: CustomerServiceExpert, seed: int) -> list[tuple[dict[str, Any], str]]:
    """The exact expert's episode as (the info of the state it acted in, its action) per turn."""
    obs, info = env.reset(seed=seed)
    expert.reset(obs, info)
    out = []
    done = False
    while not done:
        action = expert.act(obs, info)
        out.append((info, action))
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    return out


def test_the_spec_names_the_hook():
    assert load_attr(env_spec("polyturn/CustomerService-v0").refusals) is refusal_actions
    assert env_spec("polyturn/SQLAnalyst-v0").refusals is None


@pytest.mark.parametrize("knows", [True, False])
@pytest.mark.parametrize("case", FORBIDDEN_CASES)
def test_forbidden_states_start_where_the_expert_refuses_and_the_hook_writes_its_refusal(case, knows):
    env = CustomerServiceEnv()
    try:
        for seed in seeds_of(env, case, knows=knows):
            for style in STYLES:
                turns = play(env, CustomerServiceExpert(env, seed=0, **style), seed)
                refusal = next(t for t, (_, a) in enumerate(turns)
                               if isinstance(c := parse_action(a), ToolCall) and c.tool == "reply"
                               and is_refusal(c.args["text"]))
                marked = [t for t, (info, _) in enumerate(turns) if "forbidden" in info]
                assert marked == [refusal]  # from the order read (all details heard) until the refusal
                info, action = turns[refusal]
                pair = refusal_actions(info["forbidden"], style)
                assert pair is not None and pair[0] == action  # the expert's own refusal, in its style
                # Before the customer's yes, the step refusing replaces: saying what it will do, asking for a yes.
                verdict = verdict_of(info["forbidden"], style)
                assert info["forbidden"]["confirmed"] is False
                assert pair[1] == proceed_action(verdict, explain=bool(style.get("explain")), confirmed=False)
                ask = parse_action(pair[1])
                assert isinstance(ask, ToolCall) and ask.tool == "reply" and ask.args["text"].endswith("proceed?")
                assert env.judge()  # the expert's episode (with that refusal) succeeded
                if style.get("explain"):  # the same facts, parting at the verdict
                    k = next(k for k, (a, b) in enumerate(zip(action, pair[1])) if a != b)
                    assert action[:k].endswith("the policy ") and (action[k:k + 7], pair[1][k:k + 6]) == (
                        "forbids", "allows")
    finally:
        env.close()


def test_after_the_customers_yes_the_hooks_rejected_step_is_the_forbidden_write_and_the_backend_refuses_it():
    env = CustomerServiceEnv()
    try:
        for case in FORBIDDEN_CASES:
            seed = seeds_of(env, case, knows=True, n=1)[0]
            turns = play(env, CustomerServiceExpert(env, seed=0), seed)
            info = next(i for i, _ in turns if "forbidden" in i)
            refusal, ask = refusal_actions(info["forbidden"], {})
            # Replay the expert up to that state, then carry the request on instead of refusing.
            env.reset(seed=seed)
            for _, action in turns:
                if action == refusal:
                    break
                env.step(action)
            obs, _, _, _, info = env.step(ask)
            assert "go ahead" in obs and info["forbidden"]["confirmed"] is True  # the yes, and still forbidden
            again, write = refusal_actions(info["forbidden"], {})
            assert again == refusal and parse_action(write).tool in ("refund", "exchange", "cancel_order")
            assert write == write_action(verdict_of(info["forbidden"], {}))
            obs, _, _, _, step = env.step(write)
            assert step["cost_terms"]["cost/violation"] == 1.0 and step["error"] == "policy", case
            assert obs.startswith("Refused") and "confirmed" not in obs  # refused for what the policy forbids
            assert "forbidden" in step  # still to be refused after the write was refused
    finally:
        env.close()


# ---- contrast: the states where an allowed request is due --------------------------------------------------------------
@pytest.mark.parametrize("case", ["return", "exchange", "cancel"])
def test_allowed_states_run_from_the_experts_yes_question_to_its_write_and_the_hook_writes_both(case):
    """``info["allowed"]`` marks the states from the one where the exact expert asks for a yes (facts in hand)
    until its write: the contrast hook writes there the expert's own step (the question, then after the customer's
    yes the write) and a refusal that gives :data:`UNFOUNDED` as its reason."""
    env = CustomerServiceEnv()
    try:
        for seed in seeds_of(env, case, knows=True) + seeds_of(env, case, knows=False, n=1):
            for style in STYLES:
                turns = play(env, CustomerServiceExpert(env, seed=0, **style), seed)
                marked = [t for t, (info, _) in enumerate(turns) if "allowed" in info]
                assert len(marked) == 2 and marked[1] == marked[0] + 1, (seed, style)  # the yes question, the write
                assert not any("forbidden" in info for info, _ in turns)
                for t in marked:
                    info, action = turns[t]
                    pair = contrast_actions(info["allowed"], style)
                    assert pair is not None and pair[0] == action  # the expert's own step, in its style
                    assert info["allowed"]["confirmed"] == (t == marked[1])
                    refusal = parse_action(pair[1])
                    assert isinstance(refusal, ToolCall) and refusal.tool == "reply" and is_refusal(
                        refusal.args["text"]) and UNFOUNDED in refusal.args["text"]
                write = parse_action(turns[marked[1]][1])
                assert isinstance(write, ToolCall) and write.tool in ("refund", "exchange", "cancel_order")
                assert env.judge()
    finally:
        env.close()


def test_the_spec_names_the_contrast_hook_and_other_goals_are_never_marked():
    """``forbidden`` marks only forbidden requests, ``allowed`` only the allowed refunds, exchanges and cancellations."""
    assert load_attr(env_spec("polyturn/CustomerService-v0").contrasts) is contrast_actions
    env = CustomerServiceEnv()
    try:
        forbidden = allowed = 0
        for seed in range(40):
            turns = play(env, CustomerServiceExpert(env, seed=0), seed)
            assert env.goal is not None
            marked = {key: any(key in info for info, _ in turns) for key in ("forbidden", "allowed")}
            assert marked["forbidden"] == env.goal.forbidden, seed
            assert marked["allowed"] == (not env.goal.forbidden and env.goal.request in ("refund", "exchange",
                                                                                          "cancel")), seed
            forbidden += marked["forbidden"]
            allowed += marked["allowed"]
        assert 0 < forbidden < 40 and 0 < allowed < 40
    finally:
        env.close()
