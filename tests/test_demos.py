"""Demonstrations: episode records, JSONL round trip, transcripts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium
import pytest

from polyturn.acting.episodes import format_transcript, generate_demos, run_episode
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.cli import main
from polyturn.config import load_config
from polyturn.envs.sql.expert import SQLExpert
from polyturn.train.setup import load_or_make_demos

ENV_ID = "polyturn/SQLAnalyst-v0"
RECORD_KEYS = {
    "env_id", "seed", "task_id", "policy", "success", "return", "level", "ambiguous",
    "question", "privileged", "key_actions", "turns", "final_observation",
}
TURN_KEYS = {"observation", "action", "reward", "reward_terms", "terminated", "truncated", "info"}


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTURN_CACHE", str(tmp_path_factory.getbasetemp() / "demo-cache"))


def test_run_episode_record_matches_the_contract(tmp_path: Path) -> None:
    env = gymnasium.make(ENV_ID, plot_dir=tmp_path)
    record = run_episode(env, SQLExpert(env, seed=0), seed=17)
    assert set(record) == RECORD_KEYS
    assert record["env_id"] == ENV_ID and record["seed"] == 17 and record["policy"] == "expert"
    assert record["success"] is True and record["task_id"] == "sql-L" + str(record["level"]) + "-s17"
    turns = record["turns"]
    assert turns[0]["observation"] == record["question"]
    for t, turn in enumerate(turns):
        assert set(turn) == TURN_KEYS | {"cost_terms"}  # the SQL analyst reports a cost term, beside the reward
        assert turn["cost_terms"] == {"cost/sandbox": 0.0}
        assert set(turn["info"]) == {"action_type", "action_valid", "error", "features", "privileged"}
        assert math.isclose(sum(turn["reward_terms"].values()), turn["reward"], abs_tol=1e-12)
        assert turn["terminated"] == (t == len(turns) - 1) and not turn["truncated"]
        if t > 0:
            assert turn["observation"] != turns[t - 1]["observation"] or turns[t - 1]["info"]["error"]
    assert math.isclose(record["return"], sum(t["reward"] for t in turns))
    assert record["final_observation"] == "Answer submitted: correct."
    assert "Gold SQL" in record["privileged"] and "Gold SQL" not in "".join(t["observation"] for t in turns)
    json.dumps(record)  # plain JSON types only
    env.close()


def test_generate_demos_seeds_progress_and_noise() -> None:
    ticks: list[int] = []
    records = list(generate_demos(ENV_ID, episodes=6, noise=0.0, seed=100, progress=ticks.append))
    assert [r["seed"] for r in records] == list(range(100, 106)) and ticks == [1] * 6
    assert all(r["success"] for r in records)
    again = list(generate_demos(ENV_ID, episodes=6, noise=0.0, seed=100))
    assert again == records
    noisy = list(generate_demos(ENV_ID, episodes=30, noise=0.5, seed=100, env_kwargs={"max_turns": 8}))
    assert {r["policy"] for r in noisy} == {"noisy(0.5)"}
    assert sum(r["success"] for r in noisy) < 25
    with pytest.raises(ValueError, match="scripted expert"):
        next(generate_demos("CartPole-v1", episodes=1, noise=0.0, seed=0))


def test_jsonl_round_trip(tmp_path: Path) -> None:
    records = list(generate_demos(ENV_ID, episodes=4, noise=0.3, seed=7))
    path = tmp_path / "sub" / "demos.jsonl"
    assert write_jsonl(path, records) == 4
    assert read_jsonl(path) == records
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 4 and "\\u" not in text.split('"privileged"')[0]


def test_read_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"b": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: Expected a JSON object"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n[1]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: Expected a JSON object, got list"):
        read_jsonl(path)


def test_format_transcript() -> None:
    record = next(generate_demos(ENV_ID, episodes=1, noise=0.0, seed=7))
    text = format_transcript(record)
    lines = text.splitlines()
    assert lines[0].startswith(f"=== {record['task_id']} (level {record['level']}")
    assert lines[1] == "USER: " + record["question"].splitlines()[0]
    assert text.count("ACTION: ") == len(record["turns"])
    assert text.count("  reward ") == len(record["turns"])
    assert "THOUGHT: First see which tables exist." in text
    assert "ACTION: list_tables[{}]" in text and "OBSERVATION: Tables: orders, prices, products, regions" in text
    assert lines[-1].startswith("=== success, return +")
    if record["ambiguous"]:
        assert "\nUSER: I mean" in text


def test_transcript_shows_bad_actions_and_failures() -> None:
    record = {
        "task_id": "t", "level": 1, "ambiguous": False, "policy": "p", "seed": 0, "success": False, "return": -5.2,
        "turns": [
            {"observation": "Q?", "action": "hmm", "reward": -0.21,
             "reward_terms": {"penalty/unparseable": -0.2, "penalty/turn_cost": -0.01},
             "info": {"action_type": "invalid"}},
        ],
        "final_observation": "Format error",
    }
    text = format_transcript(record)
    assert "ACTION: hmm" in text and "penalty/unparseable -0.20" in text and text.endswith("=== failure, return -5.20")


# ---- the one env maker, expert lookup, episode runner and JSONL reader ---------------------------------
ALIAS = "polyturn-test/SQLAlias-v0"  # a new env id: the SQL env under another name


@pytest.fixture()
def alias_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """A freshly registered env id: one EnvSpec passed to register(), no other code knows it."""
    from polyturn.acting import registry
    from polyturn.envs.spec import EnvSpec

    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))  # forget the alias after the test
    registry.register(EnvSpec(id=ALIAS, entry_point="polyturn.envs.sql.env:SQLAnalystEnv",
                              expert="polyturn.envs.sql.expert:SQLExpert"))
    return ALIAS


def test_make_env_and_make_expert_errors_say_what_to_fix() -> None:
    from polyturn.acting.registry import make_env, make_expert

    with pytest.raises(ValueError, match=r"Expected a registered env id \(known: \[.*'polyturn/SQLAnalyst-v0'"):
        make_env("polyturn/Nope-v0")
    with pytest.raises(ValueError, match="unexpected keyword argument 'nope'"):
        make_env(ENV_ID, {"nope": 1})
    with pytest.raises(ValueError, match="Expected env kwargs as a JSON object"):
        make_env(ENV_ID, [1])  # type: ignore[arg-type]
    env = make_env("CartPole-v1")
    with pytest.raises(ValueError, match=r"Expected an env id with a scripted expert .* got 'CartPole-v1'"):
        make_expert(env)
    env.close()


def test_a_new_env_id_works_through_register_alone(alias_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from polyturn.acting.policies import resolve_policy
    from polyturn.cli import main
    from polyturn.eval.runner import run_text_policy
    from polyturn.eval.testcases import TestCase

    assert main(["play", "--env", alias_env, "--seed", "4"]) == 0
    assert "=== success" in capsys.readouterr().out
    out = tmp_path / "d.jsonl"
    assert main(["demos", "--env", alias_env, "--episodes", "2", "--out", str(out)]) == 0
    assert [r["env_id"] for r in read_jsonl(out)] == [alias_env] * 2
    case = TestCase(id="c0", env=alias_env, seed=4)
    (rec,) = run_text_policy(resolve_policy("expert"), [case], seed=0)
    assert rec["success"] and rec["env_id"] == alias_env and rec["case_id"] == "c0"


def test_play_random_and_noisy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["play", "--policy", "random", "--episodes", "2", "--env-kwargs", '{"max_turns": 2}']) == 0
    text = capsys.readouterr().out
    assert text.count("policy=random") == 2 and text.count("=== failure") + text.count("=== success") == 2
    assert main(["play", "--policy", "noisy", "--noise", "0.5", "--seed", "1"]) == 0
    assert "policy=noisy(0.5)" in capsys.readouterr().out


class _Crashes:
    """Plays the expert's first action, then raises."""

    name = "crashy"

    def __init__(self, env: gymnasium.Env) -> None:
        self.expert, self.n = SQLExpert(env, seed=0), 0

    def reset(self, obs: str, info: dict) -> None:
        self.expert.reset(obs, info)

    def act(self, obs: str, info: dict) -> str:
        self.n += 1
        if self.n > 1:
            raise RuntimeError("policy broke")
        return self.expert.act(obs, info)


