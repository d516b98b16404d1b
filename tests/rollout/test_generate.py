"""The incremental batched decoder computes what a plain forward pass over each row computes."""

from __future__ import annotations

import pytest
import torch

from polyturn.rollout.generate import BatchDecoder, sample_from_logits


def _reference_logprobs(model, seq):
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0].log_softmax(-1)


def _check_sampled_logprobs(model, seqs, sampled, lps) -> int:
    """Assert every sampled token's log-prob equals a plain forward pass over its row; return how many."""
    n_checked = 0
    for i, seq in enumerate(seqs):
        ref = _reference_logprobs(model, seq)
        for j in range(1, len(seq)):
            if sampled[i][j]:
                assert abs(float(ref[j - 1, seq[j]]) - lps[i][j]) < 1e-4
                n_checked += 1
    return n_checked


def _record(seqs, sampled, lps, i, action, extra) -> None:
    """Row ``i``'s sampled ``action`` (None: it did not act) then the ``extra`` tokens appended after it."""
    if action is not None:
        seqs[i] += action.ids
        sampled[i] += [True] * len(action.ids)
        lps[i] += action.logprobs
    seqs[i] += extra
    sampled[i] += [False] * len(extra)
    lps[i] += [0.0] * len(extra)


def test_incremental_decode_matches_full_forward(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    stop = actor.stop_id
    dec = BatchDecoder(model, pad_id=actor.pad_id, stop_id=stop)
    contexts = [actor.encode("<|user|>a<|end|>\n<|assistant|>"), actor.encode("<|user|>longer task text here<|end|>\n<|assistant|>"), [5]]
    seqs = [list(c) for c in contexts]
    sampled = [[False] * len(c) for c in contexts]
    lps = [[0.0] * len(c) for c in contexts]
    dec.reset(contexts)
    g = torch.Generator().manual_seed(0)
    for turn in range(3):
        active = [True, True, turn < 2]
        acts = dec.sample(active=active, temperature=1.0, max_new_tokens=7, generator=g)
        pieces = []
        for i, a in enumerate(acts):
            if a is None:
                pieces.append([])
                continue
            seqs[i] += a.ids
            sampled[i] += [True] * len(a.ids)
            lps[i] += a.logprobs
            extra = ([stop] if a.hit_cap else []) + actor.encode(f"\n<|tool|>obs {turn} {'x' * i}<|end|>\n<|assistant|>")
            seqs[i] += extra
            sampled[i] += [False] * len(extra)
            lps[i] += [0.0] * len(extra)
            pieces.append(extra)
        dec.append(pieces)
    n_checked = _check_sampled_logprobs(model, seqs, sampled, lps)
    assert n_checked > 10


def test_restart_row_equals_fresh_context(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    dec = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    dec.reset([[5, 6, 7, 8], [9, 10]])
    dec.restart_row(0)
    dec.append([[11, 12], [13]])
    acts = dec.sample(active=[True, False], temperature=0.0, max_new_tokens=1)
    ref = _reference_logprobs(model, [11, 12])[-1]
    assert acts[0].ids[0] == int(ref.argmax())


def test_forced_tokens_are_followed_and_scored(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    dec = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    ctx = [5, 6, 7]
    dec.reset([ctx])
    forced = [20, 21, actor.stop_id]
    (act,) = dec.sample(active=[True], temperature=0.7, max_new_tokens=10, forced=[forced])
    assert act.ids == forced and act.forced and not act.hit_cap
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=torch.tensor([ctx + forced])).logits[0] / 0.7, -1)
    for k, tok in enumerate(forced):
        assert abs(float(ref[len(ctx) - 1 + k, tok]) - act.logprobs[k]) < 1e-4


def test_token_cap_marks_hit_cap(tiny_actor):
    actor = tiny_actor
    dec = BatchDecoder(actor.model.eval(), pad_id=actor.pad_id, stop_id=actor.stop_id)
    dec.reset([[5, 6]])
    (act,) = dec.sample(active=[True], temperature=1.0, max_new_tokens=3, forced=[[30, 31, 32, 33]])
    assert act.ids == [30, 31, 32] and act.hit_cap
    assert dec.pending[0] == [32]


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.05, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(sample_from_logits(logits, temperature=1.0, top_p=0.75, generator=g)[0]) for _ in range(200)}
    assert draws == {0, 1}
    tok, lp = sample_from_logits(logits, temperature=0.0, top_p=1.0, generator=None)
    assert int(tok) == 0 and abs(float(lp) - torch.log(torch.tensor(0.7))) < 1e-5


