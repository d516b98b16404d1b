"""Exploration in production: off by default; when on, explored turns are forced, counted and recorded."""

from __future__ import annotations

import httpx
import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.serve.app import create_app
from polyturn.serve.explore import ExploreSettings
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import RunningServer


def _turns(srv, n):
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        outs = [c.post(f"/v1/sessions/{sid}/turns", json={"message": f"hello {k}"}).json() for k in range(n)]
        c.delete(f"/v1/sessions/{sid}")
        return outs, c.get("/metrics").text


def test_exploration_is_off_by_default(checkpoints):
    assert ServeConfig(checkpoints=["x"]).explore.epsilon == 0.0
    with RunningServer(create_app(ServeConfig(checkpoints=[str(checkpoints[0])]))) as srv:
        outs, metrics = _turns(srv, 3)
    assert not any(t["forced"] for o in outs for t in o["turns"])
    assert "polyturn_explorations_total{" not in metrics


def test_explored_turns_are_forced_counted_and_recorded(checkpoints, tmp_path):
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], record_dir=str(tmp_path),
                      explore=ExploreSettings(epsilon=1.0, candidates=3, temperature=1.5, min_mean_logprob=-50.0))
    with RunningServer(create_app(cfg)) as srv:
        outs, metrics = _turns(srv, 3)
    assert all(t["forced"] for o in outs for t in o["turns"])
    assert 'polyturn_explorations_total{arm="v1",result="forced"} 3.0' in metrics
    (rec,) = read_jsonl(tmp_path / "sessions.jsonl")
    for t in rec["turns"]:
        assert t["forced"] and t["explored"]["candidates"] == 3 and t["explored"]["chosen"] is not None
        assert len(t["action_ids"]) == len(t["logprobs"])


def test_confidence_filter_keeps_the_greedy_answer(checkpoints):
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])],
                      explore=ExploreSettings(epsilon=1.0, candidates=3, min_mean_logprob=1.0))  # nothing passes
    with RunningServer(create_app(cfg)) as srv:
        outs, metrics = _turns(srv, 2)
    assert not any(t["forced"] for o in outs for t in o["turns"])
    assert 'polyturn_explorations_total{arm="v1",result="kept_greedy"} 2.0' in metrics


def test_critic_value_gates_exploration(checkpoints, tiny_tokenizer, tmp_path, data_dir):
    """With a critic in the checkpoint and min_value set, states valued below it are not explored."""
    import shutil

    from polyturn.models.critic import build_separate_critic
    from polyturn.models.critic_text import CRITIC_MARKERS
    from polyturn.models.tokenizer import train_tokenizer
    from tests.conftest import CORPUS

    ckpt = tmp_path / "ckpts" / "v1c"
    shutil.copytree(checkpoints[0], ckpt)
    tok = train_tokenizer(CORPUS, vocab_size=300, special_tokens=CRITIC_MARKERS)
    critic = build_separate_critic(encoder="scratch", tokenizer=tok, hidden=32, layers=1, heads=2, max_len=128,
                                   include_privileged=False)  # serving has no privileged text
    critic.save_pretrained(ckpt / "critic")
    results = {}
    for min_value in (-1e9, 1e9):
        cfg = ServeConfig(checkpoints=[str(ckpt)], data_dir=str(data_dir),
                          explore=ExploreSettings(epsilon=1.0, candidates=2, min_mean_logprob=-50.0,
                                                  min_value=min_value))
        with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            assert srv.app.state.service.versions["v1c"].critic is not None
            sid = c.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 1,
                                               "database": "shop.db"}).json()["id"]
            turns = c.post(f"/v1/sessions/{sid}/turns", json={"max_steps": 2}).json()["turns"]
            results[min_value] = ([t["forced"] for t in turns], c.get("/metrics").text)
    assert results[-1e9][0] == [True, True]
    assert results[1e9][0] == [False, False]
    assert 'polyturn_explorations_total{arm="v1c",result="low_value"} 2.0' in results[1e9][1]


def test_a_privileged_critic_gates_serving_only_as_a_labelled_oracle(checkpoints, tmp_path):
    """A critic that reads privileged text is refused at serving unless --explore-oracle-critic says oracle."""
    import shutil

    from polyturn.models.critic import build_separate_critic
    from polyturn.models.critic_text import CRITIC_MARKERS
    from polyturn.models.tokenizer import train_tokenizer
    from polyturn.serve.service import Service
    from tests.conftest import CORPUS

    ckpt = tmp_path / "v1p"
    shutil.copytree(checkpoints[0], ckpt)
    tok = train_tokenizer(CORPUS, vocab_size=300, special_tokens=CRITIC_MARKERS)
    build_separate_critic(encoder="scratch", tokenizer=tok, hidden=32, layers=1, heads=2, max_len=128,
                          include_privileged=True).save_pretrained(ckpt / "critic")
    gate = dict(epsilon=1.0, candidates=2, min_value=0.0)
    with pytest.raises(ValueError, match="unprivileged critic.*--explore-oracle-critic"):
        Service(ServeConfig(checkpoints=[str(ckpt)], explore=ExploreSettings(**gate)))._load_critic(ckpt)
    oracle = ServeConfig(checkpoints=[str(ckpt)], explore=ExploreSettings(**gate, oracle_critic=True))
    assert Service(oracle)._load_critic(ckpt).config.include_privileged
