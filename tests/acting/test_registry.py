"""The env registry: built-in specs found by walking polyturn.envs, plugins through the polyturn.envs entry points."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest

from polyturn.acting import registry
from polyturn.acting.registry import env_ids, env_spec, expert_class, load_envs, make_env, make_expert, register
from polyturn.envs.spec import EnvSpec

BUILTIN = {"polyturn/SQLAnalyst-v0", "polyturn/TwentyQuestions-v0", "polyturn/Negotiation-v0",
           "polyturn/CustomerService-v0"}


def dist_info(root: Path, name: str, entry_points: str) -> Path:
    """A minimal installed distribution (``<name>.dist-info`` with METADATA and entry_points.txt) under ``root``."""
    d = root / f"{name}-0.1.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(entry_points)
    return root


@pytest.fixture()
def fresh_registry(monkeypatch):
    """The registry as a copy, so a test's registrations and plugin errors vanish with it."""
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    monkeypatch.setattr(registry, "PLUGIN_ERRORS", {})


def test_builtin_specs_are_found_beside_their_envs():
    assert BUILTIN <= set(env_ids())
    for env_id in BUILTIN:
        spec = env_spec(env_id)
        assert spec.entry_point.startswith("polyturn.envs.") and gymnasium.spec(env_id).entry_point == spec.entry_point
        assert expert_class(env_id).__module__.startswith("polyturn.envs.")


def test_a_plugin_is_discovered_through_its_entry_point(tmp_path, monkeypatch, fresh_registry, meeting_env):
    """The real importlib.metadata path: a distribution on sys.path whose entry point names the example's spec."""
    import meeting_booking.spec

    registry._SPECS.pop(meeting_env, None)
    with pytest.raises(ValueError, match="Expected a registered env id"):
        env_spec(meeting_env)
    root = dist_info(tmp_path, "polyturn_meeting_booking_probe",
                     "[polyturn.envs]\nmeeting = meeting_booking.spec:SPEC\n")
    monkeypatch.syspath_prepend(str(root))
    load_envs(reload_plugins=True)
    assert env_spec(meeting_env) is meeting_booking.spec.SPEC
    env = make_env(meeting_env, {"max_turns": 3})
    obs, info = env.reset(seed=1)
    assert obs.startswith("Please book") and info["privileged"].startswith("Goal:")
    assert make_expert(env).name == "expert"
    env.close()


def test_a_broken_plugin_is_reported_and_skipped(tmp_path, monkeypatch, fresh_registry, caplog):
    root = dist_info(tmp_path, "polyturn_broken_probe", "[polyturn.envs]\nbroken = no_such_module_xyz:SPEC\n")
    monkeypatch.syspath_prepend(str(root))
    load_envs(reload_plugins=True)
    assert "broken" in registry.PLUGIN_ERRORS and "no_such_module_xyz" in registry.PLUGIN_ERRORS["broken"]
    assert "failed to load" in caplog.text
    assert BUILTIN <= set(env_ids())  # the others still work
    with pytest.raises(ValueError, match="plugins that failed to load"):
        env_spec("nobody/Nothing-v0")


def test_register_refuses_a_second_spec_under_a_taken_id(fresh_registry):
    sql = env_spec("polyturn/SQLAnalyst-v0")
    register(sql)  # the same spec again: a no-op
    other = EnvSpec(id=sql.id, entry_point="polyturn.envs.negotiation.env:NegotiationEnv")
    with pytest.raises(ValueError, match="already registered"):
        register(other)
    with pytest.raises(TypeError, match="Expected a polyturn.envs.spec.EnvSpec"):
        register({"id": "x/Y-v0"})  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs, match", [({"id": "NoNamespace", "entry_point": "a:B"}, "namespace/Name-vN"),
                                           ({"id": "a/B-v0", "entry_point": "a.B"}, "package.module:Class")])
def test_spec_errors_say_what_to_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EnvSpec(**kwargs)


def test_an_env_without_expert_says_so(fresh_registry):
    register(EnvSpec(id="probe/NoExpert-v0", entry_point="polyturn.envs.sql.env:SQLAnalystEnv"))
    env = make_env("probe/NoExpert-v0")
    with pytest.raises(ValueError, match=r"Expected an env id with a scripted expert .*'probe/NoExpert-v0'"):
        make_expert(env)
    env.close()


def test_no_list_of_environments_outside_their_specs():
    """No source file outside an env's own package names a built-in env's class or entry point."""
    src = Path(__file__).resolve().parents[2] / "src" / "polyturn"
    classes = ("SQLAnalystEnv", "TwentyQuestionsEnv", "NegotiationEnv", "CustomerServiceEnv", "SQLExpert",
               "TwentyQuestionsExpert", "NegotiationExpert", "CustomerServiceExpert")
    found = []
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("envs/"):
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{rel}: {c}" for c in classes if c in text]
    assert not found, f"Expected environments named only in their specs, got {found}"