def test_sample_categorical_matches_the_distribution():
    from polyturn.rollout.generate import sample_categorical

    # Mass spread over several blocks (block=4), zero-probability tokens included, a row that does not sum to 1.
    probs = torch.tensor([[0.05, 0.0, 0.15, 0.1, 0.3, 0.0, 0.0, 0.2, 0.2, 0.0],
                          [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    n = 20_000
    draws = torch.stack([sample_categorical(probs, generator=g, block=4) for _ in range(n)])
    assert (draws[:, 1] == 9).all()
    freq = torch.bincount(draws[:, 0], minlength=10).float() / n
    p = probs[0] / probs[0].sum()
    assert (freq[p == 0] == 0).all()
    # Within 5 binomial standard deviations of every probability.
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-9).all()


def _gqa_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return Qwen2ForCausalLM(cfg).eval()


def test_rows_of_different_lengths_share_no_pad_columns_and_match_a_full_forward():
    """A grouped-query model (the pack-GQA attention path): row i's t-th token is cache column t, so the
    width is the longest row, restarted rows write from column 0, blocks where few rows have new tokens run
    those rows alone, and every sampled log-prob equals a plain forward pass over that row alone."""
    model = _gqa_model()
    dec = BatchDecoder(model, pad_id=0, stop_id=1)
    seqs = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    sampled = [[False] * len(s) for s in seqs]
    lps = [[0.0] * len(s) for s in seqs]
    dec.reset(seqs)
    assert dec.width == 7
    g = torch.Generator().manual_seed(1)
    for turn in range(4):
        if turn == 2:  # row 0 starts over, as a finished episode's slot does
            dec.restart_row(0)
            seqs[0], sampled[0], lps[0] = [], [], []
        # Turn 1: row 1 alone decodes and gets new tokens, so its steps and its block run that row alone.
        active = [turn not in (1, 2), True, turn in (0, 2)]
        acts = dec.sample(active=active, temperature=1.0, max_new_tokens=1 + 2 * turn,
                          generator=g)
        pieces = []
        for i, a in enumerate(acts):
            fresh = turn == 2 and i == 0  # the restarted row's new context
            extra = [20 + turn] * (i + 1 + turn) if active[i] or fresh else []
            _record(seqs, sampled, lps, i, a, extra)
            pieces.append(extra)
        dec.append(pieces)
        assert dec.real_lengths() == [len(s) for s in seqs]
        assert dec.width == max(len(s) for s in seqs)  # no pad columns between a row's tokens
    n_checked = _check_sampled_logprobs(model, seqs, sampled, lps)
    assert n_checked > 10


def test_a_shared_prefix_is_computed_once_and_gives_the_same_logprobs(monkeypatch):
    """Contexts that open with the same system prompt: its keys and values are computed once and copied into
    every row (and into a restarted row whose new context opens with it), decode steps read it once for all
    rows (cascade attention) until a row without it runs; log-probs are a full forward's."""
    from polyturn.rollout import attention

    steps = []  # per decode-step attention call: did it read the shared prefix once (cascade)?
    real = attention.row_attention

    def recorded(module, query, *args, **kwargs):
        if query.shape[2] == 1:
            steps.append(attention._SHARED.get() is not None)
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "row_attention", recorded)  # rollout/body.py calls it so
    monkeypatch.setitem(attention.AttentionInterface._global_mapping, attention.NAME, recorded)  # the model's own
    model = _gqa_model()
    system = [(7 * k) % 50 + 2 for k in range(40)]
    seqs = [system + [5, 6, 7], system + [8], system + [9, 10, 11, 12, 13]]
    dec = BatchDecoder(model, pad_id=0, stop_id=1)
    dec.reset(seqs)
    assert dec.prefix_tokens_reused == 3 * len(system)
    sampled = [[False] * len(s) for s in seqs]
    lps = [[0.0] * len(s) for s in seqs]
    g = torch.Generator().manual_seed(3)
    cascade_turns = []
    for turn in range(4):
        before = len(steps)
        acts = dec.sample(active=[True] * 3, temperature=1.0, max_new_tokens=3, generator=g)
        cascade_turns.append(set(steps[before:]))
        pieces = []
        for i, a in enumerate(acts):
            seqs[i] += a.ids
            sampled[i] += [True] * len(a.ids)
            lps[i] += a.logprobs
            extra = [30 + turn, 31]
            if turn == 1 and i == 2:  # row 2 ends; its slot takes a new task with the same system prompt
                dec.restart_row(2)
                seqs[2], sampled[2], lps[2] = [], [], []
                extra = system + [14, 15]
            if turn == 2 and i == 0:  # row 0's new task has another system prompt: no shared prefix
                dec.restart_row(0)
                seqs[0], sampled[0], lps[0] = [], [], []
                extra = system[::-1] + [16]
            seqs[i] += extra
            sampled[i] += [False] * len(extra)
            lps[i] += [0.0] * len(extra)
            pieces.append(extra)
        dec.append(pieces)
    assert dec.prefix_tokens_reused == 4 * len(system)
    assert cascade_turns == [{True}, {True}, {True}, {False}]
    n_checked = _check_sampled_logprobs(model, seqs, sampled, lps)
    assert n_checked >= 16


def test_steps_of_a_few_rows_after_a_shared_prefix_gather_only_their_own_columns(monkeypatch):
    """Decode steps that run a subset of the rows (the multi-role collector's: each role's turn in some games),
    every row opening with the shared prefix: the cache hands the attention only the running rows' columns after
    the prefix (the prefix read once from SharedPrefix); the log-probs are a full forward's, and the sampled ids
    and log-probs bitwise those of the decoder handed every column (``slice_prefix`` off, as before). A model off
    SDPA (eager attention, where the decoder's attention is not switched) gets every column and an additive mask:
    until 2026-12-08 it got the boolean one, which eager attention adds to its scores (nothing masked; log-probs
    off by 0.007-0.026 here)."""
    from polyturn.rollout import attention

    seen = []  # per decode-step attention call: (rows, key columns, mask columns, sliced)
    real = attention.row_attention

    def recorded(module, query, key, value, mask, *args, **kwargs):
        if query.shape[2] == 1:
            shared = attention._SHARED.get()
            seen.append((key.shape[0], key.shape[2], mask.shape[-1], bool(getattr(shared, "sliced", False))))
        return real(module, query, key, value, mask, *args, **kwargs)

    monkeypatch.setattr(attention, "row_attention", recorded)
    monkeypatch.setitem(attention.AttentionInterface._global_mapping, attention.NAME, recorded)
    system = [(7 * k) % 50 + 2 for k in range(40)]

    def play(impl: str, slice_prefix: bool):
        model = _gqa_model()
        model.config._attn_implementation = impl
        seqs = [system + [5 + i] * (i + 1) for i in range(6)]
        dec = BatchDecoder(model, pad_id=0, stop_id=1)
        dec.slice_prefix = slice_prefix
        dec.reset([list(s) for s in seqs])
        sampled = [[False] * len(s) for s in seqs]
        lps = [[0.0] * len(s) for s in seqs]
        g = torch.Generator().manual_seed(5)
        seen.clear()
        for turn in range(3):
            active = [i % 3 == turn for i in range(6)]  # two rows of six a turn
            acts = dec.sample(active=active, temperature=1.0, max_new_tokens=4, generator=g)
            pieces = []
            for i, a in enumerate(acts):
                extra = [40 + turn, 41] if a is not None else []
                _record(seqs, sampled, lps, i, a, extra)
                pieces.append(extra)
            dec.append(pieces)
        assert _check_sampled_logprobs(model, seqs, sampled, lps) >= 16
        return seqs, lps, list(seen)

    seqs, lps, steps = play("sdpa", True)
    assert steps and all(rows == 2 and sliced and cols == width - len(system) for rows, cols, width, sliced in steps)
    seqs_all, lps_all, steps_all = play("sdpa", False)
    assert all(not sliced and cols == width for _, cols, width, sliced in steps_all)
    assert (seqs, lps) == (seqs_all, lps_all)
    _, _, steps = play("eager", True)
    assert not steps  # eager attention: the model's own, every column


def test_prefill_split_runs_the_fewest_positions():
    from polyturn.rollout.generate import prefill_split

    # One long observation among short ones: every row's first 10 tokens, then the long row's other 60.
    assert prefill_split([10] * 63 + [70], overhead=64) == 10
    assert prefill_split([10] * 63 + [70, 0, 0], overhead=64) == 10  # rows without new tokens do not count
    # Nearly equal blocks: one pass (its length is the longest block).
    assert prefill_split([10, 10, 11, 12], overhead=64) == 12
    assert prefill_split([3, 40], overhead=0) == 3  # 2 x 3 + 37 < 2 x 40
    assert prefill_split([40], overhead=0) == 40
    assert prefill_split([0, 0]) == 0


def test_a_block_prefilled_in_two_passes_gives_what_one_pass_gives(monkeypatch):
    """With the split forced on, a long row's block runs in two passes (all rows' first tokens, then the long
    row's rest): the next-token logits equal one pass's and sampled log-probs equal a full forward's."""
    from polyturn.rollout import generate

    model = _gqa_model()
    contexts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [22]]
    pieces = [[23, 24], [25], [26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36], [37, 38]]
    results = {}
    real_block = generate.BatchDecoder._feed_block
    for overhead in (10_000, 0):  # never split, split whenever it runs fewer positions
        monkeypatch.setattr(generate, "SPLIT_OVERHEAD", overhead)
        passes = []
        monkeypatch.setattr(generate.BatchDecoder, "_feed_block",
                            lambda self, rows: (passes.append([len(r) for r in rows]), real_block(self, rows)))
        dec = BatchDecoder(model, pad_id=0, stop_id=1)
        dec.reset(contexts)
        dec.append(pieces)
        results[overhead] = (dec.last_logits.clone(), passes, dec.real_lengths(), dec.width)
        g = torch.Generator().manual_seed(4)
        acts = dec.sample(active=[True] * 4, temperature=1.0, max_new_tokens=4, generator=g)
        seqs = [c + p + a.ids for c, p, a in zip(contexts, pieces, acts)]
        sampled = [[False] * (len(c) + len(p)) + [True] * len(a.ids) for c, p, a in zip(contexts, pieces, acts)]
        lps = [[0.0] * (len(c) + len(p)) + a.logprobs for c, p, a in zip(contexts, pieces, acts)]
        assert _check_sampled_logprobs(model, seqs, sampled, lps) >= 4
    (one, one_passes, one_lengths, one_width), (two, two_passes, two_lengths, two_width) = results[10_000], results[0]
    assert one_passes == [[3, 2, 12, 1], [2, 1, 11, 2]]
    assert two_passes == [[3, 2, 3, 1], [0, 0, 9, 0], [2, 1, 2, 2], [0, 0, 9, 0]]
    assert one_lengths == two_lengths and one_width == two_width
    torch.testing.assert_close(one, two, atol=1e-5, rtol=1e-5)


