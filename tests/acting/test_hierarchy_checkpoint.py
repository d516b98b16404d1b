"""Acting with a hierarchical checkpoint: both policies loaded, every task played with the manager setting the
worker's subgoals, the worker's episodes returned; through run_actor, ``polyturn evaluate``, ``play`` and
``diagnose``, on the hand-trained checkpoint (tests.serve.conftest.hierarchical_checkpoint) and on one a tiny
hierarchical training run writes."""

from __future__ import annotations

import json
import shutil

import pytest

from polyturn.acting.checkpoint import load_checkpoint, run_actor
from polyturn.acting.jsonl import read_jsonl
from polyturn.cli import build_parser, main, run_command
from tests.serve.conftest import LIST_TABLES, SUBGOAL_DONE

pytestmark = pytest.mark.xdist_group("serve_hierarchy")  # with the serving tests: one process trains the checkpoint
SQL = "polyturn/SQLAnalyst-v0"
INSPECT = "Subgoal: Inspect the schema of the tables the question needs."


def test_run_actor_plays_both_policies_of_a_hierarchical_checkpoint_and_returns_the_workers_episodes(
        hierarchical_ckpt):
    ckpt = load_checkpoint(hierarchical_ckpt)
    assert ckpt.manager is not None and ckpt.actor_dir == hierarchical_ckpt / "roles" / "worker" / "actor"
    # Tasks 1 and 3, played with k 2 in training: the manager sets `inspect`, the worker lists the tables, declares
    # the subgoal done, gets it again and lists them again, when the task's two env turns run out.
    eps = run_actor(ckpt, [{"seed": 1}, {"seed": 3}], temperature=0.0, seed=0)
    for ep, seed in zip(eps, (1, 3)):
        assert ep.seed == seed and ep.role == "worker" and ep.policy == hierarchical_ckpt.name
        assert [t.action for t in ep.turns] == [LIST_TABLES, SUBGOAL_DONE, LIST_TABLES]
        assert ep.turns[0].observation.endswith(f"\n{INSPECT}") and ep.turns[2].observation == INSPECT
        assert [t.info["subgoal_index"] for t in ep.turns] == [0, 0, 1] and ep.truncated


def test_evaluate_and_play_take_a_hierarchical_checkpoint(hierarchical_ckpt, tmp_path, capsys):
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"env": SQL, "seed": s, "env_kwargs": {"max_turns": 2}} for s in (1, 3)]))
    assert run_command(build_parser().parse_args([
        "evaluate", "--policy_checkpoint", str(hierarchical_ckpt), "--test_cases", str(cases),
        "--out", str(tmp_path / "ev"), "--embedder", "none"])) == 0
    recs = list(read_jsonl(tmp_path / "ev" / "episodes" / f"{hierarchical_ckpt.name}.jsonl"))
    assert [r["seed"] for r in recs] == [1, 3] and all(r["role"] == "worker" for r in recs)
    assert all([t["action"] for t in r["turns"]] == [LIST_TABLES, SUBGOAL_DONE, LIST_TABLES] for r in recs)
    assert all([t["info"]["subgoal_index"] for t in r["turns"]] == [0, 0, 1] for r in recs)
    assert (tmp_path / "ev" / "report.md").is_file()
    assert main(["play", "--policy", str(hierarchical_ckpt), "--env", SQL, "--env-kwargs", '{"max_turns": 2}',
                 "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert INSPECT in out and "subgoal_done" in out


def test_a_hierarchical_run_is_evaluated_and_diagnosed_from_its_directory(tmp_path, hier_sql_run):
    """The layout a tiny hierarchical training run writes loads as both policies; ``diagnose`` plays the worker
    with its manager and checks the worker's critic (roles/worker/critic) on its episodes."""
    import shutil

    shutil.copytree(hier_sql_run, tmp_path, dirs_exist_ok=True)  # diagnose writes into the run directory
    ckpt = load_checkpoint(tmp_path)  # the run directory: its latest checkpoint
    assert ckpt.manager is not None and ckpt.actor_dir == tmp_path / "ckpt-final" / "roles" / "worker" / "actor"
    eps = run_actor(ckpt, [{"seed": 10}, {"seed": 11}], temperature=0.0, seed=0)
    assert [ep.role for ep in eps] == ["worker", "worker"] and [ep.seed for ep in eps] == [10, 11]
    assert main(["diagnose", "--run", str(tmp_path), "--episodes", "2"]) == 0
    assert (tmp_path / "diagnose" / "diagnose.md").is_file()


def test_a_hierarchical_checkpoint_missing_a_policy_is_refused_with_the_fix(hierarchical_ckpt, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(hierarchical_ckpt, broken)
    shutil.rmtree(broken / "roles")
    with pytest.raises(FileNotFoundError, match=r"worker's actor in .*roles/worker/actor .*hierarchy:"):
        load_checkpoint(broken)
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"env": SQL, "seed": 1}]))
    assert main(["evaluate", "--policy_checkpoint", str(broken), "--test_cases", str(cases),
                 "--out", str(tmp_path / "ev"), "--embedder", "none"]) == 2
    err = capsys.readouterr().err
    assert "roles/worker/actor" in err and "Traceback" not in err
    ckpt = load_checkpoint(hierarchical_ckpt)
    with pytest.raises(ValueError, match="best_of 1 for the hierarchical checkpoint"):
        ckpt.collector([], env_id=SQL, best_of=2)
