"""``diagnose`` on a synthetic run: curves, warnings and a real critic check on a tiny checkpoint."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from polyturn.eval.diagnose import calibration_bins, diagnose, discounted_returns
from polyturn.eval.held_out import compare_evaluations
from polyturn.train.critic_check import critic_values


def write_log(run, n: int = 24) -> None:
    """metrics.jsonl of a run whose critic diverges from update 12 and whose return spikes at 7."""
    rng = np.random.default_rng(0)
    lines = [{"phase": "bc", "step": 0, "losses/bc_loss": 2.0}]
    for i in range(n):
        lines.append({
            "phase": "ppo", "iter": i, "step": 10 + i,
            "charts/success_rate": 0.3 + 0.01 * i, "charts/return_mean": 1.0 + 0.05 * i + (5.0 if i == 7 else 0.0),
            "reward/outcome/success": 3.0 + 0.1 * i, "reward/process/valid_call": 0.2 + 0.001 * rng.standard_normal(),
            "losses/value_loss": (2.0 - 0.1 * i) if i < 12 else 0.8 * 1.3 ** (i - 11),
            "losses/explained_variance": 0.2, "losses/approx_kl": 0.01, "losses/clipfrac": 0.1,
            "losses/entropy": 1.5 - 0.01 * i,
        })
    lines.append({"phase": "eval_final", "step": 99, "eval/success_rate": 0.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_helpers():
    assert discounted_returns([1.0, 1.0, 1.0], 0.9) == pytest.approx([2.71, 1.9, 1.0])
    bins = calibration_bins(list(range(100)), [2 * x for x in range(100)], bins=4)
    assert len(bins) == 4 and sum(b[2] for b in bins) == 100
    assert all(g == pytest.approx(2 * v) for v, g, _ in bins)


def test_diagnose_run_with_a_critic_check(tmp_path, ckpt_run):
    run = tmp_path / "run"
    shutil.copytree(ckpt_run, run)
    write_log(run)
    calls = []
    res = diagnose(run, episodes=4, progress=calls.append, critic_values=critic_values)
    assert sum(calls) == 4
    kinds = {(w.kind, w.metric) for w in res.warnings}
    assert ("critic_divergence", "losses/value_loss") in kinds
    assert ("reward_spike", "charts/return_mean") in kinds
    assert not any(k == "reward_hacking" for k, _ in kinds)  # success rises: no hacking
    # The untrained actor repeats one token: collapse is seen in the validation text.
    assert any(w.kind == "collapse" and w.metric == "actions" for w in res.warnings)
    c = res.critic
    assert c is not None and c.episodes == 4 and c.checkpoint.endswith("ckpt-b")
    assert np.isfinite(c.mse) and len(c.values) == len(c.returns) > 0
    assert len(c.tables) == 2
    for _, rows in c.tables:
        g = [r["G"] for r in rows]
        for t in range(len(rows) - 1):  # G_t = r_t + gamma G_{t+1}
            assert g[t] == pytest.approx(rows[t]["reward"] + c.gamma * g[t + 1])
    out = run / "diagnose"
    assert {p.name for p in out.iterdir()} >= {"diagnose.md", "diagnose.json", "rewards.png", "training.png",
                                               "calibration.png"}
    md = (out / "diagnose.md").read_text()
    for text in ("## Warnings", "critic_divergence", "remedy:", "## Critic check", "V_target vs V(S)", "TD target",
                 "![](./rewards.png)"):
        assert text in md
    summary = json.loads((out / "diagnose.json").read_text())
    assert summary["critic"]["episodes"] == 4 and summary["warnings"]


def test_diagnose_without_checkpoint_or_critic(tmp_path, ckpt_run):
    run = tmp_path / "bare"
    run.mkdir()
    write_log(run)
    res = diagnose(run, episodes=2, out_dir=tmp_path / "out", critic_values=critic_values)
    assert res.critic is None
    assert "no checkpoint" in (tmp_path / "out" / "diagnose.md").read_text()

    none_run = tmp_path / "none"
    shutil.copytree(ckpt_run / "ckpt-a", none_run / "ckpt-a")
    cfg = (none_run / "ckpt-a" / "config.yaml").read_text().replace("kind: separate", "kind: none")
    (none_run / "ckpt-a" / "config.yaml").write_text(cfg)
    write_log(none_run)
    res = diagnose(none_run, episodes=2, critic_values=critic_values)
    assert res.critic is None and "critic.kind none" in (none_run / "diagnose" / "diagnose.md").read_text()


def test_diagnose_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        diagnose(tmp_path)
    write_log(tmp_path)
    with pytest.raises(FileNotFoundError, match="ckpt-nope"):
        diagnose(tmp_path, checkpoint="ckpt-nope")


def _record(seed: int, success: bool, *, level: int | None = None, turns: int = 2, invalid: int = 0) -> dict:
    """An episode record as the trainer's evaluations write it (``Episode.to_record``), reduced to what is read."""
    rec = {"env_id": "polyturn/SQLAnalyst-v0", "seed": seed, "success": success, "return": 5.0 if success else -5.0,
           "turns": [{"action": "x", "info": {"action_valid": i >= invalid}} for i in range(turns)]}
    if level is not None:
        rec["level"] = level
    return rec