def test_run_episode_for_eval_times_turns_and_records_a_crash(tmp_path: Path) -> None:
    env = gymnasium.make(ENV_ID, plot_dir=tmp_path)
    demo = run_episode(env, SQLExpert(env, seed=0), seed=17)
    ev = run_episode(env, SQLExpert(env, seed=0), seed=17, label="expert", for_eval=True)
    assert [t["action"] for t in ev["turns"]] == [t["action"] for t in demo["turns"]]
    assert ev["crashed"] is False and ev["crash"] is None and ev["success"] is demo["success"] is True
    assert all(t["latency_s"] > 0 and t["forced"] is False and "turn" in t["info"] for t in ev["turns"])
    crashed = run_episode(env, _Crashes(env), seed=17, for_eval=True)
    assert crashed["crashed"] and crashed["crash"] == "RuntimeError: policy broke"
    assert len(crashed["turns"]) == 1 and crashed["policy"] == "crashy" and not crashed["success"]
    with pytest.raises(RuntimeError, match="policy broke"):  # demonstrations do not hide a broken policy
        run_episode(env, _Crashes(env), seed=17)
    env.close()


def test_read_jsonl_missing_binary_and_line_separators(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="Expected a JSONL file at .*nope.jsonl, found none"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="found a directory"):
        read_jsonl(tmp_path)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="bin.jsonl: Expected a UTF-8 JSONL file"):
        read_jsonl(tmp_path / "bin.jsonl")
    records = [{"text": "line\u2028separator\u2029paragraph\x85next"}, {"b": 2}]
    write_jsonl(tmp_path / "u.jsonl", records)
    assert read_jsonl(tmp_path / "u.jsonl") == records
    with pytest.raises(IsADirectoryError, match="got the directory"):
        write_jsonl(tmp_path, records)


