"""Rollout workers on a real local Ray instance (started once for the module): episodes, weights, faults, runs."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]

from polyturn.rollout.collector import Collector  # noqa: E402
from polyturn.rollout.workers import WorkerPool, trainable_weights  # noqa: E402
from polyturn.acting.checkpoint import rollout_settings  # noqa: E402
from polyturn.train.setup import make_envs  # noqa: E402
from polyturn.train.bc_phase import behaviour_cloning
from polyturn.train.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray")  # one test process builds the module fixtures, once


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # 4 logical CPUs (Ray schedules by them, it does not pin): the pool fixture's 2 workers and a run's 2 fit.
    # Workers at the tests' own priority: Ray starts them at nice 15 by default, and beside the suite's other test
    # processes a worker's start (torch and polyturn imports) then took 48 s instead of 6.
    before = os.environ.get("RAY_worker_niceness")
    os.environ["RAY_worker_niceness"] = "0"
    ray.init(num_cpus=4, object_store_memory=80 * 1024**2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()
    if before is None:
        os.environ.pop("RAY_worker_niceness", None)
    else:
        os.environ["RAY_worker_niceness"] = before


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_cfg):
    """A BC-trained tiny actor and its config (the trainer's own, in-process)."""
    cfg = make_cfg(tmp_path_factory.mktemp("bc"))
    tr = Trainer(cfg)
    behaviour_cloning(tr.policy, logger=tr.logger, rep=tr.rep, extra={})
    tr.actor.model.eval()
    return tr


@pytest.fixture(scope="module")
def pool(trained):
    """Two workers of 4 environments each, started once for the module's pool tests."""
    cfg = trained.cfg
    p = WorkerPool(actor=trained.actor, make_envs=functools.partial(make_envs, cfg), num_envs=cfg.rollout.num_envs,
                   num_workers=2, env_id=cfg.env.id, settings=rollout_settings(cfg))
    yield p
    p.close()


def _tokens(eps):
    return [[(t.action_ids, t.logprobs, t.reward, t.info.get("success")) for t in ep.turns] for ep in eps]


def test_worker_episodes_equal_the_in_process_collector(trained, pool):
    """A chunk played on a worker is the in-process collector's result on the same tasks and seed, token for token."""
    tr = trained
    tasks = [{"seed": 500 + i, "options": {}} for i in range(4)]
    eps = pool.gather(pool.submit(tasks, temperature=1.0, epsilon=0.1, seed=7))
    torch.set_num_threads(1)  # as the worker runs (run.rollout_threads): same float sums, same samples
    local = Collector(tr.actor, make_envs(tr.cfg, 4), env_id=tr.cfg.env.id, settings=rollout_settings(tr.cfg))
    ref = local.collect(tasks, temperature=1.0, epsilon=0.1, rng=np.random.default_rng(7),
                        generator=torch.Generator().manual_seed(7))
    assert [ep.seed for ep in eps] == [t["seed"] for t in tasks]
    assert _tokens(eps) == _tokens(ref)
    assert [s.ids for ep in eps for s in ep.segments] == [s.ids for ep in ref for s in ep.segments]
    assert [s.logprobs for ep in eps for s in ep.segments] == [s.logprobs for ep in ref for s in ep.segments]
    assert [[t.forced for t in ep.turns] for ep in eps] == [[t.forced for t in ep.turns] for ep in ref]
    assert {t.version for ep in eps for t in ep.turns} == {pool.version}


def test_killed_worker_is_restarted_and_its_chunks_replayed(pool):
    """SIGKILL a worker mid-rollout: it restarts, its unfinished chunks are played again, nothing lost or doubled."""
    tasks = [{"seed": 600 + i, "options": {}} for i in range(8)]  # a chunk of 4 on each worker
    clean = pool.gather(pool.submit(tasks, temperature=1.0, epsilon=0.0, seed=3))
    pool.take_stats()
    pid = pool.call(1, "pid")
    ticket = pool.submit(tasks, temperature=1.0, epsilon=0.0, seed=3)
    deadline = time.time() + 60
    while not pool.call(1, "collecting") and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # worker 1 is inside its first chunk (each takes ~1 s here)
    os.kill(pid, signal.SIGKILL)
    eps = pool.gather(ticket)
    assert pool.take_stats().restarts == 1
    assert pool.call(1, "pid") != pid
    assert [ep.seed for ep in eps] == [t["seed"] for t in tasks]  # each task once, in order
    assert _tokens(eps) == _tokens(clean)  # replayed chunks: same seed, same weights, same episodes


def test_broadcast_makes_worker_weights_equal_the_learners(trained, pool):
    tr = trained
    before = pool.call(0, "weights")
    v0 = pool.version
    with torch.no_grad():
        for p in tr.actor.model.parameters():
            p.add_(0.01)
    try:
        assert pool.broadcast(tr.actor) == v0 + 1
        learner = trainable_weights(tr.actor)
        for i in range(2):
            got = pool.call(i, "weights")
            assert got.keys() == learner.keys()
            assert all(torch.equal(got[k], learner[k]) for k in learner)
            assert pool.call(i, "version") == v0 + 1
        assert not all(torch.equal(before[k], learner[k]) for k in learner)
        eps = pool.gather(pool.submit([{"seed": 1}, {"seed": 2}], temperature=1.0, epsilon=0.0, seed=1))
        assert {t.version for ep in eps for t in ep.turns} == {v0 + 1}
    finally:
        with torch.no_grad():
            for p in tr.actor.model.parameters():
                p.sub_(0.01)


def test_a_worker_that_cannot_start_or_keeps_dying_stops_the_run_with_its_error(trained, tmp_path):
    """Workers fronting vLLM: a missing vLLM environment is refused before any worker starts, and a worker whose
    server fails at start fails the pool's start with the server's error. A worker that dies ``max_deaths`` times in
    a row without finishing a chunk stops the gather with its error instead of being restarted forever."""
    cfg = trained.cfg
    kw = dict(actor=trained.actor, make_envs=functools.partial(make_envs, cfg), num_envs=2, num_workers=1,
              env_id=cfg.env.id, settings=rollout_settings(cfg))
    with pytest.raises(ValueError, match="vLLM's virtual environment at .*no-venv.*make vllm-venv"):
        WorkerPool(**kw, vllm={"python": str(tmp_path / "no-venv" / "python")}, vllm_dir=tmp_path / "vllm")
    fake = tmp_path / "python"  # stands in for vLLM's interpreter: the server exits at once with an error
    fake.write_text("#!/bin/sh\necho 'ValueError: no such model'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="(?s)rollout worker could not start.*exited with status 3"):
        WorkerPool(**kw, vllm={"python": str(fake), "max_model_len": 256}, vllm_dir=tmp_path / "vllm")
    assert (tmp_path / "vllm" / "worker0" / "server.log").read_text().strip() == "ValueError: no such model"

    pool = WorkerPool(**kw, max_deaths=1)
    try:
        ticket = pool.submit([{"seed": s} for s in range(2)], temperature=1.0, epsilon=0.0, seed=0)
        os.kill(pool.call(0, "pid"), signal.SIGKILL)
        with pytest.raises(RuntimeError, match="worker 0 died 1 times in a row without finishing a chunk"):
            pool.gather(ticket)
    finally:
        pool.close()


def _run(make_cfg, out, *extra):
    cfg = make_cfg(out, "rollout.workers=2", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
                   "curriculum.ppo_iters=2", "env.eval_episodes=2", "env.kwargs={max_turns: 4}", *extra)
    return Trainer(cfg).run()


def _log(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"phase": "ppo"' in line]


@pytest.mark.slow
def test_two_workers_run_two_async_rl_iterations(tmp_path, make_cfg):
    """2 workers, rollout.async with max_staleness 1 and decoupled PPO: iteration 1's batch was sent before the
    first update, so it is at most 1 version old (never more); iteration 0's is fresh."""
    _run(make_cfg, tmp_path, "rollout.async=true", "rollout.max_staleness=1", "ppo.decoupled=true")
    rows = _log(tmp_path)
    assert [r["iter"] for r in rows] == [0, 1]
    # Fresh turns: the learner's proximal log-probs are the workers' recorded ones, up to float error (w = 1).
    assert abs(rows[0]["losses/behaviour_weight"] - 1) < 1e-3 and rows[0]["losses/behaviour_capped"] == 0
    assert 0 < rows[1]["losses/behaviour_weight"] <= 5.0
    # Iteration 1's batch went out before the first update: its turns are 0 or 1 versions old (0 when the new
    # weights reached the workers before their first decoding round), never more.
    assert rows[0]["async/staleness_max"] == 0 and rows[1]["async/staleness_max"] <= 1
    assert all(r["workers/restarts"] == 0 and r["async/dropped"] == 0 for r in rows)
    assert 0 <= rows[1]["perf/learner_idle_share"] <= 1 and 0 <= rows[1]["perf/worker_idle_share"] <= 1
    assert (tmp_path / "ckpt-iter0002" / "actor").is_dir()
    # A run with workers resumes from its checkpoint like any other (here with one synchronous worker).
    cfg = make_cfg(tmp_path, "rollout.workers=1", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
                   "curriculum.ppo_iters=3", "env.eval_episodes=2", "env.kwargs={max_turns: 4}")
    tr = Trainer(cfg, resume=True)
    assert tr.state.iter == 2
    tr.run()
    rows = _log(tmp_path)
    assert [r["iter"] for r in rows] == [0, 1, 2] and rows[2]["async/staleness_max"] == 0


@pytest.mark.slow
def test_ray_scale_benchmark_quick_runs_in_this_ray_instance(capsys, monkeypatch):
    """benchmarks/ray_scale.py --quick, in-process on the module's Ray (so it cannot rot; the figures mean nothing)."""
    spec = importlib.util.spec_from_file_location("ray_scale", ROOT / "benchmarks" / "ray_scale.py")
    ray_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ray_scale)
    monkeypatch.chdir(ROOT)
    ray_scale.main(["--quick"])
    out = capsys.readouterr().out
    assert ray.is_initialized()  # left running for the module
    rows = {line.split("  ")[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"in-process", "1 worker async"}, out
    assert float(rows["1 worker async"].split()[3]) > 0, out  # env turns/s


def test_turns_older_than_max_staleness_never_reach_an_update():
    """split_stale: an episode with a turn more than k versions old goes back to be played again; with
    partial=drop so does one that spans an update; the rest are trained on."""
    from polyturn.rollout.types import Episode, Turn
    from polyturn.train.remote import split_stale

    def ep(*versions):
        e = Episode(env_id="e", seed=0, task_id="t", question="q", level=1, ambiguous=False, key_actions=[])
        e.turns = [Turn(observation="o", action="a", action_ids=[1], logprobs=[0.0], reward=0.0, reward_terms={},
                        terminated=False, truncated=False, info={}, privileged="", features={}, version=v)
                   for v in versions]
        return e

    eps = [ep(5, 5), ep(4, 5), ep(3, 4), ep(3, 3), ep(5)]
    tasks = [{"seed": i} for i in range(5)]
    keep, again = split_stale(eps, tasks, version=5, max_staleness=1, partial="finish")
    assert keep == [eps[0], eps[1], eps[4]] and again == [tasks[2], tasks[3]]
    keep, again = split_stale(eps, tasks, version=5, max_staleness=1, partial="drop")
    assert keep == [eps[0], eps[4]] and again == [tasks[1], tasks[2], tasks[3]]
    keep, again = split_stale(eps, tasks, version=5, max_staleness=0, partial="finish")
    assert keep == [eps[0], eps[4]]
    assert max(5 - t.version for e in keep for t in e.turns) <= 0
