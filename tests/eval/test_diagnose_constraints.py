"""``diagnose``'s constraints section on a synthetic constrained log: costs, limits, margins and multipliers."""

from __future__ import annotations

import json

import pytest

from polyturn.eval.constraints import constraint_terms, summarize_constraints
from polyturn.eval.diagnose import diagnose


def write_log(run, *, constrained: bool) -> None:
    """metrics.jsonl of 8 iterations whose violations fall from 0.5 to 0.15 under a limit of 0.1 (the multiplier
    rising all the way), and whose error responses stay under their limit of 2 (the multiplier stays 0)."""
    lines = [{"phase": "bc", "step": 0, "losses/bc_loss": 2.0}]
    lam = 0.0
    for i in range(8):
        rec = {"phase": "ppo", "iter": i, "step": 10 + i, "charts/success_rate": 0.3, "charts/return_mean": 1.0,
               "reward/outcome/success": 3.0, "losses/value_loss": 1.0, "losses/explained_variance": 0.2}
        if constrained:
            cost = 0.5 - 0.05 * i
            lam += 0.5 * (cost - 0.1)
            rec |= {"constraint/cost/violation/lambda": lam, "constraint/cost/violation/cost": cost,
                    "constraint/cost/violation/margin": 0.1 - cost,
                    "constraint/cost/violation/explained_variance": 0.1 * i,
                    "constraint/cost/error_response/lambda": 0.0, "constraint/cost/error_response/cost": 1.5,
                    "constraint/cost/error_response/margin": 0.5,
                    "constraint/successes_dropped": 1.0}
        lines.append(rec)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_summaries_read_the_last_iteration_and_count_the_iterations_over(tmp_path):
    write_log(tmp_path, constrained=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert constraint_terms(records) == ["cost/violation", "cost/error_response"]
    violation, errors = summarize_constraints(records)
    assert violation.limit == pytest.approx(0.1) and violation.cost == pytest.approx(0.15)
    assert violation.recent_cost == pytest.approx(sum(0.5 - 0.05 * i for i in range(3, 8)) / 5)
    assert violation.over == 8 and violation.iterations == 8 and violation.margin == pytest.approx(-0.05)
    assert violation.multiplier == violation.max_multiplier == pytest.approx(0.5 * sum(0.4 - 0.05 * i for i in range(8)))
    assert violation.explained_variance == pytest.approx(0.7)
    assert errors.over == 0 and errors.multiplier == 0.0 and errors.explained_variance is None


def test_diagnose_shows_a_constraints_section_only_for_a_constrained_run(tmp_path):
    run = tmp_path / "constrained"
    run.mkdir()
    write_log(run, constrained=True)
    diagnose(run, episodes=0)
    md = (run / "diagnose" / "diagnose.md").read_text()
    assert "## Constraints" in md and "| cost/violation | 0.1 | 0.15 |" in md and "| 8/8 |" in md
    assert "| cost/error_response | 2 | 1.5 | 1.5 | 0.5 | 0 | 0 | 0/8 | n/a |" in md
    assert "rft: 8 successes were not imitated for their costs" in md
    assert (run / "diagnose" / "constraints.png").is_file()
    summary = json.loads((run / "diagnose" / "diagnose.json").read_text())["constraints"]
    assert [c["term"] for c in summary] == ["cost/violation", "cost/error_response"] and summary[0]["over"] == 8
    plain = tmp_path / "plain"
    plain.mkdir()
    write_log(plain, constrained=False)
    diagnose(plain, episodes=0)
    assert "Constraints" not in (plain / "diagnose" / "diagnose.md").read_text()
    assert json.loads((plain / "diagnose" / "diagnose.json").read_text())["constraints"] == []
