"""Off-policy evaluation on sessions recorded by a real `polyturn serve`: a policy on its own records weighs 1,
another policy does not, and records without behaviour log-probs are refused with a clear message."""

from __future__ import annotations

import numpy as np
import pytest

from polyturn.acting.ope import OPEError, check_records, estimate, record_segments, turn_logprobs
from polyturn.models.actor import load_actor
from tests.serve.conftest import record_sessions

pytestmark = pytest.mark.xdist_group("acting_ope")  # one test process builds the module fixtures, once


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_tokenizer):
    """Two checkpoints, and sessions v1 served at temperature 1 (:func:`record_sessions`)."""
    return record_sessions(tmp_path_factory.mktemp("ope"), tiny_tokenizer)


def test_a_policy_on_its_own_records_weighs_one(recorded):
    ckpts, records = recorded
    assert len(records) == 7 and sum(len(r["turns"]) for r in records) >= 8
    assert any(len(record_segments(r)) == 1 and len(r["turns"]) > 1 for r in records)  # contexts that grow
    assert any(len(record_segments(r)) == 2 for r in records)  # and contexts the context policy rebuilt
    actor = load_actor(ckpts[0] / "actor")
    new = turn_logprobs(actor, records)
    old = [np.array([sum(t["logprobs"]) for t in r["turns"]]) for r in records]
    ratios = np.exp(np.concatenate(new) - np.concatenate(old))
    np.testing.assert_allclose(ratios, 1.0, atol=1e-4)
    rep = estimate(actor, records, policy="v1", n_resamples=200)
    assert rep.ess == pytest.approx(len(records), rel=1e-3)
    assert rep.wis["return"].value == pytest.approx(rep.recorded["return"], abs=1e-3)
    assert rep.wis["success"].value == pytest.approx(rep.recorded["success"], abs=1e-6)
    assert rep.wis["return"].lo <= rep.wis["return"].value <= rep.wis["return"].hi
    assert rep.dr is None and "no critic" in rep.dr_unavailable


def test_another_policy_on_the_records_does_not(recorded):
    ckpts, records = recorded
    rep = estimate(load_actor(ckpts[1] / "actor"), records, policy="v2", n_resamples=200)
    assert rep.mean_abs_log_ratio > 0.05
    assert rep.ess < len(records)


def test_records_without_behaviour_logprobs_are_refused(recorded):
    _, records = recorded
    stripped = [{**r, "turns": [{k: v for k, v in t.items() if k not in ("logprobs", "action_ids")}
                                for t in r["turns"]]} for r in records]
    with pytest.raises(OPEError, match="Expected behaviour log-probs on every turn.*got 7 of 7 episodes"):
        check_records(stripped, source="eval.jsonl")
    greedy = [{**r, "turns": [{**t, "temperature": 0.0} for t in r["turns"]]} for r in records]
    with pytest.raises(OPEError, match="Expected sampled sessions"):
        check_records(greedy, source="x")
    old = [{**r, "turns": [{k: v for k, v in t.items() if k != "context_ids"} for t in r["turns"]]} for r in records]
    with pytest.raises(OPEError, match="record the sessions again"):
        check_records(old, source="x")


def test_doubly_robust_reads_the_checkpoints_separate_critic(recorded, tmp_path, tiny_tokenizer):
    """With the checkpoint's own (untrained) critic, DR on the behaviour's own records is the mean return whatever
    the values; on another policy it differs from WIS. A checkpoint without a separate critic says why there is
    no DR."""
    import shutil

    from polyturn.acting.ope import load_value_critic
    from polyturn.models.critic import build_separate_critic
    from polyturn.models.critic_text import CRITIC_MARKERS
    from polyturn.models.tokenizer import train_tokenizer
    from tests.conftest import CORPUS

    ckpts, records = recorded
    assert load_value_critic(ckpts[0])[0] is None and "holds no critic" in load_value_critic(ckpts[0])[1]
    ckpt = tmp_path / "v2c"
    shutil.copytree(ckpts[1], ckpt)
    tok = train_tokenizer(CORPUS, vocab_size=300, special_tokens=CRITIC_MARKERS)
    build_separate_critic(encoder="scratch", tokenizer=tok, hidden=32, layers=1, heads=2,
                          max_len=128).save_pretrained(ckpt / "critic")
    critic, why = load_value_critic(ckpt)
    assert critic is not None and why == ""
    own = estimate(load_actor(ckpts[0] / "actor"), records, policy="v1", critic=critic, n_resamples=100)
    assert own.dr is not None and own.dr["return"].value == pytest.approx(own.recorded["return"], abs=1e-3)
    other = estimate(load_actor(ckpt / "actor"), records, policy="v2c", critic=critic, n_resamples=100)
    assert other.dr is not None and other.dr["return"].value != pytest.approx(other.wis["return"].value, abs=1e-6)
