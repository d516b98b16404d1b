"""The serving engine batches concurrent sessions through BatchDecoder and keeps each session's row."""

from __future__ import annotations

import pytest
import torch

from polyturn.models.actor import load_actor
from polyturn.rollout.context import RolloutSettings
from polyturn.serve.engine import Engine, EngineFull, TurnRequest
from polyturn.serve.explore import ExploreSettings
from tests.serve.conftest import ACTION


def _ref_logprobs(model, seq):
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0].log_softmax(-1)


def test_concurrent_sessions_match_full_forward_and_share_steps(checkpoints):
    actor = load_actor(checkpoints[0] / "actor")
    steps: list[int] = []
    eng = Engine(actor, settings=RolloutSettings(max_action_tokens=24), version="v1", max_rows=3,
                 batch_window_s=0.02, on_step=lambda n, dt: steps.append(n)).start()
    try:
        slots = [eng.open_slot() for _ in range(3)]
        seqs = [actor.encode(actor.chat.render_prefix(t, None)) for t in ("hello", "华东", "a longer task text")]
        sampled: list[list[tuple[int, int, float]]] = [[] for _ in slots]
        for turn in range(2):
            futs = []
            for i, slot in enumerate(slots):
                ctx = seqs[i] if turn == 0 else actor.encode(actor.chat.render_observation(f"obs {turn} {'x' * i}"))
                if turn:
                    seqs[i] = seqs[i] + ctx
                futs.append(eng.submit(TurnRequest(slot=slot, context=ctx, restart=turn == 0,
                                                   temperature=1.0 if i else 0.0, max_new_tokens=24)))
            for i, f in enumerate(futs):
                res = f.result(timeout=30)
                for k, (tok, lp) in enumerate(zip(res.ids, res.logprobs)):
                    sampled[i].append((len(seqs[i]) + k, tok, lp))
                seqs[i] = seqs[i] + res.ids
        # Greedy row answers the trained action.
        text = actor.tokenizer.decode([t for _, t, _ in sampled[0]][:-1])
        assert text.startswith(ACTION)
        # Every sampled token's log-prob equals a plain forward pass over that session's own sequence.
        for i in (1, 2):  # the sampled rows (temperature 1: log-probs of the full distribution)
            ref = _ref_logprobs(actor.model, seqs[i])
            for pos, tok, lp in sampled[i]:
                assert abs(float(ref[pos - 1, tok]) - lp) < 1e-4
        assert max(steps) == 3  # three sessions decoded in the same steps
        with_full = None
        try:
            eng.open_slot()
        except EngineFull as e:
            with_full = str(e)
        assert with_full and "max-sessions" in with_full
        # A released row is reused for a new session, which starts fresh (greedy answer again).
        eng.release(slots[0])
        s = eng.open_slot()
        ctx = actor.encode(actor.chat.render_prefix("hello", None))
        res = eng.submit(TurnRequest(slot=s, context=ctx, restart=True, temperature=0.0, max_new_tokens=24)).result(30)
        assert actor.tokenizer.decode(res.ids[:-1]).startswith(ACTION)
        assert s.row == 0
    finally:
        eng.stop()


def test_exploration_forces_a_confident_candidate(checkpoints):
    actor = load_actor(checkpoints[0] / "actor")
    ctx = actor.encode(actor.chat.render_prefix("hello", None))
    for threshold, expect_forced in ((-50.0, True), (0.5, False)):
        eng = Engine(actor, settings=RolloutSettings(max_action_tokens=24), version="v1", max_rows=2,
                     explore=ExploreSettings(epsilon=1.0, candidates=3, temperature=1.5, min_mean_logprob=threshold))
        eng.start()
        try:
            res = eng.submit(TurnRequest(slot=eng.open_slot(), context=ctx, restart=True, temperature=0.0,
                                         max_new_tokens=24, explore=True)).result(30)
        finally:
            eng.stop()
        assert res.forced is expect_forced
        assert res.explored is not None and res.explored["candidates"] == 3
        assert res.ids[-1] == actor.stop_id
        if expect_forced:
            ref = _ref_logprobs(actor.model, ctx + res.ids)
            for k, tok in enumerate(res.ids):  # the policy's log-probs of the forced ids (temperature 1)
                assert abs(float(ref[len(ctx) + k - 1, tok]) - res.logprobs[k]) < 1e-4


