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
    assert {"bc", "iter0001", "final"} <= set(ev)  # the curve's points


@pytest.mark.slow
def test_critic_compare_quick_ranks_candidates_with_both_action_critics(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(BENCH.parent)
    _load("critic_compare").main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "priv: " in out and "reads the privileged text" in out and "does not read" in out
    import re

    assert "| turn | states | same favourite |" in out and re.search(r"\n\| \d+ \| \d+ \| [01]\.\d\d \|", out)
