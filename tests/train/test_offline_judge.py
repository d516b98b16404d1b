"""Offline data scored by ``polyturn judge``: the judge's score as the return of episodes with no known outcome."""

from __future__ import annotations

import json

import pytest

from polyturn.acting.jsonl import write_jsonl
from polyturn.config import ConfigError, load_config
from polyturn.train.logger import read_metrics
from polyturn.train.offline_data import (JUDGE_TERM, data_summary, read_offline_data, record_episode, summary_lines,
                                         summary_metrics)
from polyturn.train.trainer import Trainer

SQL = "polyturn/SQLAnalyst-v0"


def _record(seed: int, *, ended: bool, success: bool = False, judge: float | None = None) -> dict:
    """A two-turn SQL record; ``ended``: its last turn terminated (a known outcome), else a session closed
    mid-episode."""
    turns = [{"observation": "q", "action": "Action: list_tables[{}]", "reward": -0.01,
              "reward_terms": {"penalty/turn_cost": -0.01}, "terminated": False, "truncated": False},
             {"observation": "sales", "action": "Final Answer: 1" if ended else "Action: describe_table[sales]",
              "reward": (10.0 if success else -5.0) if ended else -0.01, "reward_terms": {},
              "terminated": ended, "truncated": False}]
    rec = {"env_id": SQL, "seed": seed, "task_id": f"t{seed}", "success": success, "question": "q", "turns": turns,
           "final_observation": "done"}
    rec["return"] = sum(t["reward"] for t in turns)
    return rec | ({"judge": judge, "judge_score": round(1 + 9 * judge)} if judge is not None else {})


def test_a_judged_record_without_an_outcome_ends_with_the_judge_term(tmp_path):
    recs = [_record(0, ended=False, judge=1.0), _record(1, ended=False, judge=0.0), _record(2, ended=False),
            _record(3, ended=True, success=True, judge=0.8), _record(4, ended=True, success=False, judge=0.3),
            _record(5, ended=True, success=False, judge=0.6)]
    write_jsonl(tmp_path / "judged.jsonl", recs)
    data = read_offline_data([str(tmp_path / "judged.jsonl")], env_id=SQL, judge_range=(-5.0, 10.0))
    assert data.judge_term == [True, True, False, False, False, False]
    last = [r["turns"][-1] for r in data.records]
    assert last[0]["reward_terms"][JUDGE_TERM] == 10.0 and last[0]["reward"] == pytest.approx(9.99)
    assert last[1]["reward_terms"][JUDGE_TERM] == -5.0 and data.records[1]["return"] == pytest.approx(-5.02)
    assert all(JUDGE_TERM not in t.get("reward_terms", {}) for t in last[2:])  # no score, or a known outcome
    assert data.records[3]["return"] == pytest.approx(9.99)
    ep = record_episode(data.records[0], [])
    assert ep.episode_return == pytest.approx(9.98) and ep.turns[-1].reward_terms[JUDGE_TERM] == 10.0
    s = data_summary(data)
    assert (s["judged"], s["judge_term"], s["no_outcome_unjudged"]) == (5, 2, 1)
    a = s["judge_agreement"]
    assert a["n"] == 3 and a["auc"] == 1.0 and a["accuracy"] == pytest.approx(2 / 3)  # 0.6 on a failure: wrong
    lines = summary_lines(s, SQL)
    assert "  judge: 5 episodes scored, 2 without a known outcome end with the term judge/score" in lines
    assert any(ln.startswith("  judge agreement with the known outcomes on 3 episodes: accuracy 0.667, AUC 1.000")
               for ln in lines)
    assert any("1 episodes have no known outcome and no judge score" in ln for ln in lines)
    m = summary_metrics(s)
    assert m["offline/data_judge_term"] == 2.0 and m["judge/auc"] == 1.0
    assert m["judge/agreement"] == pytest.approx(2 / 3)
    # offline.judge: false leaves the rewards as recorded.
    off = read_offline_data([str(tmp_path / "judged.jsonl")], env_id=SQL)
    assert not any(off.judge_term) and off.records[0]["return"] == pytest.approx(-0.02)


def test_config_checks_the_judge_range(tmp_path):
    cfg = load_config(None, ["offline.data=x.jsonl", "offline.judge_range=[0, 1]"])
    assert cfg.offline.judge and cfg.offline.judge_range == (0.0, 1.0)
    with pytest.raises(ConfigError, match=r"offline.judge_range: Expected \[low, high\] with low < high"):
        load_config(None, ["offline.data=x.jsonl", "offline.judge_range=[3, -1]"])


def test_offline_training_reads_judged_sessions(tmp_path, make_cfg):
    from polyturn.acting.episodes import generate_demos

    # Sessions closed before their answer (no outcome), judged by whether the answer would have been right.
    sessions = []
    for rec in generate_demos(SQL, episodes=8, noise=0.5, seed=200):
        if len(rec["turns"]) < 2:
            continue
        turns = rec["turns"][:-1]
        turns[-1] = {**turns[-1], "terminated": False, "truncated": False}
        sessions.append({**rec, "turns": turns, "return": sum(t["reward"] for t in turns),
                         "judge": 1.0 if rec["success"] else 0.0, "success": False})
    write_jsonl(tmp_path / "judged.jsonl", sessions)
    cfg = make_cfg(tmp_path / "run", f"offline.data={json.dumps([str(tmp_path / 'judged.jsonl')])}",
                   "offline.algo=awr", "offline.critic_epochs=1", "offline.epochs=1", "offline.batch_episodes=8",
                   "curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0")
    Trainer(cfg).run()
    first = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert first["phase"] == "offline_data" and first["offline/data_judge_term"] == len(sessions)
    assert first["offline/data_return_max"] > 9.0  # a judged success's return is the judge's 10