def test_demos_take_the_experts_options_from_the_cli_and_the_config(tmp_path: Path) -> None:
    out = tmp_path / "tq.jsonl"
    assert main(["demos", "--env", "polyturn/TwentyQuestions-v0", "--episodes", "3", "--expert-options",
                 '{"name_candidates": 4}', "--out", str(out)]) == 0
    guesses = [t["action"] for r in read_jsonl(out) for t in r["turns"] if "Action: guess" in t["action"]]
    assert guesses and all(" left: " in g for g in guesses)  # the exact expert guesses only among <= 2
    cfg = load_config(None, ["env.id=polyturn/TwentyQuestions-v0", "bc.episodes=2", "bc.noise=0",
                             "bc.expert_options={name_candidates: 4}", f"run.out_dir={tmp_path / 'run'}"])
    assert load_or_make_demos(cfg, tmp_path / "run") == read_jsonl(out)[:2]


CS_ID = "polyturn/CustomerService-v0"


def test_group_shares_keep_the_plain_generation_less_the_full_groups() -> None:
    """Each named group gets round(share x episodes), the others the rest, and every kept record is the one the
    plain generation writes for its seed (the noisy expert's random draws run on through skipped seeds)."""
    from polyturn.envs.customer_service.spec import intent

    ticks: list[int] = []
    kept = list(generate_demos(CS_ID, episodes=10, noise=0.3, seed=5, progress=ticks.append, balance_by="intent",
                               group_shares={"forbidden": 0.5, "track": 0.2}))
    groups = [intent(r) for r in kept]
    assert len(kept) == 10 and ticks == [1] * 10
    assert groups.count("forbidden") == 5 and groups.count("track") == 2
    seeds = [r["seed"] for r in kept]
    assert seeds == sorted(set(seeds)) and seeds[-1] > 5 + 10  # forbidden is ~1 in 7: seeds were skipped
    plain = {r["seed"]: r for r in generate_demos(CS_ID, episodes=seeds[-1] - 5 + 1, noise=0.3, seed=5)}
    assert kept == [plain[s] for s in seeds]
    def first(n: int, keep) -> list[int]:  # the first n seeds of the plain generation whose group keep() accepts
        return [s for s in sorted(plain) if keep(intent(plain[s]))][:n]

    assert [s for s in seeds if intent(plain[s]) == "forbidden"] == first(5, lambda g: g == "forbidden")
    assert [s for s in seeds if intent(plain[s]) == "track"] == first(2, lambda g: g == "track")
    assert [s for s in seeds if intent(plain[s]) not in ("forbidden", "track")] == first(
        3, lambda g: g not in ("forbidden", "track"))


