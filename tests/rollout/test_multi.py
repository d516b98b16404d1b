"""Collection in a multi-role env: each role's own view and tokens, rewards to the right turn, and the single-agent
game as the special case of a scripted partner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polyturn.acting.registry import make_env
from polyturn.envs.negotiation.game import generate_scenario
from polyturn.envs.negotiation.players import ScriptedNegotiator
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.multi import MultiAgentCollector, Seat
from polyturn.train.batch import actor_logprobs, make_token_batch

NEG = "polyturn/Negotiation-v0"
SETTINGS = RolloutSettings(max_action_tokens=32, context_budget=1024)


@pytest.fixture(scope="module")
def neg_actor(tmp_path_factory):
    """A tiny actor after a short BC on noisy negotiation demonstrations (it proposes, accepts, makes deals)."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl
    from polyturn.config import load_config
    from polyturn.train.bc_phase import behaviour_cloning
    from polyturn.train.trainer import Trainer

    d = tmp_path_factory.mktemp("neg_bc")
    write_jsonl(d / "demos.jsonl", generate_demos(NEG, episodes=48, noise=0.2, seed=0))
    cfg = load_config("configs/test_tiny.yaml", [f"run.out_dir={d / 'run'}", f"bc.demos={d / 'demos.jsonl'}",
                                                 f"env.id={NEG}", "rollout.max_action_tokens=32", "bc.epochs=6",
                                                 "bc.lr=3e-3", "actor.hidden=64", "actor.layers=2"])
    tr = Trainer(cfg)
    behaviour_cloning(tr.policy, logger=tr.logger, rep=tr.rep, extra={})
    tr.actor.model.eval()
    return tr.actor


def _multi(n: int) -> MultiAgentCollector:
    return MultiAgentCollector([make_env(NEG, {"opponent": "self"}) for _ in range(n)], env_id=NEG, settings=SETTINGS)


@pytest.mark.parametrize("epsilon", [0.0, 1.0], ids=["greedy", "random_valid_actions"])
def test_a_scripted_partner_makes_it_the_single_agent_game(neg_actor, epsilon):
    """The first role against a scripted second plays, token for token, the single-agent game against that strategy:
    its greedy actions, or (epsilon 1) random valid actions drawn in the same order from the same generator."""
    seeds = list(range(10))
    single = Collector(neg_actor, [make_env(NEG).unwrapped for _ in range(4)], env_id=NEG, settings=SETTINGS)
    alone = single.collect([{"seed": s} for s in seeds], temperature=0.0, epsilon=epsilon,
                           rng=np.random.default_rng(3))
    games = [{"seed": s, "seats": {"first": Seat("me", actor=neg_actor),
                                   "second": Seat("them", player=ScriptedNegotiator(generate_scenario(s).strategy))}}
             for s in seeds]
    seated = [g["first"] for g in _multi(4).collect(games, temperature=0.0, epsilon=epsilon,
                                                    rng=np.random.default_rng(3))]
    if epsilon:  # games worth comparing: deals, counter-proposals, several turns
        assert any(ep.final_features.get("deal") for ep in alone) and any(len(ep.turns) > 2 for ep in alone)
    for a, b in zip(alone, seated):
        assert [t.observation for t in b.turns] == [t.observation for t in a.turns]
        assert [t.action_ids for t in b.turns] == [t.action_ids for t in a.turns]
        assert [t.reward for t in b.turns] == pytest.approx([t.reward for t in a.turns])
        assert [(t.terminated, t.truncated) for t in b.turns] == [(t.terminated, t.truncated) for t in a.turns]
        assert b.success == a.success and b.final_observation == a.final_observation
        assert [s.ids for s in b.segments] == [s.ids for s in a.segments]
        assert [s.action_mask for s in b.segments] == [s.action_mask for s in a.segments]
        assert [t.logprobs for t in b.turns] == [pytest.approx(t.logprobs, abs=1e-4) for t in a.turns]
        assert b.role == "first" and b.partner == "them" and not a.role


