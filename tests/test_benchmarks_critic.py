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


def test_paired_sign_test_pools_the_seeds_both_variants_finished(tmp_path, capsys):
    ab = _load("ablation")

    def run(variant, seed, solved, finished=True):
        d = tmp_path / variant / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "eval_final.jsonl").write_text("".join(f'{{"seed": {k}, "success": {str(v).lower()}}}\n'
                                                    for k, v in enumerate(solved)))
        if finished:
            (d / "summary.json").write_text('{"eval": {"final": {"success_rate": 0.5, "return_mean": 1.0, '
                                            '"invalid_action_rate": 0.0}}, "wall_s": 60}')

    run("separate+priv", 0, [1, 1, 0, 0])
    run("separate", 0, [1, 0, 1, 0])
    run("separate+priv", 1, [1, 1, 1, 0])
    run("separate", 1, [0, 0, 0, 0])
    run("separate+priv", 2, [1, 1, 1, 1], finished=False)  # still running: left out
    run("separate", 2, [0, 0, 0, 0])
    assert ab.paired(tmp_path, "separate+priv", "separate") == (1 + 3, 1 + 0, 2)
    assert ab.comparisons(["separate+priv", "separate", "none", "action+priv"]) == [
        ("separate+priv", "separate"), ("separate+priv", "none"), ("separate", "none"), ("action+priv", "none")]
    assert ab._sign_p(4, 1) == pytest.approx(0.375)  # two-sided binomial, 5 pairs
    ab.print_table(tmp_path, iters=10, seeds=[0, 1], eval_episodes=4, episodes_per_iter=8)
    assert "| separate+priv | separate | 2 | 4 / 1 | 0.38 |" in capsys.readouterr().out


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
    # A cache played otherwise is refused, not silently reused; averaged labels play and train.
    with pytest.raises(SystemExit, match="was played with"):
        _load("critic_offline").main(["--quick", "--quick-out", str(tmp_path / "bc"), "--pairs",
                                      str(tmp_path / "p.pkl"), "--continuations", "2"])
    _load("critic_offline").main(["--quick", "--quick-out", str(tmp_path / "bc"), "--continuations", "2",
                                  "--tasks", "8", "--states", "4"])  # 8 and 4: 9.4 -> 4.9 s
    avg = capsys.readouterr().out
    assert re.search(r"returns_per_turn [1-9]\.\d{3}, single_label_flipped 0\.\d{3}", avg)
    assert re.search(r"\n\| tiny \| [01]\.\d{3} \| [01]\.\d{3} \| [01]\.\d{3} \|", avg)


@pytest.mark.slow
def test_best_of_quick_plays_the_critics_pick_and_a_random_pick(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(BENCH.parent)
    _load("best_of").main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    import re

    assert re.search(r"\n\| best-of-2, the critic's favourite \| [01]\.\d{3} \| [01]\.\d{3} \| \d+\.\d\d \|", out)
    assert re.search(r"\n\| one of the 2 at random \(plain sampling\) \| [01]\.\d{3} \|", out)
    assert "| action | share of the candidates | share of the critic's picks | score minus its state's mean |" in out
    # The privileged critic is refused without --oracle, with the reason.
    with pytest.raises(SystemExit, match="privileged"):
        _load("best_of").main(["--actor", str(tmp_path / "priv"), "--critic", str(tmp_path / "priv")])


def test_best_of_pick_shares_count_the_critics_favourite_where_candidates_differ():
    bo = _load("best_of")
    from polyturn.envs.actions import format_action

    ask, sql = format_action("ask_user", {"question": "Which?"}, "Ask."), format_action("run_sql", {"sql": "SELECT 1"})
    junk = "Thought: no action"
    states = [[(ask, 0.1), (sql, 0.5)], [(junk, 0.9), (sql, 0.2)], [(ask, 0.3), (ask, 0.3)]]  # the last: all alike
    n, base, picked, offset = bo.pick_shares(states)
    assert n == 2 and picked == {"run_sql": 1, "unparseable": 1}
    assert base == {"ask_user": 0.5, "run_sql": 1.0, "unparseable": 0.5}
    assert offset == pytest.approx({"ask_user": -0.2, "run_sql": (0.2 - 0.35) / 2, "unparseable": 0.35})


def _ep(actions: list[int], rewards: list[float], seed: int = 7):
    from polyturn.rollout.types import Episode, Turn

    turns = [Turn(observation=f"o{j}", action=f"a{a}", action_ids=[a], logprobs=[0.0], reward=r, reward_terms={},
                  terminated=j == len(actions) - 1, truncated=False, info={}, privileged="p", features={})
             for j, (a, r) in enumerate(zip(actions, rewards))]
    return Episode(env_id="e", seed=seed, task_id="t", question="q", level=1, ambiguous=False, key_actions=[],
                   turns=turns)


def test_averaged_labels_merge_attempts_by_turn_and_pair_turns_by_mean_return():
    co = _load("critic_offline")
    from polyturn.rollout.branches import BranchPoint

    # One state (turn 1). Turn 5 was taken twice (returns 1 and 0), turn 6 once (0.5), turn 9 ended the episode.
    orig, b1, b2, b3 = _ep([1, 5, 2], [0, 0, 1]), _ep([1, 5, 3], [0, 0, 0]), _ep([1, 6, 2], [0, 0, .5]), _ep([1, 9], [0, .2])
    point = BranchPoint(0, 1)
    group = co.replayed_group(orig, [b1, b2, b3, _ep([4, 5, 2], [0, 0, 1])], 1)  # the last did not replay turn 0
    assert group == [orig, b1, b2, b3]
    jobs = co.continuation_jobs([group], [point])
    assert [(g, a, co.turn_prefix(first, 1)) for g, a, first in jobs] == [
        (0, (5,), [[1], [5]]), (0, (6,), [[1], [6]])]  # not 9
    # Two continuations a job: turn 5 gets 0 and 0 (mean 1/4), turn 6 gets 1 and 1 (mean 5/6); one of turn 6's
    # did not replay its prefix and is dropped (mean (0.5 + 1) / 2 = 0.75).
    conts = [_ep([1, 5, 2], [0, 0, 0]), _ep([1, 5, 7], [0, 0, 0]), _ep([1, 6, 2], [0, 0, 1]), _ep([1, 8, 2], [0, 0, 1])]
    pairs, seeds, stats = co.averaged_pairs([group], [point], jobs, conts, 2, 0.0)
    better = [p[0].action for p in pairs]
    worse = [p[1].action for p in pairs]
    # means: 5 -> 0.25, 6 -> 0.75, 9 -> 0.2: 6 > 5, 5 > 9, 6 > 9
    assert sorted(zip(better, worse)) == [("a5", "a9"), ("a6", "a5"), ("a6", "a9")]
    assert seeds == [7, 7, 7] and stats["continuations_dropped"] == 1.0
    assert stats["returns_per_turn"] == (4 + 2 + 1) / 3
    # The one-continuation labels of the 5 attempt pairs: orig (5: 1) over b2 (6: 0.5) disagrees with the means,
    # orig over b3 (9: 0.2) agrees; b1 (5: 0) under b2 agrees, under b3 disagrees; b2 over b3 agrees. 2 of 5.
    assert stats["single_label_flipped"] == 0.4
    # A gap drops the pair of 5 (0.25) and 9 (0.2).
    pairs, _, _ = co.averaged_pairs([group], [point], jobs, conts, 2, 0.1)
    assert len(pairs) == 2
