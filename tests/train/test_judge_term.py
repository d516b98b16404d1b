"""The LLM judge as an online reward term (config ``judge``), against a real local HTTP judge."""

from __future__ import annotations

import pytest

from polyturn.acting.episodes import generate_demos
from polyturn.acting.jsonl import read_jsonl
from polyturn.config import ConfigError, load_config
from polyturn.train.judge_term import JudgeTerm, check_judge
from polyturn.train.logger import read_metrics
from polyturn.train.offline_data import JUDGE_TERM, record_episode
from polyturn.train.trainer import Trainer
from tests.acting.judge_server import JudgeServer, oracle

SQL = "polyturn/SQLAnalyst-v0"


def test_the_term_is_added_to_each_episode_and_agreement_is_measured(tmp_path):
    records = list(generate_demos(SQL, episodes=6, noise=0.5, seed=10))
    eps = [record_episode(r, []) for r in records]
    before = [ep.episode_return for ep in eps]
    bad = records[1]["question"]
    judge = oracle(records, yes="Right.\nScore: 10", no="Not right.\nScore: 1")
    with JudgeServer(lambda p: "I cannot say." if bad in p else judge(p)) as srv:
        cfg = load_config(None, [f"judge.endpoint={srv.url}", "judge.model=j", "judge.weight=2.0"]).judge
        m = JudgeTerm(cfg, out_dir=tmp_path).apply(eps)
        assert len(srv.prompts) == 6 and (tmp_path / "judge_cache.jsonl").is_file()
    terms = [ep.turns[-1].reward_terms[JUDGE_TERM] for ep in eps]
    assert terms[1] == 0.0 and m["judge/malformed"] == 1.0  # on_malformed: skip
    assert all(t in (0.0, 2.0) for t in terms)
    assert [ep.episode_return - b for ep, b in zip(eps, before)] == pytest.approx(terms)
    assert [t == 2.0 for i, t in enumerate(terms) if i != 1] == [r["success"] for i, r in enumerate(records) if i != 1]
    assert any(r["success"] for r in records) and not all(r["success"] for r in records)
    assert m["judge/cached"] == 0.0 and m["judge/agreement"] == 1.0 and m["judge/auc"] == 1.0
    assert m["judge/paid"] == 1.0
    # The guard: under judge.guard=drop a judge_hacking warning in the run's log stops the payment, not the judging.
    with JudgeServer(judge) as srv:
        warned = ["entropy_collapse:policy/entropy", "judge_hacking:judge/score_mean"]
        drop = load_config(None, [f"judge.endpoint={srv.url}", "judge.model=j", "judge.guard=drop"]).judge
        fresh = [record_episode(r, []) for r in records]
        m2 = JudgeTerm(drop, out_dir=tmp_path / "g").apply(fresh, warned=warned)
        assert [ep.turns[-1].reward_terms[JUDGE_TERM] for ep in fresh] == [0.0] * 6
        assert [ep.episode_return for ep in fresh] == pytest.approx(before)
        assert m2["judge/paid"] == 0.0 and m2["judge/agreement"] == 1.0 and len(srv.prompts) == 6
        assert JudgeTerm(drop, out_dir=tmp_path / "g").apply(fresh[:1], warned=warned[:1])["judge/paid"] == 1.0
        warn = load_config(None, [f"judge.endpoint={srv.url}", "judge.model=j"]).judge  # guard: warn, the default
        assert JudgeTerm(warn, out_dir=tmp_path / "w").apply(fresh[:1], warned=warned)["judge/paid"] == 1.0
    # on_malformed: stop names the episode.
    with JudgeServer(lambda p: "I cannot say.") as srv:
        cfg = load_config(None, [f"judge.endpoint={srv.url}", "judge.model=j", "judge.on_malformed=stop"]).judge
        with pytest.raises(ValueError, match=r"judging the training episode of task '.*' \(seed 10\): Expected"):
            JudgeTerm(cfg, out_dir=tmp_path / "b").apply(eps[:1])


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"judge.model: required"):
        load_config(None, ["judge.weight=1"])
    with pytest.raises(ConfigError, match=r"judge.weight = -1"):
        load_config(None, ["judge.model=j", "judge.weight=-1"])
    with pytest.raises(ConfigError, match=r"judge.guard = 'drop' acts on the live check's judge_hacking warning, "
                                          r"got run.diagnose_every = 0"):
        load_config(None, ["judge.model=j", "judge.guard=drop", "run.diagnose_every=0"])
    with pytest.raises(ValueError, match="judge: the judge term runs in one process, got 2 torchrun processes"):
        check_judge(load_config(None, ["judge.model=j"]).judge, world_size=2)
    # An endpoint that does not answer is refused when the run starts, not at its first RL iteration.
    with pytest.raises(ValueError, match=r"judge.endpoint: Expected an OpenAI-compatible server at "
                                         r"http://127.0.0.1:9/v1, could not reach it"):
        JudgeTerm(load_config(None, ["judge.model=j", "judge.endpoint=http://127.0.0.1:9/v1"]).judge, out_dir=tmp_path)


def test_a_run_pays_and_logs_the_judge_term(tmp_path, make_cfg):
    with JudgeServer(lambda p: "Not right.\nScore: 1") as srv:  # a judge that calls every episode a failure
        cfg = make_cfg(tmp_path / "run", f"judge.endpoint={srv.url}", "judge.model=judge-1", "judge.weight=1.0",
                       "curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "curriculum.ppo_iters=2")
        Trainer(cfg).run()
        assert len(srv.prompts) >= 8  # every training episode (repeats of a conversation come from the cache)
    rl = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("phase") == "ppo"]
    assert len(rl) == 2
    for r in rl:
        assert "reward/judge/score" in r and "judge/agreement" in r and r["perf/judge_s"] > 0
        assert r["reward/judge/score"] == pytest.approx(r["judge/score_mean"])  # weight 1
        assert r["reward/judge/score"] == 0.0  # a score of 1 pays 0
        assert r["judge/agreement"] == pytest.approx(1.0 - r["charts/success_rate"])  # right on the failures only
    assert len(read_jsonl(tmp_path / "run" / "judge_cache.jsonl")) == len(srv.prompts)
