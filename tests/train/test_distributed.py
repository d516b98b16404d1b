"""Data-parallel training under torchrun (2 processes, gloo on CPU) against one process on the same batch."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from polyturn.train.trainer import Trainer

HERE = Path(__file__).parent
SRC = str(HERE.parents[1] / "src")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def test_two_processes_step_like_one_on_the_same_batch(tmp_path, make_cfg, demos):
    """One learn() (critic + mixed BC/PPO step) on one global batch: 2 gloo processes end at one process's weights."""
    tr = Trainer(make_cfg(tmp_path / "collect"))
    tasks = [{"seed": 700 + i, "options": {}} for i in range(8)]
    eps = tr.collector.collect(tasks, temperature=1.0, epsilon=0.0, rng=tr.rng, generator=tr.gen)
    batch = tmp_path / "episodes.pkl"
    batch.write_bytes(pickle.dumps(eps))
    script = str(HERE / "dp_learn.py")
    runs = {}
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        args = [str(out), str(demos), str(batch), str(out / "w.pt")]
        if nproc == 1:  # in this process: the same code as each torchrun rank runs, without a process group
            spec = importlib.util.spec_from_file_location("dp_learn", script)
            dp_learn = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(dp_learn)
            threads = torch.get_num_threads()
            try:
                dp_learn.learn_once(*args)
            finally:
                torch.set_num_threads(threads)
        else:
            res = subprocess.run(_torchrun(nproc, script, *args), env=_env(), capture_output=True, text=True,
                                 timeout=600)
            assert res.returncode == 0, res.stderr[-3000:]
        runs[nproc] = torch.load(out / "w.pt")
    start = tr.actor.model.state_dict()
    moved = 0
    for part in ("actor", "critic"):
        one, two = runs[1][part], runs[2][part]
        for k, v in one.items():
            torch.testing.assert_close(two[k], v, rtol=0, atol=2e-6, msg=f"{part}.{k}")
    for k, v in runs[1]["actor"].items():
        moved += int(not torch.equal(v, start[k]))
    assert moved > 0  # the update did change the actor


@pytest.mark.slow
def test_resume_with_a_different_process_count(tmp_path, make_cfg, demos):
    """Two processes train one RL iteration (rank 0 checkpoints); one process resumes and runs the next."""
    extra = ["curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "env.eval_episodes=2", "run.device=cpu"]
    sets = [a for kv in [f"run.out_dir={tmp_path}", f"bc.demos={demos}", *extra, "curriculum.ppo_iters=1"]
            for a in ("--set", kv)]
    cmd = [sys.executable, "-m", "polyturn.cli", "train", "--nproc", "2",
           "--config", str(HERE.parents[1] / "configs" / "test_tiny.yaml"), *sets]
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "ckpt-iter0001").is_dir() and not (tmp_path / "rank1" / "ckpt-iter0001").exists()
    assert (tmp_path / "rank1" / "metrics.jsonl").is_file()  # rank 1 logged apart
    tr = Trainer(make_cfg(tmp_path, *extra, "curriculum.ppo_iters=2"), resume=True)
    assert tr.state.iter == 1
    tr.run()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows if r.get("phase") == "ppo"] == [0, 1]
    assert (tmp_path / "ckpt-iter0002" / "actor").is_dir()
