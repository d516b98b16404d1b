"""``python -m polyturn.demo`` (what ``make demo`` runs), on the tiny test config: it trains, prints BC against
the final policy, the gain and the machine the time was measured on, and keeps its summary; a bad setting is a
one-line error, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from polyturn.demo import main

CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"


def test_demo_prints_bc_against_final_the_gain_and_the_machine(tmp_path, demos, capsys):
    out = tmp_path / "demo"
    assert main(["--config", str(CFG), "--out", str(out), "--set", f"bc.demos={demos}",
                 "--set", "curriculum.ppo_iters=1"]) == 0
    text = capsys.readouterr().out
    assert "Held-out tasks" in text and "BC (phase" in text and "final" in text  # the table (wrapped at 80 columns)
    assert "RL changed greedy held-out success by" in text
    summary = json.loads((out / "demo_summary.json").read_text())
    assert {"bc", "final"} <= set(summary["eval"])
    cap = torch.backends.cpu.get_cpu_capability()
    assert f"({cap}, {summary['machine']['cores']} cores" in text and summary["machine"]["cpu_capability"] == cap


def test_demo_bad_setting_is_a_one_line_error(tmp_path, capsys):
    assert main(["--config", str(CFG), "--out", str(tmp_path / "d"), "--set", "ppo.no_such_key=1"]) == 2
    text = capsys.readouterr().out
    assert text.startswith("error: ") and "no_such_key" in text and "Traceback" not in text
