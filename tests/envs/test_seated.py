"""A multi-role env seen from one seat (SeatedEnv): the single-agent game when the partner is scripted, in either
seat."""

from __future__ import annotations

import numpy as np
import pytest

from polyturn.acting.registry import make_env
from polyturn.envs.multi_agent import SeatedEnv
from polyturn.envs.negotiation.game import STRATEGIES, generate_scenario
from polyturn.envs.negotiation.players import ScriptedNegotiator

NEG = "polyturn/Negotiation-v0"


def _actions(rng, n):
    out = []
    for _ in range(n):
        k = rng.random()
        if k < 0.1:
            out.append("Action: accept[{}]")
        elif k < 0.2:
            out.append("Action: reject[{}]")
        elif k < 0.25:
            out.append("not an action")
        else:
            split = {i: int(rng.integers(0, 4)) for i in ("book", "hat", "ball")}
            out.append(f"Action: propose[{{\"book\": {split['book']}, \"hat\": {split['hat']}, \"ball\": {split['ball']}}}]")
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_first_seat_against_a_scripted_partner_is_the_single_agent_game(seed):
    single = make_env(NEG).unwrapped
    strategy = generate_scenario(seed).strategy
    seated = SeatedEnv(make_env(NEG, {"opponent": "self"}), role="first",
                       partners={"second": lambda: ScriptedNegotiator(strategy)})
    a = single.reset(seed=seed)
    b = seated.reset(seed=seed)
    assert a[0] == b[0]
    for action in _actions(np.random.default_rng(seed), 12):
        ra, rb = single.step(action), seated.step(action)
        assert ra[0] == rb[0] and ra[1] == pytest.approx(rb[1]) and ra[2:4] == rb[2:4]
        assert bool(ra[4].get("success")) == bool(rb[4].get("success")) and ra[4]["action_valid"] == rb[4]["action_valid"]
        assert rb[4]["reward_terms"] == pytest.approx({k: v for k, v in ra[4]["reward_terms"].items()})
        if ra[2] or ra[3]:
            break


def test_the_second_seat_reads_the_first_offer_and_gets_its_own_utility():
    for strategy in STRATEGIES:
        env = SeatedEnv(make_env(NEG, {"opponent": "self"}), role="second",
                        partners={"first": lambda s=strategy: ScriptedNegotiator(s)})
        obs, info = env.reset(seed=5)
        assert "They make the first offer" in obs and "They propose: you get" in obs
        assert info["privileged"].startswith("Opponent values:") and "propose" in env.tool_docs()
        _, reward, terminated, truncated, info = env.step("Action: accept[{}]")
        assert terminated and not truncated and info["deal"]["deal"]
        assert reward == pytest.approx(info["deal"]["worth"]["second"] + info["reward_terms"].get("process/well_formed", 0)
                                       + sum(v for k, v in info["reward_terms"].items()
                                             if k not in ("outcome/utility", "process/well_formed")))


def test_seats_and_partners_are_checked():
    env = make_env(NEG, {"opponent": "self"})
    with pytest.raises(ValueError, match="role among"):
        SeatedEnv(env, role="third", partners={})
    with pytest.raises(ValueError, match="partner for each other role"):
        SeatedEnv(env, role="first", partners={})

