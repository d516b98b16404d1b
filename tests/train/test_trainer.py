"""End to end: every phase on a tiny config, checkpoints in HF format, resume continues the run."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from polyturn.config import load_config
from polyturn.runtime import resident_bytes
from polyturn.train.logger import read_metrics
from polyturn.train.trainer import NonFiniteError, Trainer

CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"


def _cfg(tmp_path, demos, *extra):  # demos: the session fixture of tests/train/conftest.py
    return load_config(CFG, [f"run.out_dir={tmp_path}", f"bc.demos={demos}", *extra])


@pytest.mark.slow
def test_train_all_phases_then_resume(tmp_path, demos):
    cfg = _cfg(tmp_path, demos, "curriculum.ppo_iters=1")
    summary = Trainer(cfg).run()
    assert gc.get_freeze_count() == 0  # the run froze its long-lived objects (runtime.long_lived_frozen) and let go
    assert set(summary["eval"]) == {"bc", "final"}
    spent = summary["phase_s"]  # wall seconds per phase, as they ran
    assert list(spent) == ["bc", "eval_bc", "rl", "eval_final"] and all(v > 0 for v in spent.values())
    assert sum(spent.values()) <= summary["wall_s"] + 0.1
    machine = json.loads((tmp_path / "summary.json").read_text())["machine"]  # what the timings were measured on
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and machine["cpu"]
    assert machine["cores"] >= 1 and machine["torch"] == torch.__version__ and "gpu" not in machine
    recs = read_metrics(tmp_path / "metrics.jsonl")
    phases = [r["phase"] for r in recs]
    for p in ("bc", "eval_bc", "warmup", "mixed", "ppo", "eval_final"):
        assert p in phases
    rl = [r for r in recs if r["phase"] in ("warmup", "mixed", "ppo")]
    for key in ("charts/success_rate", "losses/value_loss", "losses/explained_variance", "perf/turns_per_s",
                "reward/outcome/success", "schedule/gamma"):
        assert key in rl[-1], key
    for key in ("losses/approx_kl", "losses/clipfrac", "losses/entropy", "losses/policy_loss", "grad/actor_norm"):
        assert key in rl[-1], key
    assert "losses/bc_loss" in [r for r in rl if r["phase"] == "mixed"][0]
    if resident_bytes() is not None:  # resident memory after each iteration, and what the C heap handed back
        assert all(r["perf/rss_gb"] > 0 and r["perf/released_gb"] >= 0 for r in rl)
    # Checkpoints are standard HF directories.
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    final = tmp_path / "ckpt-final"
    AutoModelForCausalLM.from_pretrained(final / "actor")
    AutoTokenizer.from_pretrained(final / "actor")
    AutoModel.from_pretrained(final / "critic" / "encoder")
    assert (final / "config.yaml").is_file() and (final / "optim.pt").is_file()
    assert (tmp_path / "latest").read_text() == "ckpt-final"

    # Resume with one more PPO iteration: it continues at iteration 3 with the saved task counter.
    state = json.loads((tmp_path / "ckpt-iter0003" / "trainer_state.json").read_text())
    cfg2 = _cfg(tmp_path, demos, "curriculum.ppo_iters=2")
    (tmp_path / "latest").write_text("ckpt-iter0003")
    tr = Trainer(cfg2, resume=True)
    assert tr.state.iter == 3 and tr.state.task_counter == state["task_counter"]
    saved = torch.load(tmp_path / "ckpt-iter0003" / "optim.pt", weights_only=False)
    assert tr.policy.opt.state_dict()["state"].keys() == saved["actor"]["state"].keys()
    w_saved = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt-iter0003" / "actor").state_dict()
    for k, v in tr.actor.model.state_dict().items():
        assert torch.equal(v, w_saved[k])
    resumed = tr.run()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    iters = [r["iter"] for r in recs if r["phase"] in ("warmup", "mixed", "ppo")]
    assert iters == [0, 1, 2, 3]
    # The phase times saved with iteration 3 carry over: BC's is the first run's, RL's grows by iteration 4.
    assert resumed["phase_s"]["bc"] == pytest.approx(state["phase_s"]["bc"], abs=0.1)
    assert resumed["phase_s"]["rl"] > state["phase_s"]["rl"] > 0


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, demos):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(_cfg(tmp_path, demos), resume=True)


def test_a_second_run_in_a_run_directory_is_refused_unless_overwrite(tmp_path, demos):
    no_rl = ("curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0", "env.eval_episodes=2")
    run = tmp_path / "run"
    Trainer(_cfg(run, demos, *no_rl)).run()
    (run / "notes.txt").write_text("mine")
    log = (run / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match=r"already holds a run \(ckpt-bc, .*latest, metrics.jsonl, summary.json\)"
                                              r": pass --resume to continue it, --overwrite"):
        Trainer(_cfg(run, demos, *no_rl))
    assert (run / "metrics.jsonl").read_text() == log and (run / "ckpt-bc" / "actor").is_dir()  # untouched
    Trainer(_cfg(run, demos, *no_rl), overwrite=True).run()
    recs = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in recs if r["phase"] == "bc"][:1] == [0]
    assert sum(r["phase"] == "eval_bc" for r in recs) == 1  # one run's records, not two
    assert (run / "notes.txt").read_text() == "mine" and (run / "summary.json").is_file()
    with pytest.raises(ValueError, match="got both"):
        Trainer(_cfg(run, demos, *no_rl), resume=True, overwrite=True)


def test_clear_run_removes_only_what_a_run_wrote(tmp_path):
    from polyturn.train.checkpoint import clear_run, earlier_run

    assert earlier_run(tmp_path / "missing") == [] and earlier_run(tmp_path) == []
    for name in ("metrics.jsonl", "summary.json", "latest", "config.yaml", "demos.jsonl", "eval_bc.jsonl",
                 "notes.txt", "eval_notes.md"):
        (tmp_path / name).write_text("x")
    for name in ("ckpt-bc/actor", "ckpt-iter0001.tmp", "rank1", "tb", "mine"):
        (tmp_path / name).mkdir(parents=True)
    assert earlier_run(tmp_path) == ["ckpt-bc", "ckpt-iter0001.tmp", "latest", "metrics.jsonl", "summary.json"]
    clear_run(tmp_path, keep=tmp_path / "demos.jsonl")  # the demonstrations the new run reads stay
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.jsonl", "eval_notes.md", "mine", "notes.txt"]


def test_nonfinite_loss_is_skipped_or_stops(tmp_path, demos):
    tr = Trainer(_cfg(tmp_path / "a", demos))
    before = {k: v.clone() for k, v in tr.actor.model.state_dict().items()}
    opt = torch.optim.SGD(tr.actor.trainable_parameters(), lr=1.0)
    loss = sum(p.sum() for p in tr.actor.trainable_parameters()) * float("nan")
    ok, _ = tr.policy.step(loss, opt, tr.actor.trainable_parameters(), 1.0, where="test")
    assert not ok and tr.state.skipped == 1
    for k, v in tr.actor.model.state_dict().items():
        assert torch.equal(v, before[k])
    tr2 = Trainer(_cfg(tmp_path / "b", demos, "run.on_nonfinite=stop"))
    with pytest.raises(NonFiniteError, match="test"):
        tr2.policy.step(torch.tensor(float("inf"), requires_grad=True), opt, tr2.actor.trainable_parameters(), 1.0, where="test")


@pytest.mark.parametrize(
    "extra",
    [
        ["critic.kind=shared"],
        ["critic.kind=none", "critic.group_size=2"],
        # A2C has no KL term (the PPO + KL path: tests/train/test_pretrained_path.py).
        ["critic.target=td", "critic.q=true", "critic.features=true", "ppo.algo=a2c",
         "curriculum.epsilon.start=0.5", "curriculum.ent_coef.start=0.01",
         "curriculum.stages=[{from_progress: 0.0, levels: [1], max_turns: 4, tools: [list_tables, run_sql, submit_answer]}]"],
    ],
    ids=["shared", "none", "td-q-features-a2c-stages"],
)
def test_critic_kinds_and_options_run(tmp_path, demos, extra):
    cfg = _cfg(tmp_path, demos, *extra, "curriculum.warmup_iters=1", "curriculum.mixed_iters=0",
               "curriculum.ppo_iters=1", "env.eval_episodes=2")
    tr = Trainer(cfg)
    summary = tr.run()
    assert summary["eval"]["final"]["episodes"] == 2
    recs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["phase"] == "ppo"]
    assert recs and "losses/actor_loss" in recs[0]
    if "critic.target=td" in extra:
        assert tr.critic.replay and "losses/q_loss" not in recs[0]  # TD path trains V on the replay buffer
        assert (tmp_path / "ckpt-final" / "replay.pt").is_file()
        # The curriculum stage's turn limit applies to training episodes.
        assert all(r["charts/turns_mean"] <= 4 for r in recs)


def test_a_run_without_rl_evaluates_once_and_eval_start_false_skips_the_start(tmp_path, demos, monkeypatch):
    from polyturn.train.evaluation import HeldOut

    calls = []
    evaluate = HeldOut.run

    def counted(self, tag, *, temperature):
        calls.append(tag)
        return evaluate(self, tag, temperature=temperature)

    monkeypatch.setattr(HeldOut, "run", counted)
    no_rl = ("curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0", "env.eval_episodes=3")
    summary = Trainer(_cfg(tmp_path / "bc", demos, *no_rl)).run()
    assert calls == ["bc"]  # the final policy is the BC policy: its evaluation is recorded twice, sampled once
    assert summary["eval"]["final"] == summary["eval"]["bc"]
    bc = [json.loads(line) for line in (tmp_path / "bc" / "eval_bc.jsonl").read_text().splitlines()]
    final = [json.loads(line) for line in (tmp_path / "bc" / "eval_final.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in final] == ["final"] * 3 and [{**r, "policy": "bc"} for r in final] == bc
    assert any(r["phase"] == "eval_final" for r in read_metrics(tmp_path / "bc" / "metrics.jsonl"))
    calls.clear()
    start = tmp_path / "bc" / "ckpt-bc"
    one = ("curriculum.warmup_iters=1", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0", "env.eval_episodes=3")
    summary = Trainer(_cfg(tmp_path / "rl", demos, *one, f"actor.init_from={start}", "run.eval_start=false")).run()
    assert calls == ["final"] and set(summary["eval"]) == {"final"}
