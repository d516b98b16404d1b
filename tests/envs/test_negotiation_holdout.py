"""Held-out Negotiation partners: deterministic given the rng, valid play, their rules, out of training's reach."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from polyturn.acting.registry import make_env
from polyturn.envs.actions import format_action
from polyturn.envs.negotiation.holdout import HOLDOUT_PLAYERS, RandomConcession, TitForTat
from polyturn.envs.negotiation.players import TRAIN_PLAYERS, own_target, worth

SRC = Path(__file__).resolve().parents[2] / "src" / "polyturn"


def game(first: str, second: str, seed: int, rng_seed: int) -> list[str]:
    """One self-play game between two scripted players (holdout or training ones); every action valid."""
    players = {role: (HOLDOUT_PLAYERS | TRAIN_PLAYERS)[name]() for role, name in (("first", first), ("second", second))}
    rng = random.Random(rng_seed)
    env = make_env("polyturn/Negotiation-v0", {"opponent": "self", "max_turns": 8}).unwrapped
    env.reset(seed=seed)
    actions = []
    while True:
        role = env.agent_selection
        action = players[role].act(env.role_view(role), rng)
        out = env.step(action)
        assert out.updates[role].info["action_valid"], (role, action, out.updates[role].observation)
        actions.append(f"{role}: {action}")
        if out.terminated or out.truncated:
            return actions + [f"deal={out.updates['first'].info['deal']['deal']}"]


@pytest.mark.parametrize("name", sorted(HOLDOUT_PLAYERS))
def test_holdout_players_are_deterministic_and_play_valid_actions(name: str) -> None:
    differs = False
    for seed in range(15):
        for first, second in [(name, "fair"), ("conceding", name), (name, name)]:
            a = game(first, second, seed, rng_seed=seed)
            assert a == game(first, second, seed, rng_seed=seed)
            differs |= a != game(first, second, seed, rng_seed=seed + 100)
    assert differs == (name == "random_concession")  # only RandomConcession draws from the rng


def test_tit_for_tat_mirrors_the_other_sides_concessions() -> None:
    counts, values = (2, 3, 1), (2, 1, 3)  # worth 4 + 3 + 3 = 10 to it
    tft = TitForTat(opening=9, floor=5)
    view = {"counts": counts, "values": values, "round": 0, "turns_left": 9, "my_proposals": ()}

    def offer(share: tuple[int, int, int]) -> dict:
        theirs = view.get("their_proposals", ()) + (share,)
        return view | {"standing": share, "their_proposals": theirs}

    view = offer((1, 0, 0))  # worth 2 to it: it opens at 9
    first = tft.act(view, random.Random(0))
    assert worth(view, own_target(view, 9)) >= 9 and first == format_action("propose", dict(zip(
        ("book", "hat", "ball"), own_target(view, 9))))
    view["my_proposals"] = (own_target(view, 9),)
    view = offer((1, 2, 0))  # worth 4: they conceded 2, so it concedes 2
    assert tft.next_target(view) == 7
    tft.act(view, random.Random(0))
    view["my_proposals"] += (own_target(view, 7),)
    view = offer((1, 2, 0))  # no concession: it holds at 7
    assert tft.next_target(view) == 7
    tft.act(view, random.Random(0))
    view["my_proposals"] += (own_target(view, 7),)
    view = offer((0, 3, 1))  # worth 6, 2 more: target 5; 6 is at least what it would propose next
    assert tft.next_target(view) == 5 and worth(view, own_target(view, 5)) <= 6
    assert tft.act(view, random.Random(0)) == format_action("accept", {})
    fresh = TitForTat(opening=9, floor=5)  # a huge concession never takes it under its floor
    start = {"counts": counts, "values": values, "standing": (0, 0, 0), "their_proposals": ((0, 0, 0),),
             "my_proposals": ()}
    fresh.act(start, random.Random(0))
    assert fresh.next_target(start | {"my_proposals": ((2, 3, 1),), "their_proposals": ((0, 0, 0), (2, 3, 0))}) == 5


def test_random_concession_falls_by_random_steps_to_its_floor() -> None:
    player = RandomConcession(start=9, floor=3, max_fall=2)
    rng = random.Random(7)
    path = [player.aspiration(r, rng) for r in range(12)]
    assert path[0] == 9 and path[-1] == 3 and all(a >= b >= 3 for a, b in zip(path, path[1:]))
    assert len(set(b - a for a, b in zip(path, path[1:]) if b > 3)) > 1  # the falls vary
    rng = random.Random(7)
    assert [player.aspiration(r, rng) for r in range(12)] == path  # a new game (round 0) starts over
    with pytest.raises(ValueError, match="Expected 0 <= floor <= start"):
        RandomConcession(start=2, floor=3)
    with pytest.raises(ValueError, match="Expected 0 <= floor <= opening"):
        TitForTat(opening=11)


def test_no_option_reaches_the_holdout_players() -> None:
    for name in [*HOLDOUT_PLAYERS, "holdout", "polyturn.envs.negotiation.holdout:HOLDOUT_PLAYERS"]:
        with pytest.raises(ValueError, match="Expected opponent among"):
            make_env("polyturn/Negotiation-v0", {"opponent": name})
    # only the spec names the module (for evaluation); no code imports it
    mentions = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                      if "negotiation.holdout" in p.read_text(encoding="utf-8") or
                      "import holdout" in p.read_text(encoding="utf-8"))
    assert mentions == ["envs/negotiation/spec.py"]
