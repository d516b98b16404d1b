"""Negotiation self-play (opponent="self"): the single-agent game is its special case, and the contract holds."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import gymnasium
import numpy as np
import pytest

from polyturn.acting.registry import env_spec, make_env
from polyturn.envs.actions import format_action
from polyturn.envs.multi_agent import MultiStep, check_multi_agent_env, is_multi_agent
from polyturn.envs.negotiation.env import NegotiationEnv
from polyturn.envs.negotiation.game import STRATEGIES, generate_scenario, rest, value_of
from polyturn.envs.negotiation.players import TRAIN_PLAYERS, ScriptedNegotiator
from polyturn.envs.negotiation.selfplay import NegotiationSelfPlayEnv
from polyturn.envs.spec import load_attr

WEIGHTS = {"process/well_formed": 0.02, "process/valid_call": 0.05, "penalty/unparseable": -0.2,
           "penalty/invalid_call": -0.1, "penalty/repeat": -0.5, "penalty/turn_cost": -0.01,
           "outcome/success": 2.0, "outcome/failure": -1.0, "outcome/timeout": -1.5}


def selfplay(**kwargs: Any) -> NegotiationSelfPlayEnv:
    return make_env("polyturn/Negotiation-v0", {"opponent": "self", **kwargs}).unwrapped


def propose(book: int, hat: int, ball: int) -> str:
    return format_action("propose", {"book": book, "hat": hat, "ball": ball})


def first_action(rng: random.Random, counts: tuple[int, ...], greedy: bool) -> str:
    """A random action for the first role: splits (greedy ones stall the game), accept, reject, walk_away,
    the text form, a message, and malformed actions (repeated ones too)."""
    kind = rng.choices(["propose", "greedy", "text", "accept", "reject", "walk_away", "bad"],
                       [2, 6, 1, 1, 3, 0.3, 2] if greedy else [8, 1, 1, 3, 3, 0.5, 2])[0]
    split = [rng.randint(0, c) for c in counts]
    if kind == "greedy":
        return propose(*counts)
    if kind == "propose":
        return format_action("propose", {"book": split[0], "hat": split[1], "ball": split[2], "message": "fair?"})
    if kind == "text":
        return format_action("propose", {"offer": "book={} hat={} ball={}".format(*split)}, "Text form.")
    if kind == "bad":
        return rng.choice(["", "no action", "Action: propose[{\"book\": 1}]", "Action: grab[{}]",
                           format_action("remember", {"note": "x"}), format_action("accept", {"now": 1}),
                           format_action("propose", {"book": 99, "hat": 0, "ball": 0})])
    return format_action(kind, {})


def play_both(strategy: str, seed: int, **kwargs: Any) -> Counter:
    """Drive the single-agent env and the self-play env (second = the scripted player) with the same first-role
    actions; assert the first role's experience is the same at every step. Returns how the game went."""
    level = STRATEGIES.index(strategy) + 1
    single = NegotiationEnv(level=level, **kwargs)
    env = selfplay(**kwargs)
    obs, info = single.reset(seed=seed)
    start = env.reset(seed=seed)
    assert start["first"][0] == obs and start["first"][1]["features"] == info["features"]
    assert env.tool_docs("first") == env.tool_docs("second") == single.tool_docs()
    player, prng = ScriptedNegotiator(strategy), random.Random(0)
    rng = random.Random(f"{strategy}-{seed}")
    greedy = rng.random() < 0.4
    seen: Counter = Counter()
    while True:
        action = first_action(rng, single.scenario.counts, greedy)
        obs, reward, terminated, truncated, info = single.step(action)
        texts, total, terms = [], 0.0, Counter()
        out = env.step(action)
        while True:
            up = out.updates["first"]
            texts += [up.observation] if up.observation is not None else []
            total += up.reward
            terms.update(up.reward_terms)
            if out.terminated or out.truncated or env.agent_selection == "first":
                break
            out = env.step(player.act(env.role_view("second"), prng))
            assert out.updates["second"].info["action_valid"]
        assert "\n".join(texts) == obs
        if kwargs.get("reward_weights"):
            assert total == pytest.approx(reward, abs=1e-9)
            assert dict(terms) == pytest.approx(info["reward_terms"], abs=1e-9)
        else:
            assert total == reward and dict(terms) == info["reward_terms"]
        assert (out.terminated, out.truncated) == (terminated, truncated)
        assert up.info["features"] == info["features"]
        seen[info["action_type"]] += 1
        if terminated or truncated:
            assert up.info["success"] == info["success"]
            a, b = up.info["deal"], info["deal"]
            assert a["worth"] == {"first": b["worth"]["agent"], "second": b["worth"]["opponent"]}
            assert {k: v for k, v in a.items() if k != "worth"} == {k: v for k, v in b.items() if k != "worth"}
            seen["truncated" if truncated else "deal" if info["features"]["deal"] else "no_deal"] += 1
            return seen


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_single_agent_game_is_self_play_against_the_scripted_player(strategy: str) -> None:
    seen: Counter = Counter()
    for seed in range(30):
        seen += play_both(strategy, seed)
    for seed in range(30, 36):
        seen += play_both(strategy, seed, max_turns=3 + seed % 4, fairness_weight=0.5, success_threshold=6,
                          reward_weights=WEIGHTS)
    # every kind of move and ending happened
    assert {"propose", "accept", "reject", "walk_away", "invalid", "deal", "truncated"} <= set(seen), seen


