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
