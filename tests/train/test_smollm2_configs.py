"""configs/customer_service_smollm2.yaml and configs/twenty_questions_smollm2.yaml load and run end to end.

Reduced sizes, and the small local Llama (fixture ``local_model``) in place of SmolLM2 so that each run takes
seconds: everything else is the config's own (env, demonstrations' noise, system prompt, rft + BC, LoRA).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polyturn.config import load_config
from polyturn.acting.jsonl import read_jsonl
from polyturn.train.trainer import Trainer

CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.mark.parametrize("name, env_id", [("customer_service_smollm2", "polyturn/CustomerService-v0"),
                                          ("twenty_questions_smollm2", "polyturn/TwentyQuestions-v0")])
def test_smollm2_env_config_runs_one_short_iteration(tmp_path, local_model, name, env_id):
    full = load_config(CONFIGS / f"{name}.yaml", [])
    assert full.env.id == env_id and full.actor.preset == "smollm2-135m" and full.ppo.algo == "rft"
    cfg = load_config(CONFIGS / f"{name}.yaml", [
        f"run.out_dir={tmp_path}", "actor.preset=local", f"actor.path={local_model}", "run.precision=fp32",
        "bc.episodes=4", "bc.epochs=1", "bc.batch_episodes=4", "ppo.episodes_per_iter=4", "ppo.minibatch_episodes=4",
        "curriculum.mixed_iters=1", "env.eval_episodes=2", "rollout.num_envs=4",
        "run.train_threads=1", "run.rollout_threads=1",  # the suite runs one test process per core
        "env.kwargs={max_turns: 3}"])
    summary = Trainer(cfg).run()
    assert set(summary["eval"]) == {"bc", "final"} and summary["eval"]["final"]["episodes"] == 2
    demos = list(read_jsonl(tmp_path / "demos.jsonl"))
    assert len(demos) == 4 and {d["env_id"] for d in demos} == {env_id}
    assert {d["policy"] for d in demos} == {f"noisy({full.bc.noise})" if full.bc.noise else "expert"}


def test_the_self_play_smollm2_config_runs_one_short_iteration(tmp_path, local_model):
    """configs/negotiation_selfplay_smollm2.yaml: BC on the single-agent demonstrations, then rft + BC by self-play."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    full = load_config(CONFIGS / "negotiation_selfplay_smollm2.yaml", [])
    assert full.env.kwargs["opponent"] == "self" and full.actor.preset == "smollm2-135m" and full.ppo.algo == "rft"
    demos = tmp_path / "demos.jsonl"
    write_jsonl(demos, generate_demos(full.env.id, episodes=4, noise=0.1, seed=0))
    cfg = load_config(CONFIGS / "negotiation_selfplay_smollm2.yaml", [
        f"run.out_dir={tmp_path / 'run'}", f"bc.demos={demos}", "actor.preset=local", f"actor.path={local_model}",
        "run.precision=fp32", "bc.epochs=1", "bc.batch_episodes=4", "ppo.episodes_per_iter=4",
        "ppo.minibatch_episodes=4", "curriculum.mixed_iters=1", "env.eval_episodes=2", "rollout.num_envs=4",
        "run.train_threads=1", "run.rollout_threads=1", "env.kwargs={opponent: self, max_turns: 3}"])
    summary = Trainer(cfg).run()
    assert set(summary["eval"]) == {"bc", "final"} and summary["eval"]["final"]["episodes"] == 2
    assert (tmp_path / "run" / "pool" / "iter0001" / "agent").is_dir()