def _greedy_after(dec, pieces):
    """Each row's greedy ids and their log-probs, after appending ``pieces``."""
    dec.append(pieces)
    acts = dec.sample(active=[True] * len(pieces), temperature=0.0, max_new_tokens=3)
    return [a.ids for a in acts], torch.tensor([lp for a in acts for lp in a.logprobs])


def _assert_same_decode(a, b):
    assert a[0] == b[0]
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=1e-5)


def test_keep_rows_in_order_compacts_in_place_and_decodes_as_a_fresh_batch(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    contexts = [[5, 6, 7, 8, 9], [9, 10], [11, 12, 13], [14, 15, 16, 17]]
    dec = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    dec.reset(contexts)
    layer = dec.cache.layers[0]
    ptr, capacity = layer._k.data_ptr(), layer._k.shape[2]
    dec.keep_rows([1, 3])
    assert layer._k.data_ptr() == ptr and layer._k.shape[:3] == (2, layer._k.shape[1], capacity)  # same buffer
    fresh = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    fresh.reset([contexts[1], contexts[3]])
    _assert_same_decode(_greedy_after(dec, [[20], [21, 22]]), _greedy_after(fresh, [[20], [21, 22]]))


def test_keep_rows_repeated_rows_gather_copies(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    contexts = [[5, 6, 7], [9, 10, 11, 12]]
    dec = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    dec.reset(contexts)
    dec.keep_rows([1, 0, 1])
    fresh = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    fresh.reset([contexts[1], contexts[0], contexts[1]])
    _assert_same_decode(_greedy_after(dec, [[20], [21], [22]]), _greedy_after(fresh, [[20], [21], [22]]))


def test_a_cache_sized_from_the_budget_is_allocated_once_and_decodes_as_a_doubling_one(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    contexts = [[5, 6, 7], [9, 10, 11, 12]]
    budget = 320  # more than the doubling cache starts with (4 + 256 columns), so that one must grow
    sized = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id, capacity=budget)
    doubling = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    sized.reset(contexts)
    doubling.reset(contexts)
    layer = sized.cache.layers[0]
    ptr = layer._k.data_ptr()
    assert layer._k.shape[2] == budget and doubling.cache.layers[0]._k.shape[2] == 4 + 256
    long = [list(range(20, 300)), list(range(30, 290))]  # rows reach 283 and 274 columns
    _assert_same_decode(_greedy_after(sized, long), _greedy_after(doubling, long))
    assert layer._k.data_ptr() == ptr and layer._k.shape[2] == budget  # never reallocated
    assert doubling.cache.layers[0]._k.shape[2] == 2 * (4 + 256)  # grew once, doubling


def _poison_untouched(dec):
    """NaN in every column the cache has not zeroed or written yet (what uninitialised memory may hold)."""
    for layer in dec.cache.layers:
        assert layer._clean >= dec.width  # every column attention reads is zeroed or written
        layer._k[:, :, layer._clean :] = float("nan")
        layer._v[:, :, layer._clean :] = float("nan")


def test_untouched_columns_are_zeroed_as_the_width_reaches_them(tiny_actor):
    """The buffers start uninitialised: garbage past the width never reaches a row's logits, through growth,
    in-place compaction and a gathered (reordered) compaction."""
    actor = tiny_actor
    model = actor.model.eval()
    contexts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [16, 17]]
    sized = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id, capacity=320)
    ref = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    sized.reset(contexts)
    ref.reset(contexts)
    _poison_untouched(sized)
    pieces = [list(range(20, 60)), [21], list(range(30, 50))]  # the short rows read columns the long one set
    _assert_same_decode(_greedy_after(sized, pieces), _greedy_after(ref, pieces))
    _poison_untouched(sized)
    sized.keep_rows([0, 2])
    ref.keep_rows([0, 2])
    _poison_untouched(sized)
    _assert_same_decode(_greedy_after(sized, [[22], list(range(60, 100))]), _greedy_after(ref, [[22], list(range(60, 100))]))
    sized.keep_rows([1, 0])  # reordered: gathered into a buffer of the width, grown uninitialised on the next write
    ref.keep_rows([1, 0])
    _poison_untouched(sized)
    _assert_same_decode(_greedy_after(sized, [list(range(100, 140)), [23]]), _greedy_after(ref, [list(range(100, 140)), [23]]))
    assert not any(layer._k[:, :, : sized.width].isnan().any() for layer in sized.cache.layers)


def test_a_row_past_the_capacity_still_fits(tiny_actor):
    actor = tiny_actor
    model = actor.model.eval()
    dec = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id, capacity=8)
    dec.reset([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]])  # a context longer than the capacity asked for
    assert dec.cache.layers[0]._k.shape[2] == 10
    ref = BatchDecoder(model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    ref.reset([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]])
    _assert_same_decode(_greedy_after(dec, [[15, 16]]), _greedy_after(ref, [[15, 16]]))
    assert dec.cache.layers[0]._k.shape[2] == max(2 * 10, 64)  # the row then outgrew it: grown as KVCache.prepare grows


def test_a_capacity_below_one_column_is_refused(tiny_actor):
    with pytest.raises(ValueError, match="capacity"):
        BatchDecoder(tiny_actor.model, pad_id=tiny_actor.pad_id, stop_id=tiny_actor.stop_id, capacity=0)
