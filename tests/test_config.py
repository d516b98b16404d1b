"""Config loading: typed defaults, overrides, and errors that name the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyturn.config import ConfigError, load_config, save_config

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_defaults_validate():
    cfg = load_config(None)
    assert cfg.critic.kind == "separate" and cfg.curriculum.w_bc == 0.3 and cfg.curriculum.w_rl == 0.7
    assert cfg.curriculum.gamma.start == 0.9 and cfg.curriculum.gamma.end == 0.99
    assert cfg.critic.tau == 0.005 and cfg.critic.lr < cfg.actor.lr


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    load_config(path)


def test_overrides_are_typed():
    cfg = load_config(None, ["ppo.clip=0.1", "critic.kind=none", "curriculum.gamma.end=0.95"])
    assert cfg.ppo.clip == 0.1 and cfg.critic.kind == "none" and cfg.curriculum.gamma.end == 0.95


@pytest.mark.parametrize(
    "override, needle",
    [
        ("critic.kind=bogus", "critic.kind"),
        ("ppo.clip=-1", "ppo.clip = -1"),
        ("actor.hiden=3", "actor.hiden: unknown field"),
        ("actor.hidden=130", "divisible by actor.heads"),
        ("actor.kv_heads=3", "divisible by actor.kv_heads"),
        ("env.eval_seed_start=0", "eval_seed_start"),
    ],
)
def test_errors_name_the_field(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_enum_error_lists_allowed_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["critic.kind=bogus"])
    assert "'separate'" in str(e.value) and "'none'" in str(e.value)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["novalue"])


def test_round_trip(tmp_path):
    cfg = load_config(None, ["ppo.lam=0.9"])
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_a2c_with_a_kl_coef_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.algo=a2c", "ppo.kl_coef=0.1"])
    msg = str(e.value)
    assert "ppo.kl_coef = 0.1" in msg and "ppo.algo = 'a2c'" in msg and "ppo.kl_coef=0" in msg
    assert load_config(None, ["ppo.algo=a2c", "ppo.kl_coef=0"]).ppo.algo == "a2c"
    assert load_config(None, ["ppo.algo=ppo", "ppo.kl_coef=0.1"]).ppo.kl_coef == 0.1


def test_rft_refuses_a_kl_coef():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.algo=rft", "ppo.kl_coef=0.1"])
    assert "ppo.algo = 'rft'" in str(e.value) and "ppo.kl_coef=0" in str(e.value)


@pytest.mark.parametrize("flag", ["error", "wasted"])
def test_rft_skip_turns_needs_an_imitation_update(flag):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.algo=ppo", f"ppo.rft_skip_{flag}_turns=true"])
    assert "ppo.algo=rft or critic_rft" in str(e.value) and f"rft_skip_{flag}_turns" in str(e.value)
    assert getattr(load_config(None, ["ppo.algo=rft", f"ppo.rft_skip_{flag}_turns=true"]).ppo,
                   f"rft_skip_{flag}_turns")


def test_rft_valid_only_needs_rft():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.algo=ppo", "ppo.rft_valid_only=true"])
    assert "ppo.algo=rft" in str(e.value)
    assert load_config(None, ["ppo.algo=rft", "ppo.rft_valid_only=true"]).ppo.rft_valid_only
    awr = ["critic.kind=action", "ppo.algo=critic_rft", "ppo.rft_valid_only=true"]
    with pytest.raises(ConfigError):  # plain AWR imitates every episode: nothing to filter
        load_config(None, awr)
    assert load_config(None, [*awr, "ppo.awr_successes_only=true"]).ppo.rft_valid_only
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.algo=rft", "ppo.awr_successes_only=true"])
    assert "ppo.algo=critic_rft" in str(e.value)


def test_decoupled_needs_ppo():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.algo=rft", "ppo.decoupled=true"])
    assert "set ppo.algo=ppo, or drop ppo.decoupled" in str(e.value)
    assert load_config(None, ["ppo.decoupled=true"]).ppo.decoupled


def test_dual_clip_must_exceed_the_clip_range():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.clip=0.2", "ppo.dual_clip=1.1"])
    assert "ppo.dual_clip = 1.1 must exceed 1 + ppo.clip" in str(e.value)
    assert load_config(None, ["ppo.dual_clip=3.0"]).ppo.dual_clip == 3.0
    assert load_config(None, []).ppo.dual_clip is None


def test_rollout_workers_and_async_are_checked_and_round_trip(tmp_path):
    """rollout.async (a Python keyword, stored as async_) loads, saves and reloads under its YAML name."""
    from polyturn.config import save_config

    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.async=true"])
    assert "rollout.workers to 1 or more" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.num_envs=2", "rollout.workers=3"])
    assert "workers = 3 and num_envs = 2" in str(e.value)
    cfg = load_config(None, ["rollout.workers=2", "rollout.async=true", "rollout.max_staleness=2"])
    assert cfg.rollout.async_ and cfg.rollout.workers == 2 and cfg.model_dump(mode="json")["rollout"]["async"]
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again.rollout.async_ and again.rollout.max_staleness == 2
    assert not load_config(None).rollout.async_ and load_config(None).rollout.workers == 0


def test_constraints_load_from_yaml_and_set_and_round_trip(tmp_path):
    assert load_config(None).constraints is None
    cfg = load_config(None, ["constraints.limits.cost/violation=0.1", "constraints.lr=0.2",
                             "constraints.critic.kind=none"])
    c = cfg.constraints
    assert c.limits == {"cost/violation": 0.1} and c.lr == 0.2 and (c.init, c.max) == (0.0, 10.0)
    assert c.critic.kind == "none" and c.critic.privileged is None
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
    (tmp_path / "y.yaml").write_text("constraints:\n  limits: {cost/violation: 0.05, cost/error_response: 0.5}\n")
    assert load_config(tmp_path / "y.yaml").constraints.limits == {"cost/violation": 0.05, "cost/error_response": 0.5}


@pytest.mark.parametrize(("overrides", "needle"), [
    (["constraints.lr=0.1"], "constraints.limits"),
    (["constraints.limits={}"], "at least one cost term"),
    (["constraints.limits={violation: 0.1}"], "cost terms (cost/<name>), got ['violation']"),
    (["constraints.limits={cost/violation: -0.1}"], ">= 0 and finite"),
    (["constraints.limits={cost/violation: 0.1}", "constraints.init=3", "constraints.max=2"], "lower init or raise max"),
    (["constraints.limits={cost/violation: 0.1}", "constraints.critic.kind=action"], "constraints.critic.kind"),
    (["constraints.limits={cost/violation: 0.1}", "constraints.lr=-1"], "constraints.lr"),
])
def test_constraints_errors_name_the_field_and_the_fix(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert needle in str(e.value)
