"""The vLLM server's failures a user can cause are one-line errors (no vLLM needed: these run in every suite)."""

from __future__ import annotations

import sys

import pytest

from polyturn.rollout.vllm_server import VLLMError, VLLMServer


def _model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_a_missing_vllm_environment_says_how_to_install_it(tmp_path):
    server = VLLMServer(_model_dir(tmp_path), python=tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(VLLMError, match=r"make vllm-venv"):
        server.start()


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    fake = tmp_path / "python"  # stands in for the venv's interpreter: prints an error and exits 3
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('ValueError: no such model')\nsys.exit(3)\n")
    fake.chmod(0o755)
    server = VLLMServer(_model_dir(tmp_path), python=fake, log_path=tmp_path / "server.log")
    with pytest.raises(VLLMError, match=r"exited with status 3(.|\n)*no such model"):
        server.start()


def test_rollout_engine_is_home_by_default_and_vllm_refuses_what_it_cannot_do_yet():
    from polyturn.config import ConfigError, load_config

    assert load_config(None).rollout.engine == "home"
    assert load_config(None, ["rollout.engine=vllm"]).rollout.vllm_python == ".venv-vllm/bin/python"
    with pytest.raises(ConfigError, match=r"rollout.engine = 'vllm'.*rollout.best_of = 2"):
        load_config(None, ["rollout.engine=vllm", "rollout.best_of=2", "critic.kind=action"])
    assert load_config(None, ["rollout.engine=vllm", "rollout.workers=2"]).rollout.workers == 2  # a server each


def test_the_logprob_gap_compares_behaviour_logprobs_with_the_actors_on_action_tokens_only():
    import torch

    from polyturn.rollout.types import Episode, Segment
    from polyturn.train.policy import logprob_gap

    seg = Segment()
    seg.add_context([1, 2, 3])
    seg.add_action([4, 5], [-0.5, -1.0], turn=0)
    ep = Episode(env_id="x", seed=0, task_id="t", question="q", level=1, ambiguous=False, key_actions=[],
                 temperature=1.0, policy="actor")
    ep.segments = [seg]
    # Target grid: entry k predicts ids[k + 1]; the actor's own log-probs of ids 4 and 5 are entries 2 and 3.
    current = [[torch.tensor([-9.0, -9.0, -0.5, -1.25])]]
    gap = logprob_gap([ep], current)
    assert gap == {"rollout/logprob_gap_max": 0.25, "rollout/logprob_gap_mean": 0.125}


def test_a_lora_actor_on_a_cpu_hears_that_vllm_samples_it_slower(tmp_path, tiny_actor):
    """vLLM's CPU build sampled through adapters 4.5x slower than the home engine (docs/vllm.md): the run says so
    before it starts the server (here a missing one); a full actor hears nothing."""
    from polyturn.config import load_config
    from polyturn.models.actor import ACTOR_META, pretrained_actor
    from polyturn.train.setup import VLLM_LORA_ON_CPU, vllm_engine

    tiny_actor.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / ACTOR_META).unlink()
    lora = pretrained_actor("local", path=str(tmp_path / "base"),
                            lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
    cfg = load_config(None, ["rollout.engine=vllm", f"rollout.vllm_python={tmp_path / 'no-venv' / 'python'}"])
    heard: dict[str, list[str]] = {}
    for name, actor in (("lora", lora), ("full", tiny_actor)):
        heard[name] = []
        with pytest.raises(VLLMError, match="make vllm-venv"):
            vllm_engine(cfg, actor, tmp_path / name, heard[name].append)
    assert heard == {"lora": [VLLM_LORA_ON_CPU], "full": []}
