"""The LLM judge's hacking guard: its score rising while success does not, on planted metrics logs, through
``polyturn diagnose``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polyturn.cli import main
from polyturn.health import checks as C
from polyturn.health.judge import check_judge_hacking


def judged_run(*, judge_rises: bool, success_rises: bool, n: int = 30, episodes: int = 32, seed: int = 0) -> list[dict]:
    """A run's RL records as the trainer logs them with a judge (weight 2): binomial success of ``episodes`` per
    iteration, the judge's mean score and its agreement with the outcome."""
    rng = np.random.default_rng(seed)
    out = [{"phase": "bc", "step": 0, "losses/bc_loss": 1.0}]
    for i in range(n):
        p = 0.3 + (0.4 * i / n if success_rises else 0.0)
        k = rng.binomial(episodes, p)
        # The judge follows success, plus (planted) a drift the policy found: a score it gives regardless.
        drift = 0.5 * max(0, i - 10) / (n - 10) if judge_rises else 0.0
        score = min(1.0, 0.2 + 0.6 * k / episodes + drift + 0.02 * rng.standard_normal())
        out.append({"phase": "ppo", "iter": i, "step": 10 + i, "charts/episodes": float(episodes),
                    "charts/success_rate": k / episodes, "reward/outcome/success": 10 * k / episodes,
                    "reward/outcome/failure": -5 * (episodes - k) / episodes, "judge/score_mean": score,
                    "reward/judge/score": 2 * score, "judge/agreement": 0.8 - drift * 0.6,
                    "judge/auc": 0.85 - drift * 0.5})
        out[-1]["charts/return_mean"] = sum(v for key, v in out[-1].items() if key.startswith("reward/"))
    return out


def test_a_judge_score_rising_while_success_stays_flat_warns():
    (w,) = check_judge_hacking(judged_run(judge_rises=True, success_rises=False))
    assert w.kind == "judge_hacking" and w.metric == "judge/score_mean"
    assert w.evidence["score_z"] >= 3 and w.evidence["score_after"] - w.evidence["score_before"] >= 0.1
    assert "while the success rate went" in w.message and "agreement with the outcome went" in w.message
    assert w.evidence["agreement_after"] < w.evidence["agreement_before"]
    assert "judge.weight" in w.remedy and w.plot == "rewards.png"
    # The judge's term is its own check's: the generic shaping-term check does not repeat it.
    assert C.check_reward_hacking(judged_run(judge_rises=True, success_rises=False)) == []
    assert [x.kind for x in C.check_all(judged_run(judge_rises=True, success_rises=False))] == ["judge_hacking"]


def test_a_judge_logged_only_as_its_reward_term_is_read_too():
    recs = [{k: v for k, v in r.items() if k != "judge/score_mean"} for r in judged_run(judge_rises=True,
                                                                                         success_rises=False)]
    (w,) = check_judge_hacking(recs)
    assert w.metric == "reward/judge/score"


@pytest.mark.parametrize("seed", range(5))
def test_no_warning_when_success_rises_with_the_judge_or_nothing_moves(seed):
    assert check_judge_hacking(judged_run(judge_rises=False, success_rises=True, seed=seed)) == []
    assert check_judge_hacking(judged_run(judge_rises=False, success_rises=False, seed=seed)) == []
    assert check_judge_hacking([{"phase": "ppo", "iter": i, "charts/success_rate": 0.5} for i in range(20)]) == []


def _write(run, records) -> None:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_polyturn_diagnose_warns_on_a_planted_judge_loophole_only(tmp_path, capsys):
    _write(tmp_path / "hacked", judged_run(judge_rises=True, success_rises=False))
    _write(tmp_path / "healthy", judged_run(judge_rises=False, success_rises=True))
    assert main(["diagnose", "--run", str(tmp_path / "hacked"), "--episodes", "0"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "judge_hacking [judge/score_mean] the LLM judge's judge/score_mean rose" in said
    assert "the policy may be pleasing the judge" in said
    assert main(["diagnose", "--run", str(tmp_path / "healthy"), "--episodes", "0"]) == 0
    assert "judge_hacking" not in capsys.readouterr().err
