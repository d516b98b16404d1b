"""A user's mistake ends in one ``error:`` line and exit status 2, never a traceback: every command's bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest

from polyturn.cli import main

NO_EXPERT_ENV = "polyturn-test/NoExpert-v0"  # a real env whose id has no scripted expert


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Paths the bad inputs point at: an empty directory, broken JSON(L), a run with a broken log ..."""
    d = tmp_path_factory.mktemp("bad-inputs")
    (d / "empty").mkdir()
    (d / "bad.jsonl").write_text('{"a": 1}\n{"b": \n', encoding="utf-8")
    (d / "binary.jsonl").write_bytes(b"\xff\xfe\x00 not text")
    (d / "bad.yaml").write_text("ppo: [\n", encoding="utf-8")
    (d / "cases.json").write_text(json.dumps([{"env": "polyturn/SQLAnalyst-v0", "seed": 1}]), encoding="utf-8")
    (d / "a_file").write_text("x", encoding="utf-8")
    (d / "run_bad_log").mkdir()
    (d / "run_bad_log" / "metrics.jsonl").write_text('{"phase": "bc"}\nnot json\n', encoding="utf-8")
    (d / "run").mkdir()
    (d / "run" / "metrics.jsonl").write_text('{"phase": "bc", "step": 0}\n', encoding="utf-8")
    (d / "ckpt_no_model" / "actor").mkdir(parents=True)
    (d / "ckpt_broken" / "actor").mkdir(parents=True)
    (d / "ckpt_broken" / "actor" / "config.json").write_text("{}", encoding="utf-8")
    if NO_EXPERT_ENV not in gymnasium.registry:
        gymnasium.register(NO_EXPERT_ENV, entry_point="polyturn.envs.sql.env:SQLAnalystEnv")
    return {k: str(d / k) for k in ("empty", "bad.jsonl", "binary.jsonl", "bad.yaml", "cases.json", "a_file",
                                    "run_bad_log", "run", "ckpt_no_model", "ckpt_broken")} | {"dir": str(d)}


