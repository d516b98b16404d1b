"""The default ``polyturn/Negotiation-v0`` (a scripted opponent) is unchanged by self-play.

``negotiation_transcripts.json`` was recorded from the code before self-play existed
(``python tests/envs/test_negotiation_default.py --record``): every observation, reward,
ending and info of a few episodes of random actions (malformed ones included) and of the
noisy expert. The env must reproduce them exactly; the only addition allowed is the new
``info["deal"]`` at the end of an episode.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from polyturn.acting.registry import make_env
from polyturn.envs.actions import format_action
from polyturn.envs.negotiation.expert import NegotiationExpert

FIXTURE = Path(__file__).with_name("negotiation_transcripts.json")
CASES = [  # (seed, env kwargs, actor): actor "random", "stall" (never settles: truncation) or "expert"
    (0, {}, "random"), (1, {"level": 1}, "random"), (2, {"level": 2, "max_turns": 4}, "random"),
    (3, {"level": 3, "fairness_weight": 0.5}, "random"), (4, {"level": 3, "max_turns": 6}, "random"),
    (5, {"level": 1, "success_threshold": 7}, "random"), (6, {}, "expert"), (7, {"level": 3}, "expert"),
    (8, {"level": 2, "fairness_weight": 0.25}, "expert"), (9, {"level": 1, "max_turns": 5}, "stall"),
    (10, {"level": 3}, "stall"),
]


def random_action(rng: random.Random, counts: tuple[int, ...], *, stall: bool = False) -> str:
    """A propose / accept / reject / walk_away / remember or a malformed action; stalling: no way to a deal."""
    weights = [4, 0, 3, 0, 1, 2] if stall else [10, 2, 3, 1, 1, 2]
    kind = rng.choices(["propose", "accept", "reject", "walk_away", "remember", "bad"], weights)[0]
    if kind == "propose" and stall:  # everything for me: no opponent ever accepts it
        return format_action("propose", dict(zip(("book", "hat", "ball"), counts)))
    if kind == "propose":
        return format_action("propose", dict(zip(("book", "hat", "ball"), (rng.randint(0, c) for c in counts))))
    if kind == "remember":
        return format_action("remember", {"note": "hold out"})
    if kind == "bad":
        return rng.choice(["", "Action: propose[{\"book\": 1}]", "just text", "Action: grab[{}]"])
    return format_action(kind, {})


def transcript(seed: int, kwargs: dict[str, Any], actor: str) -> list[Any]:
    """One episode as JSON-ready data: the reset, then each (action, obs, reward, terminated, truncated, info)."""
    env = make_env("polyturn/Negotiation-v0", kwargs)
    obs, info = env.reset(seed=seed)
    out: list[Any] = [[obs, info]]
    rng = random.Random(seed)
    expert = NegotiationExpert(env, noise=0.3, seed=seed) if actor == "expert" else None
    if expert is not None:
        expert.reset(obs, info)
    done = False
    while not done:
        if expert is not None:
            action = expert.act(obs, info)
        else:
            action = random_action(rng, env.unwrapped.scenario.counts, stall=actor == "stall")
        obs, reward, terminated, truncated, info = env.step(action)
        out.append([action, obs, reward, terminated, truncated, info])
        done = terminated or truncated
    env.close()
    return json.loads(json.dumps(out))


def test_default_env_reproduces_the_recorded_transcripts() -> None:
    recorded = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert len(recorded) == len(CASES)
    for (seed, kwargs, actor), want in zip(CASES, recorded):
        got = transcript(seed, kwargs, actor)
        assert len(got) == len(want), (seed, kwargs)
        assert all(step[-1].pop("cost_terms") == {} for step in got[1:])  # no cost terms (reported since issue 60)
        assert not any("deal" in step[-1] for step in got[:-1])
        assert set(got[-1][5].pop("deal")) == {"deal", "worth", "joint", "max_joint", "pareto_optimal", "fairness"}
        assert json.dumps(got) == json.dumps(want), (seed, kwargs, actor)


def recorded_form(case: tuple) -> list:
    """A transcript as the fixture keeps it: without the end-of-game deal summary (checked apart above)."""
    got = transcript(*case)
    got[-1][5].pop("deal", None)
    return got


# Re-recorded after each env stopped reporting the SQL env's reward terms: the transcripts differed from the first
# recording only by those terms, all 0 (checked before re-recording).
if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    FIXTURE.write_text(json.dumps([recorded_form(case) for case in CASES], indent=1) + "\n", encoding="utf-8")