def test_each_role_holds_only_its_own_tokens_with_their_behaviour_logprobs(neg_actor):
    games = [{"seed": s, "seats": {r: Seat("me", actor=neg_actor) for r in ("first", "second")}} for s in range(6)]
    played = _multi(3).collect(games, temperature=1.0, epsilon=0.5, rng=np.random.default_rng(0),
                               generator=torch.Generator().manual_seed(0))
    eps = [ep for g in played for ep in g.values() if ep.turns]
    assert {ep.role for ep in eps} == {"first", "second"}
    for ep in eps:
        masked = [i for seg in ep.segments for i, m in zip(seg.ids, seg.action_mask) if m]
        assert masked == [i for t in ep.turns for i in t.action_ids]  # token-in/token-out, this role's turns only
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=neg_actor.pad_id)
    with torch.no_grad():
        logp = actor_logprobs(neg_actor, batch, temperature=1.0)
    m = batch.action_mask.bool()
    assert torch.allclose(logp[m], batch.old_logprobs[m], atol=1e-4)
    # The second role reads the first role's proposal as what it is told, never as its own action.
    first_turn = next(ep for ep in eps if ep.role == "second").turns[0]
    assert "They make the first offer" in first_turn.observation


def test_rewards_reach_each_roles_last_turn_and_the_game_ends_for_both(neg_actor):
    games = [{"seed": s, "seats": {r: Seat("me", actor=neg_actor) for r in ("first", "second")}} for s in range(12)]
    played = _multi(4).collect(games, temperature=1.0, epsilon=0.5, rng=np.random.default_rng(1),
                               generator=torch.Generator().manual_seed(1))
    deals = 0
    for g in played:
        both = [ep for ep in g.values() if ep.turns]
        for ep in both:
            last = ep.turns[-1]
            assert last.terminated or last.truncated
            assert "success" in last.info and ep.success == bool(last.info["success"])
            assert all(not (t.terminated or t.truncated) for t in ep.turns[:-1])
        deal = next((ep.turns[-1].info.get("deal") for ep in both if ep.turns[-1].info.get("deal")), None)
        if deal and deal["deal"]:
            deals += 1
            for ep in both:  # each side's utility lands on its own last turn, whoever ended the game
                assert ep.turns[-1].reward_terms["outcome/utility"] == deal["worth"][ep.role]
                assert ep.episode_return == pytest.approx(sum(t.reward for t in ep.turns))
    assert deals > 0


def test_a_partner_seated_in_few_games_gets_few_decoder_rows_and_rows_are_reused_cleanly(neg_actor):
    """Each actor's decoder holds a row per seat it can play at once (not one per slot and role; one per slot for
    an actor in one role a game), rows are handed back when a game ends and taken by the next: each game plays,
    greedily, exactly what it plays alone."""
    import copy

    pool = copy.deepcopy(neg_actor)  # an earlier snapshot: another actor, the same weights
    def seats(s: int) -> dict:
        if s % 4 == 1:  # a quarter of the games against the pool entry, in the second seat
            return {"first": Seat("latest", actor=neg_actor), "second": Seat("pool", actor=pool)}
        return {r: Seat("latest", actor=neg_actor) for r in ("first", "second")}
    games = [{"seed": s, "seats": seats(s)} for s in range(9)]
    multi = _multi(4)
    together = multi.collect(games, temperature=0.0)
    assert multi.decoder_rows == {"latest": 8, "pool": 2}  # 4 slots x 2 roles; the pool sits in 2 of 9 games
    apart = [{"seed": s, "seats": {"first": Seat("latest", actor=neg_actor), "second": Seat("pool", actor=pool)}}
             for s in range(9)]
    multi.collect(apart, temperature=0.0)
    assert multi.decoder_rows == {"latest": 4, "pool": 4}  # one role a game each (a hierarchy's two): 4 slots x 1
    for game, got in zip(games, together):
        alone = _multi(1).collect([game], temperature=0.0)[0]
        assert set(got) == set(alone)
        for role in got:
            assert [t.action_ids for t in got[role].turns] == [t.action_ids for t in alone[role].turns]
            assert [t.observation for t in got[role].turns] == [t.observation for t in alone[role].turns]
