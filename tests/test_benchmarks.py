"""Every benchmark script runs end to end in its ``--quick`` mode, so none rots unnoticed (the figures mean nothing).

The benchmarks that need a trained run share one ``configs/test_tiny.yaml`` run (``benchmarks/quick.py``),
trained once here and handed to them through ``$POLYTURN_QUICK_RUN``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
pytestmark = pytest.mark.xdist_group("benchmarks")  # the quick_run they share is trained once

# script -> (a line its output must hold, slow?)
QUICK = {
    "critic_beside.py": ("beside / in line, wall time:", False),
    "demo_tree.py": ("polyturn/TwentyQuestions-v0, expert noise 0.0: 16 demonstrations, 16 successful", False),
    "env_results.py": ("| bc | 8 |", False),
    "frozen_bf16.py": ("frozen base stored in bf16", False),
    "gpu_check.sh": ("== 4. SmolLM2", True),
    "judge_loophole.py": ("\ndrop | 0 | 0.", True),
    "offline_algos.py": ("vs BC ", True),
    "kv_cache.py": ("memory ratio before / now:", False),  # its last line: every part ran
    "ope_online.py": ("| tiny | 0.000 ± 0.000 |", True),
    "rollout.py": ("| (c) with the model's own forward |", False),
    "sampler.py": ("| 49152 | 64 |", False),
    "serve_load.py": ("| batched | 2 | 0 |", True),
    "shared_prefix.py": ("the same pair log-probs and gradients in both arms: largest difference", False),
    "subset_steps.py": ("rows running: every column", False),
    "tokenizer.py": ("word BPE, vocabulary 512", False),
    "update.py": ("Policy.update_actor (PPO-clip)", False),
    "value_pretrain.py": ("| pretrained | 0.", True),
}
#: scripts whose --quick run is tested in a test file of their own
ELSEWHERE = {"ablation.py": "tests/test_benchmarks_critic.py", "best_of.py": "tests/test_benchmarks_critic.py", "critic_compare.py": "tests/test_benchmarks_critic.py",
             "critic_offline.py": "tests/test_benchmarks_critic.py",
             "serve_env_sessions.py": "tests/serve/test_serve_env_sessions.py",
             "selfplay.py": "tests/train/test_selfplay.py",
             "hierarchy.py": "tests/train/test_hierarchy.py",
             "refusals.py": "tests/train/test_refusals.py",
             "refusal_fork.py": "tests/train/test_refusals.py",
             "ray_scale.py": "tests/train/test_rollout_workers.py",
             "vllm_rollout.py": "tests/rollout/test_vllm.py",
             "judge_agreement.py": "tests/serve/test_judge_serve.py"}


def test_every_benchmark_has_a_quick_test():
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh") and p.name != "quick.py"}
    assert scripts == set(QUICK) | set(ELSEWHERE), "add the new benchmark's --quick run to QUICK"
    for script, test in ELSEWHERE.items():
        assert f"{script.removesuffix('.py')}" in (ROOT / test).read_text(), f"{test} should run {script} --quick"


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("quick", BENCH / "quick.py")
    quick = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quick)
    return quick.tiny_run(tmp_path_factory.mktemp("quick") / "run")


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if slow else s
                                    for s, (_, slow) in QUICK.items()])
def test_benchmark_runs_in_quick_mode(script, quick_run, tmp_path, monkeypatch, capfd):
    """The shell script in a subprocess; a Python script's ``main()`` in this process (as ``python SCRIPT --quick``
    would run it, without a second interpreter importing torch and transformers again)."""
    src = str(ROOT / "src")
    env = {"POLYTURN_QUICK_RUN": str(quick_run), "PY": sys.executable, "OUT": str(tmp_path / "out"),
           "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    if script.endswith(".sh"):
        done = subprocess.run(["bash", str(BENCH / script), "--quick"], cwd=ROOT, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=600)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
    else:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(ROOT)
        monkeypatch.syspath_prepend(str(BENCH))  # a script's `from quick import tiny_run`
        monkeypatch.setattr(sys, "argv", [str(BENCH / script), "--quick"])
        spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
        threads = torch.get_num_threads()
        try:
            spec.loader.exec_module(module)
            rc = module.main()
        finally:
            torch.set_num_threads(threads)
        out = "".join(capfd.readouterr())
        assert rc in (None, 0), out[-3000:]
    assert QUICK[script][0] in out, out[-3000:]


def test_demo_tree_counts_states_per_turn_and_the_demonstrations_that_disagree():
    spec = importlib.util.spec_from_file_location("bench_demo_tree", BENCH / "demo_tree.py")
    dt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dt)

    def rec(*steps):
        return {"turns": [{"observation": o, "action": a} for o, a in steps]}

    rows = dt.tree([rec(("q", "ask A"), ("yes", "ask B")), rec(("q", "ask A"), ("no", "ask C")),
                    rec(("q", "ask A"), ("no", "ask D"), ("yes", "guess"))], depth=4)
    assert [(r["turn"], r["demos"], r["states"], r["conflicting"]) for r in rows] == [
        (0, 3, 1, 0), (1, 3, 2, 1), (2, 1, 1, 0)]  # after "no" the demonstrations disagree (C or D)
    assert rows[1]["per_state"] == 1.5
    # Twenty Questions' exact expert reads only the answers: a tree, 2**t states at turn t, none disagreeing.
    from polyturn.acting.episodes import generate_demos

    exact = dt.tree(generate_demos("polyturn/TwentyQuestions-v0", episodes=32, noise=0.0, seed=0), depth=3)
    assert [(r["states"], r["conflicting"]) for r in exact] == [(1, 0), (2, 0), (4, 0)]


def test_env_results_finds_demonstrations_a_config_names(tmp_path, monkeypatch, capsys):
    """A run trained with ``bc.demos=<file>`` keeps no demos.jsonl; the TQ normalised score reads the named file."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    spec = importlib.util.spec_from_file_location("env_results", BENCH / "env_results.py")
    er = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(er)
    run = tmp_path / "run"
    run.mkdir()
    demos = list(generate_demos("polyturn/TwentyQuestions-v0", episodes=4, noise=0.0, seed=0))
    write_jsonl(tmp_path / "given.jsonl", demos)
    write_jsonl(run / "eval_bc.jsonl", list(generate_demos("polyturn/TwentyQuestions-v0", episodes=4, noise=0.5,
                                                           seed=100)))
    monkeypatch.setattr(sys, "argv", ["env_results.py", str(run)])
    with pytest.raises(SystemExit, match="bc.demos"):  # neither a demos.jsonl nor a config naming one
        er.main()
    (run / "config.yaml").write_text("bc:\n  demos: given.jsonl\n")  # relative to where it was trained
    monkeypatch.chdir(tmp_path)
    assert er.run_demos(run) == demos
    assert er.main() == 0
    assert "normalised score" in capsys.readouterr().out