def test_diagnose_pairs_the_held_out_evaluations_of_bc_and_final(tmp_path, capsys):
    """Paired on the task seed: gained, lost, the exact sign test, metrics as the trainer sums them, by level."""
    run = tmp_path / "run"
    run.mkdir()
    write_log(run)
    # 12 tasks at two levels. BC solves seeds 0-3; final solves 0-2 and 4-10: 7 gained (4-10), 1 lost (3).
    bc = [_record(s, s < 4, level=1 + s % 2, invalid=1 if s == 0 else 0) for s in range(12)]
    final = [_record(s, s < 3 or 4 <= s <= 10, level=1 + s % 2, turns=3) for s in reversed(range(12))]
    for name, recs in (("eval_bc", bc), ("eval_final", final)):
        (run / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    machine = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "cores": 2, "rollout_threads": 1, "train_threads": 2}
    (run / "summary.json").write_text(json.dumps({"wall_s": 700.0, "phase_s": {"bc": 120.0, "rl": 540.0},
                                                  "machine": machine}))
    res = diagnose(run, episodes=0)
    (c,) = res.held_out
    assert (c.before, c.after, c.episodes, c.gained, c.lost) == ("bc", "final", 12, 7, 1)
    assert c.p_value == pytest.approx(2 * (1 + 8) / 2 ** 8)  # P(min <= 1) of Binomial(8, 1/2), doubled
    assert c.metrics["success_rate"] == (pytest.approx(4 / 12), pytest.approx(10 / 12))
    assert c.metrics["return_mean"][0] == pytest.approx((4 * 5 - 8 * 5) / 12)
    assert c.metrics["turns_mean"] == (2.0, 3.0)
    assert c.metrics["invalid_action_rate"] == (pytest.approx(1 / 24), 0.0)
    # Even seeds are level 1 (BC solves 0, 2; final 0-10), odd ones level 2 (BC 1, 3; final 1, 5, 7, 9).
    assert c.by_level == [("1", 6, 2, 6), ("2", 6, 2, 4)]
    md = (run / "diagnose" / "diagnose.md").read_text()
    assert "## Held-out: BC against final" in md and "7 solved only by final, 1 only by bc" in md
    assert "| 2 | 6 | 2 | 4 |" in md
    assert "## Wall time per phase" in md and "| rl | 9.0 |" in md
    assert "measured on AMD EPYC (AVX2, 2 cores; torch threads 1 sampling, 2 training)." in md
    summary = json.loads((run / "diagnose" / "diagnose.json").read_text())["held_out"][0]
    assert summary["gained"] == 7 and summary["metrics"]["success_rate"]["final"] == pytest.approx(10 / 12)
    # The command prints the comparison's line.
    from polyturn.cli import main

    capsys.readouterr()
    assert main(["diagnose", "--run", str(run), "--episodes", "0"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "held-out bc -> final (12 tasks): success 0.333 -> 0.833, 7 gained / 1 lost, sign test p 0.0703" in err


def test_held_out_comparison_pairs_only_shared_tasks():
    bc = [_record(s, True) for s in range(4)]
    final = [_record(s, s != 2) for s in range(2, 8)]
    c = compare_evaluations(bc, final, tags=("bc", "final"))
    assert c is not None and c.episodes == 2 and (c.gained, c.lost) == (0, 1)
    assert c.by_level == [] and c.p_value == 1.0  # no level in the records; one lost task is no evidence
    assert compare_evaluations(bc, [_record(9, True)], tags=("bc", "final")) is None


def test_diagnose_says_when_the_run_has_no_pair_of_held_out_evaluations(tmp_path):
    write_log(tmp_path)
    (tmp_path / "eval_bc.jsonl").write_text(json.dumps(_record(0, True)) + "\n")  # still training: no final yet
    res = diagnose(tmp_path, episodes=0)
    assert res.held_out == []
    assert "No pair of held-out evaluations" in (tmp_path / "diagnose" / "diagnose.md").read_text()
