"""The critic benchmarks' --quick modes run end to end (so neither script can rot)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_curve_area_is_the_mean_height_of_the_learning_curve():
    ab = _load("ablation")
    pts = ab.curve({"bc": {"success_rate": 0.2}, "iter0005": {"success_rate": 0.6}, "final": {"success_rate": 0.6}},
                   10)
    assert pts == [(0, 0.2), (5, 0.6), (10, 0.6)]
    assert ab.curve_area(pts) == pytest.approx((5 * 0.4 + 5 * 0.6) / 10)


@pytest.mark.slow
def test_ablation_quick_runs_two_variants_with_a_learning_curve(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(BENCH.parent)
    _load("ablation").main(["--quick", "--config", "configs/negotiation_tiny.yaml", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| action+priv (1 seeds) |" in out and "| none (1 seeds) |" in out
    import json

    ev = json.loads((tmp_path / "none" / "seed0" / "summary.json").read_text())["eval"]
    assert {"iter0001", "final"} <= set(ev) and "bc" not in ev  # the shared BC policy is evaluated once
    bc = json.loads((tmp_path / "bc" / "summary.json").read_text())["eval"]["bc"]["success_rate"]
    assert f"| none (1 seeds) | {bc:.3f} |" in out  # the table's BC column (and the curve's start) read it


def test_bc_start_reads_the_bc_runs_summary_else_its_episodes(tmp_path):
    ab = _load("ablation")
    assert ab.bc_start(tmp_path) is None
    (tmp_path / "eval_bc.jsonl").write_text("".join(f'{{"success": {str(s).lower()}}}\n' for s in (1, 0, 0, 1)))
    assert ab.bc_start(tmp_path) == {"success_rate": 0.5}
    (tmp_path / "summary.json").write_text('{"eval": {"bc": {"success_rate": 0.25, "episodes": 4}}}')
    assert ab.bc_start(tmp_path) == {"success_rate": 0.25, "episodes": 4}


@pytest.mark.slow
def test_critic_compare_quick_ranks_candidates_with_both_action_critics(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(BENCH.parent)
    _load("critic_compare").main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "priv: " in out and "reads the privileged text" in out and "does not read" in out
    import re

    assert "| turn | states | same favourite |" in out and re.search(r"\n\| \d+ \| \d+ \| [01]\.\d\d \|", out)


@pytest.mark.slow
def test_critic_offline_quick_trains_two_critics_on_the_same_held_out_turn_pairs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(BENCH.parent)
    _load("critic_offline").main(["--quick", "--quick-out", str(tmp_path / "bc"), "--pairs", str(tmp_path / "p.pkl")])
    out = capsys.readouterr().out
    import re

    m = re.search(r"(\d+) training pairs, (\d+) held-out pairs", out)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0
    assert re.search(r"\n\| tiny\+priv \| [01]\.\d{3} \| [01]\.\d{3} \| [01]\.\d{3} \|", out)
    assert re.search(r"\n\| tiny \| [01]\.\d{3} \| [01]\.\d{3} \| [01]\.\d{3} \|", out)
    assert (tmp_path / "p.pkl").is_file()
    # The cache is read back: the same pairs, no second play.
    _load("critic_offline").main(["--quick", "--quick-out", str(tmp_path / "bc"), "--pairs", str(tmp_path / "p.pkl")])
    again = capsys.readouterr().out
    assert f"{int(m.group(1)) + int(m.group(2))} turn pairs from" in again and m.group(0) in again