def test_group_shares_errors_name_the_breakdowns_and_the_groups_seen() -> None:
    with pytest.raises(ValueError, match=r"breakdowns \['intent'\], got 'intnt'"):
        next(generate_demos(CS_ID, episodes=4, noise=0.0, seed=0, balance_by="intnt", group_shares={"track": 0.5}))
    with pytest.raises(ValueError, match=r"found only \{'forbiden': '0 of 2'\}; the groups seen: .*'forbidden'"):
        list(generate_demos(CS_ID, episodes=4, noise=0.0, seed=0, balance_by="intent", group_shares={"forbiden": 0.5}))
    with pytest.raises(ValueError, match=r"share in \(0, 1\]"):
        next(generate_demos(CS_ID, episodes=4, noise=0.0, seed=0, balance_by="intent", group_shares={"track": 0.0}))


def test_bc_group_shares_shape_the_trainers_demos_and_rl_starts_after_them(tmp_path: Path) -> None:
    from polyturn.envs.customer_service.spec import intent
    from polyturn.train.setup import first_rl_seed

    cfg = load_config(None, [f"env.id={CS_ID}", "bc.episodes=6", "bc.noise=0", "bc.balance_by=intent",
                             "bc.group_shares={forbidden: 0.5}", f"run.out_dir={tmp_path / 'run'}"])
    demos = load_or_make_demos(cfg, tmp_path / "run")
    assert [intent(r) for r in demos].count("forbidden") == 3 and len(demos) == 6
    assert first_rl_seed(cfg, demos) == demos[-1]["seed"] + 1 > 6
    plain = load_config(None, ["bc.episodes=6"])
    assert first_rl_seed(plain, [{"seed": s} for s in range(6)]) == 6
    assert first_rl_seed(plain, [{"seed": 2}, {"seed": 2_000_000}, {"seed": None}]) == 6  # held-out seeds: not RL's


def test_curriculum_group_shares_shape_each_rl_iterations_tasks(tmp_path: Path) -> None:
    """curriculum.group_shares: each iteration's tasks have the shares, drawn in seed order past the full groups'
    seeds; the next iteration continues after the last seed tried, and a group that never comes is a clear error."""
    from polyturn.acting.episodes import task_group
    from polyturn.acting.registry import make_env
    from polyturn.envs.customer_service.spec import intent
    from polyturn.train.trainer import Trainer

    cfg = load_config(Path(__file__).parents[1] / "configs" / "test_tiny.yaml", [
        f"env.id={CS_ID}", "bc.episodes=4", "bc.noise=0", "critic.kind=none", "critic.group_size=2",
        "curriculum.balance_by=intent",
        "curriculum.group_shares={forbidden: 0.5}", f"run.out_dir={tmp_path / 'run'}"])
    tr = Trainer(cfg)
    env = make_env(CS_ID)
    group = lambda seed: task_group(env, intent, seed=seed)  # noqa: E731
    start = tr.state.task_counter
    tasks = tr.next_tasks(16, 0.0)
    seeds = [t["seed"] for t in tasks]
    places = len(set(seeds))
    assert len(tasks) == 16 and places == 8  # each task twice (critic.group_size)
    assert [group(s) for s in sorted(set(seeds))].count("forbidden") == places // 2
    tried = range(start, tr.state.task_counter)
    assert sorted(set(seeds)) == [s for s in tried if s in set(seeds)] and tr.state.task_counter > start + places
    kept_forbidden = [s for s in tried if group(s) == "forbidden"][:places // 2]
    assert [s for s in sorted(set(seeds)) if group(s) == "forbidden"] == kept_forbidden
    assert [s for s in sorted(set(seeds)) if group(s) != "forbidden"] == [
        s for s in tried if group(s) != "forbidden"][:places // 2]
    nxt = [t["seed"] for t in tr.next_tasks(16, 0.0)]
    assert min(nxt) >= tried.stop
    env.close()

    with pytest.raises(ValueError, match=r"breakdowns \['intent'\], got 'intnt'"):
        Trainer(load_config(None, [f"env.id={CS_ID}", "bc.episodes=4", "bc.noise=0", "curriculum.balance_by=intnt",
                                   "curriculum.group_shares={forbidden: 0.5}", f"run.out_dir={tmp_path / 'x'}"]))
    tr.cfg.curriculum.group_shares = {"forbiden": 0.5}
    with pytest.raises(ValueError, match=r"curriculum.group_shares: Expected intent quotas .*'forbiden'"):
        tr.next_tasks(8, 0.0)