# (argv with {name} placeholders for `files`, a fragment the error line must contain)
CASES = [
    # play
    (["play", "--policy", "expert", "--env", "polyturn/Nope-v0"], "Expected a registered env id"),
    (["play", "--policy", "expert", "--env", NO_EXPERT_ENV], "scripted expert"),
    (["play", "--env-kwargs", "{bad"], "Expected a JSON object"),
    (["play", "--env-kwargs", "[1]"], "Expected a JSON object"),
    (["play", "--env-kwargs", '{"nope": 1}'], "unexpected keyword argument 'nope'"),
    (["play", "--policy", "{empty}"], "to hold actor/"),
    (["play", "--policy", "{dir}/no_such_checkpoint"], "does not exist"),
    (["play", "--policy", "{ckpt_no_model}"], "Expected a saved actor"),
    (["play", "--policy", "{ckpt_broken}"], "Expected a loadable actor"),
    (["play", "--episodes", "-1"], "Expected a value >= 1, got -1"),
    (["play", "--policy", "noisy", "--noise", "1.5"], "in [0, 1]"),
    (["play", "--temperature", "-0.5"], "Expected a value >= 0"),
    # demos
    (["demos", "--out", "{empty}", "--episodes", "1"], "got the directory"),
    (["demos", "--out", "{dir}/d.jsonl", "--episodes", "-3"], "Expected a value >= 0, got -3"),
    (["demos", "--out", "{dir}/d.jsonl", "--env", "polyturn/Nope-v0"], "Expected a registered env id"),
    (["demos", "--out", "{dir}/d.jsonl", "--env", NO_EXPERT_ENV], "scripted expert"),
    (["demos", "--out", "{dir}/d.jsonl", "--env", "polyturn/TwentyQuestions-v0", "--hierarchy", "4"],
     "to offer subgoals"),
    (["demos", "--out", "{dir}/d.jsonl", "--hierarchy", "0"], "Expected a value >= 1, got 0"),
    (["demos", "--out", "{dir}/d.jsonl", "--seed", "x"], "Expected an integer, got 'x'"),
    (["demos", "--out", "{dir}/d.jsonl", "--expert-options", '{"name_candidates": 3}'],
     "Expected options of SQLExpert from"),
    (["demos", "--out", "{dir}/d.jsonl", "--expert-options", "[3]"], "JSON object"),
    (["demos", "--out", "{dir}/d.jsonl", "--group-shares", '{"forbidden": 0.5}'], "Expected --balance-by"),
    (["demos", "--out", "{dir}/d.jsonl", "--balance-by", "intent", "--group-shares", '{"a": 0.5}'],
     "breakdowns []"),
    (["demos", "--out", "{dir}/d.jsonl", "--env", "polyturn/CustomerService-v0", "--balance-by", "intent",
      "--group-shares", '{"forbidden": 0.7, "track": 0.7}'], "sum to at most 1"),
    (["train", "--set", "bc.group_shares={forbidden: 0.3}"], "bc.group_shares needs bc.balance_by"),
    (["train", "--set", "bc.balance_by=intent", "--set", "bc.group_shares={forbidden: 0}"], "bc.group_shares"),
    (["train", "--set", "bc.balance_by=intent", "--set", "bc.group_shares={forbidden: 0.3}", "--set",
      "bc.demos=d.jsonl"], "remove one of them"),
    (["train", "--set", "curriculum.group_shares={forbidden: 0.3}"], "curriculum.group_shares needs"),
    (["train", "--set", "ppo.error_unlikelihood=0.5"], "ppo.error_unlikelihood = 0.5 has no effect with ppo.algo = 'ppo'"),
    (["train", "--set", "run.out_dir={dir}/t2", "--set", "curriculum.balance_by=intent", "--set",
      "curriculum.group_shares={forbidden: 0.3}"], "breakdowns []"),
    # train
    (["train", "--config", "{dir}/missing.yaml"], "Config file not found"),
    (["train", "--config", "{bad.yaml}"], "not valid YAML"),
    (["train", "--set", "ppo.clip=abc"], "ppo.clip"),
    (["train", "--set", "ppo.clip"], "Expected --set key=value"),
    (["train", "--log-every", "0"], "Expected a value >= 1, got 0"),
    (["train", "--resume", "--set", "run.out_dir={dir}/t0"], "no checkpoint"),
    (["train", "--set", "run.out_dir={run}"], "already holds a run (metrics.jsonl): pass --resume"),
    (["train", "--resume", "--overwrite", "--set", "run.out_dir={run}"], "got both"),
    (["train", "--set", "run.out_dir={dir}/t1", "--set", "bc.demos={bad.jsonl}"], "bad.jsonl:2: Expected a JSON object"),
    # evaluate
    (["evaluate", "--policy_checkpoint", "expert", "--test_cases", "{dir}/missing.json"], "Expected a test-case file"),
    (["evaluate", "--policy_checkpoint", "expert", "--test_cases", "{binary.jsonl}"], "not UTF-8"),
    (["evaluate", "--policy_checkpoint", "expert", "--test_cases", "{bad.jsonl}"], "bad.jsonl:2"),
    (["evaluate", "--policy_checkpoint", "{empty}", "--test_cases", "{cases.json}"], "to hold actor/"),
    (["evaluate", "--policy_checkpoint", "expert", "--test_cases", "{cases.json}", "--num_envs", "0"],
     "Expected a value >= 1"),
    (["evaluate", "--policy_checkpoint", "expert", "--test_cases", "{cases.json}", "--out", "{a_file}"],
     "Expected --out to be a directory"),
    # make-test-cases
    (["make-test-cases", "--seeds", "5:2", "--out", "{dir}/c.jsonl"], "Expected seeds A:B with 0 <= A < B"),
    (["make-test-cases", "--seeds", "abc", "--out", "{dir}/c.jsonl"], "Expected seeds as A:B"),
    (["make-test-cases", "--seeds", "0:2", "--out", "{dir}/c.jsonl", "--env", "polyturn/Nope-v0"],
     "Expected a registered env id"),
    (["make-test-cases", "--seeds", "0:2", "--out", "{dir}/c.jsonl", "--env_kwargs", '{"nope": 2}'],
     "unexpected keyword argument 'nope'"),
    (["make-test-cases", "--seeds", "0:2", "--out", "{empty}"], "got the directory"),
    # rate
    (["rate", "--pairs", "{dir}/nope_a", "{dir}/nope_b", "--judge", "heuristic"], "evaluate output directory"),
    (["rate", "--pairs", "{bad.jsonl}", "{bad.jsonl}", "--judge", "heuristic"], "bad.jsonl:2: Expected a JSON object"),
    (["rate", "--pairs", "{empty}", "{empty}", "--judge", "heuristic"], "Expected episode JSONL files"),
    (["rate", "--pairs", "{bad.jsonl}", "{bad.jsonl}", "--port", "70000"], "in [0, 65535]"),
    # diagnose
    (["diagnose", "--run", "{empty}"], "metrics.jsonl"),
    (["diagnose", "--run", "{run_bad_log}", "--episodes", "0"], "metrics.jsonl:2: Expected a JSON object"),
    (["diagnose", "--run", "{run}", "--checkpoint", "ckpt-nope"], "holding actor/"),
    # Checked before the server starts (these failed at startup with a traceback, or started a server).
    (["serve", "--checkpoint", "{dir}"], "to hold actor/"),
    (["serve", "--checkpoint", "{ckpt_broken}", "--max-sessions", "0"], "--max-sessions: expected >= 1"),
    (["serve", "--checkpoint", "{ckpt_broken}", "--max-body-bytes", "-5"], "--max-body-bytes: expected >= 1"),
    (["serve", "--checkpoint", "{ckpt_broken}", "--data-dir", "{dir}/nope"], "--data-dir: expected a directory"),
    (["serve", "--checkpoint", "{ckpt_broken}", "--checkpoint-dir", "{dir}/nope"], "--checkpoint-dir: expected"),
    (["diagnose", "--run", "{run}", "--episodes", "-1"], "Expected a value >= 0, got -1"),
    (["diagnose", "--run", "{run}", "--out", "{a_file}"], "Expected --out to be a directory"),
]


