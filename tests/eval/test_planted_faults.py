"""Planted faults: short real trainings on configs/test_tiny.yaml, each with one thing broken on purpose.

Each broken run must raise its own warning while it trains (``run.diagnose_every``) and in
``polyturn diagnose``; the same run with nothing broken must raise none. The runs are as short as the
checks allow: 10 RL iterations (two windows of ``checks.WINDOW`` = 5), 16 episodes of at most 4 turns each, all
starting from one BC policy trained once for the module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium
import pytest

from polyturn.envs.sql.env import SQLAnalystEnv
from polyturn.eval.diagnose import diagnose
from polyturn.train.trainer import NullReporter, Trainer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("planted_faults")]  # module fixtures built once

LOOPHOLE_ID = "polyturn-test/LoopholeSQL-v0"


class LoopholeSQL(SQLAnalystEnv):
    """SQLAnalyst with a planted reward loophole: ``process/repeat_paid`` pays ``bonus`` on every repeated call."""

    def __init__(self, *, bonus: float = 2.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bonus = bonus

    def step(self, action: str):  # noqa: ANN201 (gymnasium's step signature)
        obs, reward, terminated, truncated, info = super().step(action)
        paid = self.bonus if info["error"] == "repeat" else 0.0
        info["reward_terms"] = {**info["reward_terms"], "process/repeat_paid": paid}
        return obs, reward + paid, terminated, truncated, info


if LOOPHOLE_ID not in gymnasium.registry:
    gymnasium.register(id=LOOPHOLE_ID, entry_point=LoopholeSQL)

#: The test config, short, with approx_kl measured (a second minibatch), starting from the module's BC policy.
BASE = ["actor.lr=5e-3", "actor.warmup_steps=0", "critic.lr=1e-3", "ppo.minibatch_episodes=4", "ppo.epochs=2",
        "ppo.episodes_per_iter=16", "rollout.num_envs=16", "curriculum.ppo_iters=8", "curriculum.epsilon.start=0",
        "env.eval_episodes=2", "run.checkpoint_every=100",
        "run.diagnose_every=5", "env.kwargs={max_turns: 4}"]

FAULTS = {
    # A term that pays for repeating a call (no repeat penalty): the policy learns to repeat.
    "loophole": ([f"env.id={LOOPHOLE_ID}", "env.kwargs={max_turns: 4, reward_weights: {penalty_repeat: 0.0}}"],
                 ("reward_hacking", "reward/process/repeat_paid")),
    # Sampling at temperature 0.05 with no entropy bonus: the policy is deterministic from the start.
    "entropy_collapse": (["curriculum.temperature.start=0.05", "curriculum.temperature.end=0.05"],
                         ("collapse", "losses/entropy")),
    # A critic learning rate 1000x too high.
    "critic_lr": (["critic.lr=1.0"], ("critic_divergence", "losses/value_loss")),
    # An actor learning rate of (almost) 0: actor.lr must be > 0, and 1e-12 leaves fp32 weights unchanged.
    "stalled": (["actor.lr=1e-12"], ("plateau", "losses/approx_kl")),
}


class Messages(NullReporter):
    """A reporter that keeps the trainer's messages (the CLI prints them)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)


CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"


@pytest.fixture(scope="module")
def make_cfg(tmp_path_factory):
    """``make_cfg(out_dir, *overrides)``: the tiny test config on 16 noisy-expert demonstrations made once."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl
    from polyturn.config import load_config

    demos = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    write_jsonl(demos, generate_demos("polyturn/SQLAnalyst-v0", episodes=16, noise=0.3, seed=0))
    return lambda out, *extra: load_config(CFG, [f"run.out_dir={out}", f"bc.demos={demos}", *extra])


@pytest.fixture(scope="module")
def bc_policy(tmp_path_factory, make_cfg) -> Path:
    """One BC policy for every run of the module: the 16 demonstrations learnt by heart (about 25 s)."""
    out = tmp_path_factory.mktemp("bc")
    Trainer(make_cfg(out, "bc.epochs=100", "bc.lr=1e-2", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
                     "curriculum.ppo_iters=0", "env.eval_episodes=2")).run()
    return out / "ckpt-bc"


def train(make_cfg, bc_policy: Path, out: Path, *extra: str) -> list[str]:
    """Train the base config (+ ``extra``) from ``bc_policy`` into ``out``; the messages the trainer reported."""
    rep = Messages()
    Trainer(make_cfg(out, f"actor.init_from={bc_policy}", *BASE, *extra), reporter=rep).run()
    return rep.messages


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, make_cfg, bc_policy):
    out = tmp_path_factory.mktemp("healthy")
    return out, train(make_cfg, bc_policy, out)


def test_the_healthy_run_gives_no_warning(healthy):
    out, messages = healthy
    assert messages == []
    res = diagnose(out, episodes=0)
    assert res.warnings == []
    assert "No warning fired." in res.paths["markdown"].read_text()
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in recs if r.get("phase") in ("warmup", "mixed", "ppo")]
    assert len(rl) == 10 and all(0 < r["charts/distinct_action_frac"] <= 1 for r in rl)
    assert all(r["charts/episodes"] == 16 and 0 <= r["charts/repeated_episode_frac"] <= 1 for r in rl)
    # The actor moves: the stepped minibatches' approx_kl, or a declined one's (measured after the others stepped).
    assert min(max(r.get("losses/approx_kl", 0.0), r.get("losses/declined_approx_kl", 0.0))
               for r in rl if r["phase"] == "ppo") > 1e-7


def test_diagnose_reads_a_run_that_is_still_writing(healthy, tmp_path, capfd):
    out, _ = healthy
    run = tmp_path / "live"
    run.mkdir()
    shutil.copy(out / "config.yaml", run / "config.yaml")
    text = (out / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[: len(text) - 40])  # the last record cut mid-write
    res = diagnose(run, episodes=0)
    assert res.warnings == [] and (res.paths["dir"] / "training.png").is_file()
    from polyturn.cli import main  # the command in this process (tests/cli/test_errors.py runs the installed one)

    capfd.readouterr()
    assert main(["diagnose", "--run", str(run), "--episodes", "0"]) == 0
    assert "no warning" in capfd.readouterr().err


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_planted_fault_gives_its_own_warning(fault, make_cfg, bc_policy, tmp_path):
    extra, (kind, metric) = FAULTS[fault]
    messages = train(make_cfg, bc_policy, tmp_path, *extra)
    # Reported while training, with the iterations, the plot and the remedy.
    live = [m for m in messages if m.startswith(f"{kind} [{metric}]")]
    assert live, messages
    assert f"plot: {tmp_path / 'diagnose'}" in live[0] and "remedy:" in live[0] and "iteration" in live[0]
    res = diagnose(tmp_path, episodes=0)
    found = {(w.kind, w.metric) for w in res.warnings}
    assert (kind, metric) in found, [w.message for w in res.warnings]
    w = next(w for w in res.warnings if (w.kind, w.metric) == (kind, metric))
    assert w.start_iter is not None and (res.paths["dir"] / w.plot).is_file()
    md = res.paths["markdown"].read_text()
    assert f"({w.where})" in md and f"plot: [{w.plot}](./{w.plot})" in md
