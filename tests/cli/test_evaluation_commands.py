"""The evaluation subcommands (evaluate, make-test-cases, rate, diagnose), run as ``polyturn.cli.main`` runs them."""

from __future__ import annotations

import json

import pytest

from polyturn.cli import COMMANDS, build_parser, run_command


def run(argv: list[str]) -> int:
    """``main`` without its one-line error handling, so a test sees the exception."""
    return run_command(build_parser().parse_args(argv))


def test_all_four_commands_are_registered():
    assert {"evaluate", "make-test-cases", "rate", "diagnose"} <= set(COMMANDS)
    args = build_parser().parse_args(["evaluate", "--policy_checkpoint", "a", "b", "expert", "--test_cases", "c.json",
                                      "--visualize", "--temperature", "0.7", "--seed", "3", "--num_envs", "2"])
    assert args.policy_checkpoint == ["a", "b", "expert"] and args.visualize and args.temperature == 0.7
    assert args.out == "eval_report" and args.num_envs == 2 and args.command == "evaluate"


def test_make_test_cases_evaluate_and_rate_from_the_command_line(tmp_path, ckpt_run):
    cases = tmp_path / "cases.jsonl"
    assert run(["make-test-cases", "--seeds", "0:3", "--out", str(cases), "--env_kwargs", '{"max_turns": 3}']) == 0
    assert len(cases.read_text().splitlines()) == 3
    assert run(["evaluate", "--policy_checkpoint", str(ckpt_run / "ckpt-a"), "--test_cases", str(cases),
                "--out", str(tmp_path / "ev_a"), "--embedder", "none"]) == 0
    assert run(["evaluate", "--policy_checkpoint", "expert", "--test_cases", str(cases),
                "--out", str(tmp_path / "ev_x"), "--embedder", "none"]) == 0
    assert (tmp_path / "ev_a" / "report.md").is_file() and not (tmp_path / "ev_a" / "report.html").exists()
    ratings = tmp_path / "ratings.jsonl"
    assert run(["rate", "--pairs", str(tmp_path / "ev_a"), str(tmp_path / "ev_x"), "--judge", "heuristic",
                "--out", str(ratings)]) == 0
    recs = [json.loads(x) for x in ratings.read_text().splitlines()]
    assert len(recs) == 3 and {r["a_policy"] for r in recs} == {"ckpt-a"} and {r["b_policy"] for r in recs} == {"expert"}
    assert all(r["rater"] == "heuristic" for r in recs)


def test_user_mistakes_raise_clear_errors(tmp_path):
    (tmp_path / "cases.json").write_text('[{"env": "polyturn/SQLAnalyst-v0", "seed": 1}]')
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run(["evaluate", "--policy_checkpoint", str(tmp_path / "nope"), "--test_cases", str(tmp_path / "cases.json"),
             "--out", str(tmp_path / "o")])
    with pytest.raises(FileNotFoundError, match="test-case file"):
        run(["evaluate", "--policy_checkpoint", "expert", "--test_cases", str(tmp_path / "missing.json")])
    with pytest.raises(ValueError, match="A:B"):
        run(["make-test-cases", "--seeds", "3:1", "--out", str(tmp_path / "x.jsonl")])
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        run(["diagnose", "--run", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="evaluate output directory"):
        run(["rate", "--pairs", str(tmp_path / "a"), str(tmp_path / "b"), "--judge", "heuristic"])