def test_check_multi_agent_env_passes() -> None:
    env = make_env("polyturn/Negotiation-v0", {"opponent": "self", "max_turns": 4})
    assert is_multi_agent(env) and not is_multi_agent(make_env("polyturn/Negotiation-v0"))
    for seed in range(3):
        check_multi_agent_env(env, seed=seed, steps=40)
    check_multi_agent_env(selfplay(reward_weights=WEIGHTS, fairness_weight=1.0), seed=5)


# ----- the checker catches broken envs ----------------------------------------------------------
class MissingRole(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        out.updates.pop("second")
        return out


class EarlyReward(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        if self._sides["second"].turn == 0:
            out.updates["second"].reward = 1.0
        return out


class IntTerminated(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        return MultiStep(out.updates, int(out.terminated), out.truncated)  # type: ignore[arg-type]


class StepAfterEnd(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        if self._done:
            return MultiStep({}, True, False)
        return super().step(action)


class NoSuccess(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        out.updates["second"].info.pop("success", None)
        return out


class Nondeterministic(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        out.updates["first"].info["features"]["turn_frac"] += random.random() * 1e-9
        return out


class ShiftingFeatures(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        out.updates["first"].info["features"]["extra"] = 1.0
        return out


class BadSample(NegotiationSelfPlayEnv):
    def sample_valid_action(self, rng: Any) -> str:
        return format_action("accept", {}) if self._standing is None else super().sample_valid_action(rng)


class TurnLost(NegotiationSelfPlayEnv):
    def step(self, action: str) -> MultiStep:
        out = super().step(action)
        if not out.updates[self._turn].info.get("action_valid", True):
            self._turn = self._other(self._turn)
        return out


class DuplicateRoles(NegotiationSelfPlayEnv):
    roles = ("first", "first")


@pytest.mark.parametrize(("cls", "message"), [
    (MissingRole, r"Expected an update for every role \('first', 'second'\), got \['first'\]"),
    (EarlyReward, "Expected no reward for role 'second' before its first action, got 1.0"),
    (IntTerminated, "Expected terminated as a bool, got int"),
    (StepAfterEnd, "Expected step\\(\\) after the end of a game to raise"),
    (NoSuccess, "Expected role 'second'.s info\\['success'\\] as a bool at the end, got None"),
    (Nondeterministic, "Expected the same outputs for the same seed and actions"),
    (ShiftingFeatures, "Expected role 'first'.s step features with the keys"),
    (BadSample, "Expected sample_valid_action\\(\\) to give an action the env accepts as valid, got action_valid"),
    (TurnLost, "Expected role 'first' to act again after its invalid action"),
    (DuplicateRoles, "Expected unique roles"),
])
def test_check_multi_agent_env_catches_broken_envs(cls: type, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_multi_agent_env(cls(max_turns=3), seed=1, steps=20)


# ----- rules of the two-role game ---------------------------------------------------------------
def test_factory_and_spec() -> None:
    env = make_env("polyturn/Negotiation-v0", {"opponent": "self", "max_turns": 6, "fairness_weight": 0.5})
    assert isinstance(env.unwrapped, NegotiationSelfPlayEnv) and env.unwrapped.max_turns == 6
    assert isinstance(make_env("polyturn/Negotiation-v0", {"opponent": "scripted"}).unwrapped, NegotiationEnv)
    wrapped = gymnasium.make("polyturn/Negotiation-v0", opponent="self", disable_env_checker=True)
    assert isinstance(wrapped.unwrapped, NegotiationSelfPlayEnv) and set(wrapped.reset(seed=0)) == {"first", "second"}
    assert isinstance(wrapped.step(propose(0, 0, 0)), MultiStep)  # through gymnasium's wrappers
    with pytest.raises(ValueError, match="Expected no level with opponent='self'"):
        make_env("polyturn/Negotiation-v0", {"opponent": "self", "level": 2})
    with pytest.raises(ValueError, match="Expected opponent among"):
        make_env("polyturn/Negotiation-v0", {"opponent": "tit_for_tat"})
    with pytest.raises(ValueError, match="accepts"):
        make_env("polyturn/Negotiation-v0", {"opponent": "self", "colour": "red"})
    with pytest.raises(ValueError, match="Expected no level in self-play"):
        env.reset(seed=0, options={"level": 1})
    with pytest.raises(ValueError, match="Expected reset options among"):
        env.reset(seed=0, options={"tools": ["propose"]})
    start = env.reset(options={"task_id": "neg-self-s17"})
    assert start["first"][1]["task_id"] == "neg-self-s17" and start["second"][1]["level"] == 0
    assert env.unwrapped.scenario.counts == generate_scenario(17).counts
    spec = env_spec("polyturn/Negotiation-v0")
    assert load_attr(spec.partners) is TRAIN_PLAYERS and set(TRAIN_PLAYERS) == set(STRATEGIES)
    assert set(load_attr(spec.holdout_partners)) >= {"tit_for_tat", "random_concession"}


def test_reset_gives_each_role_its_own_side() -> None:
    env = selfplay()
    start = env.reset(seed=4)
    s = env.scenario
    (obs1, info1), (obs2, info2) = start["first"], start["second"]
    assert "book={} hat={} ball={}".format(*s.agent_values) in obs1 and "They make the first offer" not in obs1
    assert "book={} hat={} ball={}".format(*s.opponent_values) in obs2 and "They make the first offer" in obs2
    assert info1["privileged"] == "Opponent values: book={} hat={} ball={}.".format(*s.opponent_values)
    assert info2["privileged"] == "Opponent values: book={} hat={} ball={}.".format(*s.agent_values)
    assert info1["task_id"] == "neg-self-s4" and info1["role"] == "first" and info2["role"] == "second"
    assert env.agent_selection == "first"


def test_second_reads_the_mirror_image_and_its_own_rewards() -> None:
    env = selfplay(fairness_weight=0.5)
    env.reset(seed=6)
    s = env.scenario
    out = env.step(propose(*s.counts))  # first asks for everything
    assert out.updates["first"].observation is None and env.agent_selection == "second"
    worth = value_of(s.opponent_values, (0, 0, 0))
    assert out.updates["second"].observation == (
        f"They propose: you get book=0 hat=0 ball=0, they get book={s.counts[0]} hat={s.counts[1]} "
        f"ball={s.counts[2]} (worth {worth} to you). 10 turns left.")
    view = env.role_view("second")
    assert view["standing"] == (0, 0, 0) and view["their_proposals"] == ((0, 0, 0),) and view["round"] == 0
    out = env.step(format_action("reject"))
    assert out.updates["first"].observation == (
        "They reject your offer (book={} hat={} ball={} for you) without a counter-offer. 9 turns left."
        .format(*s.counts))
    assert env.agent_selection == "first" and env.role_view("first")["standing"] is None
    assert "got none yet" in env.step(format_action("accept")).updates["first"].observation  # nothing standing
    out = env.step(propose(1, 0, 0))
    assert out.updates["second"].observation.startswith("You reject their proposal. They propose: you get ")
    assert out.updates["second"].observation.endswith("9 turns left.")
    out = env.step(propose(*rest(s.counts, (1, 0, 0))))  # second takes first's offer back as a counter
    assert out.updates["first"].observation.startswith("They reject your offer (book=1 hat=0 ball=0 for you). "
                                                       "They propose: you get book=1 hat=0 ball=0")
    out = env.step(format_action("accept"))
    assert out.terminated and not out.truncated
    mine, theirs = value_of(s.agent_values, (1, 0, 0)), value_of(s.opponent_values, rest(s.counts, (1, 0, 0)))
    first, second = out.updates["first"], out.updates["second"]
    assert first.observation == f"You accept. Deal: you get book=1 hat=0 ball=0 (worth {mine} to you)."
    assert second.observation == "They accept. Deal: you get book={} hat={} ball={} (worth {} to you).".format(
        *rest(s.counts, (1, 0, 0)), theirs)
    assert first.reward_terms["outcome/utility"] == mine and second.reward_terms["outcome/utility"] == theirs
    fairness = -0.5 * abs(mine - theirs)
    assert first.reward_terms["outcome/fairness"] == second.reward_terms["outcome/fairness"] == fairness
    assert first.info["success"] == (mine >= 5) and second.info["success"] == (theirs >= 5)
    assert first.info["features"]["deal"] == second.info["features"]["deal"] == 1.0
    assert second.info["features"]["deal_worth"] == theirs / 10 and "action_type" not in second.info
    with pytest.raises(RuntimeError, match="Expected reset\\(\\) before step\\(\\)"):
        env.step(propose(0, 0, 0))


def test_walking_away_before_the_other_side_acts_pays_it_nothing() -> None:
    env = selfplay(reward_weights=WEIGHTS)
    env.reset(seed=2)
    out = env.step(format_action("walk_away"))
    assert out.terminated and out.updates["first"].observation == "You walk away. No deal."
    assert out.updates["second"].observation == "They walk away. No deal."
    assert out.updates["first"].reward_terms["outcome/failure"] == -1.0
    assert out.updates["second"].reward == 0.0 and not any(out.updates["second"].reward_terms.values())
    assert out.updates["first"].info["success"] is out.updates["second"].info["success"] is False
    assert out.updates["first"].info["deal"]["deal"] is False


def test_an_invalid_action_keeps_the_turn() -> None:
    env = selfplay()
    env.reset(seed=3)
    env.step(propose(0, 0, 0))
    for bad, error in [("nonsense", "format"), (format_action("grab"), "unknown_tool"),
                       (propose(99, 0, 0), "bad_args"), ("nonsense", "repeat")]:
        out = env.step(bad)
        up = out.updates["second"]
        assert env.agent_selection == "second" and up.info["error"] == error and not up.info["action_valid"]
        assert up.observation and out.updates["first"].observation is None
    view = env.role_view("second")
    assert view["turns_left"] == 6 and view["round"] == 0
    features = out.updates["second"].info["features"]
    assert (features["n_invalid"], features["n_repeats"], features["n_errors"]) == (4.0, 1.0, 4.0)
    assert out.updates["first"].info["features"]["n_invalid"] == 0.0  # each role counts its own


def test_each_role_has_its_own_turns_and_the_game_ends_when_the_next_has_none() -> None:
    env = selfplay(max_turns=2, reward_weights=WEIGHTS)
    env.reset(seed=8)
    counts = env.scenario.counts
    env.step("bad")  # first: 1 of 2
    env.step(propose(*counts))  # first: 2 of 2; second to act, with 2 turns
    out = env.step(propose(*counts))  # second: 1 of 2; first to act, none left: truncated
    assert out.truncated and not out.terminated
    assert out.updates["first"].observation.endswith("0 turns left.\n(Turn limit of 2 reached without an answer.)")
    assert out.updates["second"].observation == "(They reached their turn limit of 2: no deal.)"
    assert out.updates["first"].reward_terms["outcome/timeout"] == -1.5
    assert out.updates["second"].reward_terms["outcome/timeout"] == -1.5
    assert out.updates["first"].info["features"]["turns_left"] == 0.0
    assert out.updates["second"].info["features"]["turns_left"] == 1.0

    env.reset(seed=8)  # the second side wastes its turns: the game ends after first's move
    env.step(propose(*counts))
    env.step("bad")
    env.step("worse")  # second: 2 of 2, an invalid action: second would act again, with none left
    assert env._done


def test_role_view_and_scripted_players_follow_the_opponent_rules() -> None:
    env = selfplay()
    env.reset(seed=11)
    s = env.scenario
    opp = s.opponent
    for strategy, make in TRAIN_PLAYERS.items():
        player = make()
        assert player.name == f"scripted-{strategy}"
        view = {"counts": s.counts, "values": s.opponent_values, "standing": None, "round": 0,
                "my_proposals": (), "their_proposals": (), "turns_left": 10}
        opponent = type(opp)(s.counts, s.opponent_values, strategy)
        for round_ in range(6):
            view["round"] = round_
            view["standing"] = None
            want = rest(s.counts, opponent.counter(round_))
            assert player.act(view, random.Random(0)) == format_action("propose", dict(zip(("book", "hat", "ball"),
                                                                                          want)))
            for split in [(0, 0, 0), s.counts, (1, 0, 1)]:
                split = tuple(min(a, c) for a, c in zip(split, s.counts))
                view["standing"] = rest(s.counts, split)  # first offers `split`: second keeps the rest
                accepted = player.act(view, random.Random(0)) == format_action("accept", {})
                assert accepted == opponent.accepts(split, round_)
    with pytest.raises(ValueError, match="Expected a strategy among"):
        ScriptedNegotiator("greedy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Expected a role among"):
        env.role_view("third")


def test_sample_valid_action_is_valid_for_either_role() -> None:
    env = selfplay(max_turns=30)
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    kinds = Counter()
    for _ in range(40):
        role, action = env.agent_selection, env.sample_valid_action(rng)
        out = env.step(action)
        assert out.updates[role].info["action_valid"], action
        kinds[out.updates[role].info["action_type"]] += 1
        if out.terminated or out.truncated:
            break
    assert kinds["propose"] and kinds["reject"]
