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

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> (a line its output must hold, slow?)
QUICK = {
    "env_results.py": ("| bc | 8 |", False),
    "frozen_bf16.py": ("frozen base stored in bf16", False),
    "gpu_check.sh": ("== 4. SmolLM2", True),
    "rollout.py": ("(c) batched, KV reuse", False),
    "sampler.py": ("| 49152 | 64 |", False),
    "serve_load.py": ("| one at a time | 2 | 0 |", True),
    "tokenizer.py": ("word BPE, vocabulary 512", False),
    "update.py": ("Trainer.update_actor (PPO-clip)", False),
}
#: scripts whose --quick run is tested in a test file of their own
ELSEWHERE = {"ablation.py": "tests/test_benchmarks_critic.py", "critic_compare.py": "tests/test_benchmarks_critic.py",
             "serve_env_sessions.py": "tests/serve/test_serve_env_sessions.py",
             "ray_scale.py": "tests/train/test_rollout_workers.py"}


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
def test_benchmark_runs_in_quick_mode(script, quick_run, tmp_path):
    src = str(ROOT / "src")
    env = {**os.environ, "POLYTURN_QUICK_RUN": str(quick_run), "PY": sys.executable, "OUT": str(tmp_path / "out"),
           "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    cmd = ["bash", str(BENCH / script), "--quick"] if script.endswith(".sh") else \
        [sys.executable, str(BENCH / script), "--quick"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert QUICK[script][0] in out, out[-3000:]