def fill(arg: str, files: dict[str, str]) -> str:
    """Replace ``{name}`` by the path of ``files[name]`` (JSON arguments keep their braces)."""
    for name, path in files.items():
        arg = arg.replace("{" + name + "}", path)
    return arg


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``polyturn ARGV`` in this process: (exit status, stderr). Argument errors exit through argparse."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "fragment"), CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_bad_input_ends_in_one_error_line(argv, fragment, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a failing command might write lands in the repository
    rc, err = run_main([fill(a, files) for a in argv], capsys)
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error:" in last and fragment in last, err


def test_the_installed_command_prints_no_traceback(tmp_path):
    """The issue's example, through the real console script: gymnasium's NameNotFound becomes one line."""
    exe = Path(sys.executable).with_name("polyturn")
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "polyturn.cli"]
    res = subprocess.run([*cmd, "play", "--policy", "expert", "--env", "polyturn/Nope-v0"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "60"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Expected a registered env id"), res.stderr
    assert "polyturn/SQLAnalyst-v0" in lines[0]  # the message names the ids that exist


def test_diagnose_without_a_run_prints_its_error_before_any_progress_bar(tmp_path, capsys):
    rc = main(["diagnose", "--run", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 2 and "metrics.jsonl" in captured.err
    assert "validation episodes" not in captured.out + captured.err


def test_python_dash_m_polyturn_is_the_command(tmp_path):
    """``python -m polyturn`` (no console script needed) runs the same command as ``polyturn``."""
    src = Path(__file__).resolve().parents[2] / "src"
    res = subprocess.run([sys.executable, "-m", "polyturn", "play", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(src)})
    assert res.returncode == 0 and res.stdout.startswith("usage: polyturn play"), res.stdout + res.stderr
    assert "--server URL" in res.stdout