def test_unbatched_baseline_serves_the_same_turns(checkpoints):
    from polyturn.serve.unbatched import UnbatchedEngine

    actor = load_actor(checkpoints[0] / "actor")
    outs = []
    for cls in (Engine, UnbatchedEngine):
        eng = cls(actor, settings=RolloutSettings(max_action_tokens=24), version="v1", max_rows=2).start()
        try:
            slots = [eng.open_slot() for _ in range(2)]
            got = []
            for turn in range(2):
                futs = []
                for i, slot in enumerate(slots):
                    task = actor.chat.render_prefix(("hello", "华东")[i], None)
                    ctx = actor.encode(task if turn == 0 else actor.chat.render_observation("Tables: sales"))
                    futs.append(eng.submit(TurnRequest(slot=slot, context=ctx, restart=turn == 0, temperature=0.0,
                                                       max_new_tokens=24)))
                got.append([f.result(30) for f in futs])
            outs.append([[(r.ids, [round(x, 3) for x in r.logprobs]) for r in turn] for turn in got])
        finally:
            eng.stop()
    assert outs[0] == outs[1]


def test_a_long_observation_is_prefilled_in_chunks_beside_the_decoding_rows(checkpoints):
    """prefill_chunk 5: the second turn's long observation (160 tokens) enters at most 5 tokens per forward pass,
    alongside the other session's decoding, and every sampled token's log-prob is still a plain forward pass's."""
    actor = load_actor(checkpoints[0] / "actor")
    eng = Engine(actor, settings=RolloutSettings(max_action_tokens=24), version="v1", max_rows=2,
                 batch_window_s=0.02, prefill_chunk=5).start()
    widths: list[int] = []
    try:
        slots = [eng.open_slot() for _ in range(2)]
        seqs = [actor.encode(actor.chat.render_prefix(t, None)) for t in ("hello", "华东")]
        sampled: list[list[tuple[int, int, float]]] = [[], []]
        for turn in range(2):
            if turn == 1:  # from here on, record the widest block each forward pass feeds
                feed = eng.dec._feed_block
                eng.dec._feed_block = lambda rows: (widths.append(max(len(r) for r in rows)), feed(rows))[1]
            futs = []
            for i, slot in enumerate(slots):
                obs = "Tables: sales, products, customers, regions. " * (6 if i == 0 else 0) + "ok"
                ctx = seqs[i] if turn == 0 else actor.encode(actor.chat.render_observation(obs))
                if turn:
                    seqs[i] = seqs[i] + ctx
                futs.append(eng.submit(TurnRequest(slot=slot, context=ctx, restart=turn == 0, temperature=1.0,
                                                   max_new_tokens=24)))
            for i, f in enumerate(futs):
                res = f.result(timeout=30)
                sampled[i] += [(len(seqs[i]) + k, tok, lp) for k, (tok, lp) in enumerate(zip(res.ids, res.logprobs))]
                seqs[i] = seqs[i] + res.ids
        long_obs = len(actor.encode(actor.chat.render_observation("Tables: sales, products, customers, regions. " * 6
                                                                  + "ok")))
        # At most a chunk per pass (+1: the row's last sampled token, fed in front of its next context).
        assert long_obs > 30 and widths and max(widths) <= 5 + 1 and len(widths) >= long_obs // 5, (long_obs, widths)
        for i in (0, 1):
            ref = _ref_logprobs(actor.model, seqs[i])
            for pos, tok, lp in sampled[i]:
                assert abs(float(ref[pos - 1, tok]) - lp) < 1e-4
    finally:
        eng.stop()
    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine(actor, settings=RolloutSettings(max_action_tokens=24), version="v1", prefill_chunk=-1)


@pytest.mark.parametrize("unbatched", [False, True])
def test_engines_decode_under_the_actors_autocast(checkpoints, unbatched):
    """A LoRA actor in bf16 keeps its frozen base linears in bf16 (store_frozen_linears): the engines must run
    its forward passes under the actor's autocast, as training's collector does (without it: a dtype error)."""
    from polyturn.runtime import Runtime
    from polyturn.serve.unbatched import UnbatchedEngine

    actor = load_actor(checkpoints[0] / "actor")
    for m in actor.model.modules():  # a frozen base, as LoRA leaves it
        if isinstance(m, torch.nn.Linear):
            m.weight.requires_grad_(False)
    actor.to(Runtime(device=torch.device("cpu"), precision="bf16"))
    assert any(m.weight.dtype == torch.bfloat16 for m in actor.model.modules() if isinstance(m, torch.nn.Linear))
    cls = UnbatchedEngine if unbatched else Engine
    eng = cls(actor, settings=RolloutSettings(max_action_tokens=24), version="v1", max_rows=2).start()
    try:
        slot = eng.open_slot()
        ctx = actor.encode(actor.chat.render_prefix("hello", None))
        res = eng.submit(TurnRequest(slot=slot, context=ctx, restart=True, temperature=1.0,
                                     max_new_tokens=24)).result(timeout=60)
        assert res.ids and all(lp <= 0 for lp in res.logprobs)
    finally:
        eng.stop()
