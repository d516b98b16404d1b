"""polyturn tournament: checkpoints of a multi-role game against training and evaluation-only partners in every
seat, and head to head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polyturn.acting.checkpoint import load_checkpoint
from polyturn.cli import main
from polyturn.eval.tournament import Arena, against_partners, figures, head_to_head, holdout_partners
from polyturn.rollout.types import Episode, Turn

NEG = "polyturn/Negotiation-v0"
CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"


@pytest.fixture(scope="module")
def neg_ckpt(tmp_path_factory) -> Path:
    """A tiny Negotiation checkpoint (BC only) trained against scripted partners (single-agent kwargs)."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl
    from polyturn.config import load_config
    from polyturn.train.trainer import Trainer

    d = tmp_path_factory.mktemp("tour")
    write_jsonl(d / "demos.jsonl", generate_demos(NEG, episodes=16, noise=0.3, seed=0))
    Trainer(load_config(CFG, [f"run.out_dir={d / 'run'}", f"bc.demos={d / 'demos.jsonl'}", f"env.id={NEG}",
                              "rollout.max_action_tokens=32", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
                              "curriculum.ppo_iters=0", "env.eval_episodes=2"])).run()
    return d / "run" / "ckpt-final"


def _ep(role: str, ret: float, deal: dict | None) -> Episode:
    ep = Episode(env_id=NEG, seed=0, task_id="t", question="q", level=0, ambiguous=False, key_actions=[], role=role)
    ep.turns.append(Turn(observation="o", action="a", action_ids=[1], logprobs=[0.0], reward=ret, reward_terms={},
                         terminated=True, truncated=False, info={"success": ret >= 5, "deal": deal},
                         privileged="", features={}))
    return ep


def test_figures_by_hand():
    made = {"deal": True, "joint": 12, "max_joint": 16, "pareto_optimal": True, "fairness": 0.5}
    none = {"deal": False, "joint": 0, "max_joint": 16, "pareto_optimal": False, "fairness": None}
    f = figures([_ep("first", 8.0, made), _ep("first", 0.0, none)])
    assert f == {"games": 2.0, "success_rate": 0.5, "return_mean": 4.0, "deal_rate": 0.5,
                 "joint_efficiency": 12 / 16 / 2, "pareto_rate": 0.5, "fairness": 0.5}


def test_partners_in_every_seat_and_a_policy_against_itself(neg_ckpt):
    ckpt = load_checkpoint(neg_ckpt)
    arena = Arena(env_id=NEG, env_kwargs={"opponent": "self"}, seed_start=ckpt.config.env.eval_seed_start, num_envs=8)
    held = holdout_partners(NEG)
    assert {"tit_for_tat", "random_concession"} <= set(held)
    table = against_partners(ckpt, arena, held, episodes=6)
    assert set(table) == set(held) and all(set(t) == {"first", "second"} for t in table.values())
    assert all(t[r]["games"] == 6 and "deal_rate" in t[r] for t in table.values() for r in t)
    twin = load_checkpoint(neg_ckpt)
    wins = head_to_head([ckpt, twin], arena, episodes=5)
    # The same policy in both seats of mirrored games: each side wins exactly the other's losses.
    assert wins[0][0] is None and wins[0][1] == pytest.approx(0.5) and wins[1][0] == pytest.approx(0.5)


def test_the_command_writes_the_report_and_refuses_a_single_agent_form(neg_ckpt, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(neg_ckpt.parent, run)
    for entry in ("iter0000", "iter0005"):  # a pool as self-play writes it
        shutil.copytree(neg_ckpt / "actor", run / "pool" / entry / "agent")
    assert main(["tournament", "--checkpoint", str(run), "--out", str(tmp_path / "t")]) == 2
    assert "multi-role form" in capsys.readouterr().err
    code = main(["tournament", "--checkpoint", str(run), "--pool", str(run), "--env-kwargs", '{"opponent": "self"}',
                 "--episodes", "3", "--matrix-episodes", "2", "--out", str(tmp_path / "t")])
    assert code == 0
    out = json.loads((tmp_path / "t" / "tournament.json").read_text())
    assert out["labels"][1:] == ["pool iter0000", "pool iter0005"] and set(out["holdout"]) >= {"tit_for_tat"}
    assert (tmp_path / "t" / "head_to_head.png").stat().st_size > 1000
    md = (tmp_path / "t" / "tournament.md").read_text()
    assert "tit_for_tat (evaluation only)" in md and "Head to head" in md


def test_partner_restricts_the_table_and_an_unknown_one_is_refused(neg_ckpt, tmp_path, capsys):
    args = ["tournament", "--checkpoint", str(neg_ckpt), "--env-kwargs", '{"opponent": "self"}', "--episodes", "2",
            "--out", str(tmp_path / "t")]
    assert main([*args, "--partner", "tit_for_tat", "--partner", "bluffer"]) == 2
    err = capsys.readouterr().err
    assert "bluffer" in err and "random_concession" in err and "Traceback" not in err
    assert main([*args, "--partner", "tit_for_tat", "--partner", "fair"]) == 0
    partners = json.loads((tmp_path / "t" / "tournament.json").read_text())["partners"]
    assert [set(t) for t in partners.values()] == [{"tit_for_tat", "fair"}]
