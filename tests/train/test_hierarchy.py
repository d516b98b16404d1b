"""Hierarchical agents in training: the manager's semi-MDP credit against a hand computation, two-iteration runs
on the tiny preset (SQL, CustomerService) and on a LoRA'd pretrained actor, and the clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.config import load_config
from polyturn.envs.hierarchy import INTRINSIC, MANAGER, UNREACHED, WORKER
from polyturn.rollout.types import Episode, Turn
from polyturn.train.hierarchy import semi_mdp
from polyturn.train.trainer import Trainer
from tests.conftest import hier_tiny_cfg

CONFIGS = Path(__file__).parents[2] / "configs"


def _turn(reward: float, info: dict, terms: dict | None = None) -> Turn:
    return Turn(observation="", action="", action_ids=[1], logprobs=[0.0], reward=reward,
                reward_terms=terms or {}, terminated=False, truncated=False, info=info, privileged="", features={})


def test_the_managers_turns_get_the_discounted_env_rewards_of_their_subgoals_and_their_durations():
    # Manager: subgoal 0, an invalid turn, subgoal 1. Worker: two turns under 0, three under 1; the intrinsic
    # reward (1.0 on the second turn) and the unreached penalty (-0.5 on the fourth) are the worker's alone.
    manager = Episode(env_id="x", seed=0, task_id="t", question="q", level=0, ambiguous=False, key_actions=[],
                      turns=[_turn(0.0, {"subgoal_index": 0}), _turn(0.0, {}), _turn(0.0, {"subgoal_index": 1})])
    worker = Episode(env_id="x", seed=0, task_id="t", question="q", level=0, ambiguous=False, key_actions=[],
                     turns=[_turn(0.5, {"subgoal_index": 0}), _turn(2.0, {"subgoal_index": 0}, {INTRINSIC: 1.0}),
                            _turn(-0.1, {"subgoal_index": 1}), _turn(-0.5, {"subgoal_index": 1}, {UNREACHED: -0.5}),
                            _turn(10.0, {"subgoal_index": 1})])
    semi_mdp(manager, worker, gamma=0.9)
    # By hand: R_0 = 0.5 + 0.9 * (2.0 - 1.0) = 1.4; R_1 = -0.1 + 0.9 * 0 + 0.81 * 10 = 8.0.
    assert [t.reward for t in manager.turns] == pytest.approx([1.4, 0.0, 8.0])
    assert [t.info["duration"] for t in manager.turns] == [2, 0, 3]


def _tiny(tmp_path: Path, env_id: str, *extra: str):
    return hier_tiny_cfg(tmp_path, env_id, *extra)


@pytest.mark.xdist_group("serve_hierarchy")  # the session's hier_sql_run is trained once, with tests/acting's
def test_a_two_iteration_hierarchical_run_on_the_tiny_preset(hier_sql_run):
    """The session's shared run (SQL; CustomerService's hierarchy is the same code over another menu: its
    demonstrations and env contract are tested in tests/envs/test_hierarchy.py, and its SmolLM2 config below)."""
    tmp_path = hier_sql_run
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["eval"]) == {"bc", "final"}
    demos = list(read_jsonl(tmp_path / "demos.jsonl"))
    assert [d["role"] for d in demos] == [MANAGER, WORKER] * 8
    metrics = list(read_jsonl(tmp_path / "metrics.jsonl"))
    rl = [m for m in metrics if m.get("phase") in ("mixed", "ppo")]
    assert len(rl) == 2
    for m in rl:  # both policies learned, each under its name, with the hierarchy's figures
        assert "manager/losses/policy_loss" in m and "worker/losses/policy_loss" in m
        # hierarchy.manager_kl: the manager's loss has a KL term to its BC policy, the worker's none
        assert m["manager/losses/kl_ref"] >= 0 and "worker/losses/kl_ref" not in m
        assert "hierarchy/subgoals_set" in m and m["hierarchy/manager_updates"] == 1.0
        assert any(k.startswith("hierarchy/set_share/") and 0 < m[k] <= 1 for k in m)
    bc = [m for m in metrics if m.get("phase") == "bc"]
    # Each policy BC'd on its own demonstrations, one after the other: the worker's steps follow the manager's.
    manager_steps = [m["step"] for m in bc if "losses/bc_loss" in m]
    worker_steps = [m["step"] for m in bc if "worker/losses/bc_loss" in m]
    assert manager_steps and worker_steps and max(manager_steps) < min(worker_steps)
    assert (tmp_path / "ckpt-final" / "roles" / "worker" / "actor").is_dir()
    assert (tmp_path / "ckpt-final" / "ref_actor").is_dir()  # the manager's reference, kept for resume
    assert not (tmp_path / "ckpt-final" / "roles" / "worker" / "ref_actor").exists()
    records = list(read_jsonl(tmp_path / "eval_final.jsonl"))
    assert len(records) == 8 and all(r["role"] == WORKER for r in records)
    # Each RL iteration counted its games as played, then each policy's update steps under the policy's name.
    steps = json.loads((tmp_path.parent / "steps.json").read_text())
    assert [name for name, _, _ in steps] == ["sampling", "manager update", "worker update"] * 2
    for name, total, done in steps:
        assert 0 < done <= total and (done == total or name != "sampling")


def test_the_manager_updates_every_manager_every_iterations(tmp_path):
    """HierarchyPlay hands the manager its episodes only on every manager_every-th iteration; the worker always."""
    from types import SimpleNamespace

    from polyturn.train.hierarchy import HierarchyPlay

    seated = {r: SimpleNamespace(actor=object()) for r in (MANAGER, WORKER)}  # games() seats only their actors

    def iteration(play, it):  # one game's batches on iteration ``it``
        play.games([{"seed": 0}], it, group=1)
        manager = Episode(env_id="x", seed=0, task_id="t", question="q", level=0, ambiguous=False, key_actions=[],
                          turns=[_turn(0.0, {"subgoal_index": 0, "subgoal": "inspect"})])
        worker = Episode(env_id="x", seed=0, task_id="t", question="q", level=0, ambiguous=False, key_actions=[],
                         turns=[_turn(1.0, {"subgoal_index": 0, "action_type": "list_tables"}),
                                _turn(-0.5, {"subgoal_index": 0, "action_type": "list_tables"}, {UNREACHED: -0.5})])
        return play.batches([{MANAGER: manager, WORKER: worker}])

    play = HierarchyPlay(_tiny(tmp_path, "polyturn/SQLAnalyst-v0", "hierarchy.manager_every=2"), policies=seated,
                         out=tmp_path)
    for it, manager_learns in ((0, True), (1, False), (2, True)):
        batches, metrics = iteration(play, it)
        assert (len(batches[MANAGER]) == 1) == manager_learns and len(batches[WORKER]) == 1
        assert metrics["hierarchy/manager_updates"] == float(manager_learns) and metrics["hierarchy/env_steps"] == 2
        assert metrics["hierarchy/subgoals_unreached"] == 1.0 and metrics["hierarchy/subgoals_reached"] == 0.0
        assert metrics["hierarchy/set_share/inspect"] == 1.0  # the share of games that set it
    # null: never (the manager held at its BC weights), from iteration 0 on.
    play = HierarchyPlay(_tiny(tmp_path, "polyturn/SQLAnalyst-v0", "hierarchy.manager_every=null"), policies=seated,
                         out=tmp_path)
    for it in (0, 1):
        batches, metrics = iteration(play, it)
        assert batches[MANAGER] == [] and len(batches[WORKER]) == 1 and metrics["hierarchy/manager_updates"] == 0.0


@pytest.mark.slow
def test_a_two_iteration_hierarchical_run_with_a_lora_pretrained_actor(tmp_path, local_model):
    """configs/customer_service_hier_smollm2.yaml, the small local Llama in place of SmolLM2."""
    assert load_config(CONFIGS / "customer_service_hier_smollm2.yaml", []).actor.preset == "smollm2-135m"
    cfg = load_config(CONFIGS / "customer_service_hier_smollm2.yaml", [
        f"run.out_dir={tmp_path}", "actor.preset=local", f"actor.path={local_model}", "run.precision=fp32",
        "hierarchy.k=3", "bc.episodes=4", "bc.epochs=1", "bc.batch_episodes=4", "ppo.episodes_per_iter=4",
        "ppo.minibatch_episodes=4", "curriculum.mixed_iters=2", "env.eval_episodes=2", "rollout.num_envs=4",
        "run.train_threads=1", "run.rollout_threads=1", "env.kwargs={max_turns: 4}"])
    summary = Trainer(cfg).run()
    assert summary["eval"]["final"]["episodes"] == 2
    assert (tmp_path / "ckpt-final" / "roles" / "worker" / "actor" / "adapter_config.json").is_file()


def test_a_manager_kl_without_ppo_is_refused_with_the_fix(tmp_path):
    from polyturn.config import ConfigError

    with pytest.raises(ConfigError, match="hierarchy.manager_kl = 0.1 .* set ppo.algo=ppo"):
        _tiny(tmp_path, "polyturn/SQLAnalyst-v0", "hierarchy.manager_kl=0.1", "ppo.algo=rft")
    cfg = _tiny(tmp_path, "polyturn/SQLAnalyst-v0", "ppo.kl_coef=0.0")
    assert cfg.manager_config().ppo.kl_coef == 0.05 and cfg.ppo.kl_coef == 0.0  # the worker's is untouched


def test_a_hierarchy_over_an_env_without_subgoals_is_refused_with_the_fix(tmp_path):
    (tmp_path / "d.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="TwentyQuestions-v0 to offer subgoals.*add a subgoal menu"):
        Trainer(_tiny(tmp_path, "polyturn/TwentyQuestions-v0"))
    with pytest.raises(ValueError, match="TwentyQuestions-v0 to offer subgoals.*hierarchy.mode=free"):
        Trainer(_tiny(tmp_path / "given", "polyturn/TwentyQuestions-v0", f"bc.demos={tmp_path / 'd.jsonl'}"))


@pytest.mark.xdist_group("serve_hierarchy")  # the session's hier_sql_run is trained once, with tests/acting's
def test_a_resumed_hierarchical_run_ends_where_the_uninterrupted_one_does(tmp_path, hier_sql_run):
    """Both policies, their optimizers and the sampling continue exactly: the same final weights, bit for bit."""
    from tests.train.conftest import assert_same_weights, stopped_copy

    straight, resumed = hier_sql_run, tmp_path / "resumed"
    stopped_copy(straight, resumed, at="ckpt-iter0001", later=("ckpt-iter0002", "ckpt-final"))
    Trainer(_tiny(resumed, "polyturn/SQLAnalyst-v0"), resume=True).run()
    assert_same_weights(straight / "ckpt-final", resumed / "ckpt-final")
    assert_same_weights(straight / "ckpt-final" / "roles" / "worker", resumed / "ckpt-final" / "roles" / "worker")


def _worker_with_unchecked_subgoals() -> Episode:
    def t(action, info, obs="o"):
        return Turn(observation=obs, action=action, action_ids=[1], logprobs=[0.0], reward=0.1, reward_terms={},
                    terminated=False, truncated=False, info=info, privileged="", features={})

    a = {"subgoal_index": 0, "subgoal_text": "Look at the sales view.", "subgoal_checked": False}
    b = {"subgoal_index": 1, "subgoal_text": "Find the zone.", "subgoal_checked": False}
    c = {"subgoal_index": 2, "subgoal_text": "Inspect the schema.", "subgoal_checked": True}
    return Episode(env_id="polyturn/SQLAnalyst-v0", seed=0, task_id="t", question="Revenue of X?", level=0,
                   ambiguous=False, key_actions=[], turns=[
                       t('Action: describe_table[{"table": "sales"}]', {**a, "action_type": "describe_table"}),
                       t("Action: subgoal_done[]", {**a, "action_type": "subgoal_done"}, obs="Columns: zone"),
                       t("Action: list_tables[]", {**b, "action_type": "list_tables"}, obs="Subgoal: Find the zone."),
                       t("Action: subgoal_done[]", {**b, "action_type": "subgoal_done"}),
                       t("Action: subgoal_done[]", {**c, "action_type": "subgoal_done"})])


def test_the_subgoal_judge_pays_the_unchecked_subgoals_it_calls_reached(tmp_path):
    """A real HTTP server speaking the chat-completions protocol (the remote LLM is what cannot run here) judges
    the two unchecked subgoals the worker declared done; only the one it scores 9 pays the intrinsic reward, on its
    subgoal_done turn; a second pass is answered from the cache."""
    from polyturn.config import JudgeConfig
    from polyturn.train.hierarchy import SubgoalJudge
    from tests.acting.judge_server import JudgeServer

    def reply(prompt: str) -> str:
        return "Reached.\nScore: 9" if "Subgoal: Look at the sales view." in prompt else "No.\nScore: 2"

    with JudgeServer(reply) as srv:
        judge = SubgoalJudge(JudgeConfig(model="judge", endpoint=srv.url), out_dir=tmp_path, intrinsic=0.5)
        worker = _worker_with_unchecked_subgoals()
        metrics = judge.apply([worker])
        assert metrics == {"hierarchy/judged": 2.0, "hierarchy/judged_reached": 0.5, "hierarchy/judge_malformed": 0.0}
        assert [t.reward_terms.get(INTRINSIC) for t in worker.turns] == [None, 0.5, None, None, None]
        assert worker.turns[1].reward == pytest.approx(0.6)
        first, second = sorted(srv.prompts, key=lambda p: "Find the zone" in p)
        assert 'AGENT: Action: describe_table[{"table": "sales"}]' in first
        assert "ENV: Columns: zone" in first  # what the env answered the last action on the subgoal
        assert "AGENT: Action: describe_table" not in second and "AGENT: Action: list_tables[]" in second  # its own
        judge.apply([_worker_with_unchecked_subgoals()])
        assert len(srv.prompts) == 2  # cached
    # scoring: yes_no asks one word about the same turns and reads P(Yes) from the top log-probs.
    probs = lambda p: {"Yes": -0.1, "No": -2.4} if "Look at the sales view." in p else {"No": -0.1, "Yes": -2.4}  # noqa
    with JudgeServer(lambda p: "Yes", top_logprobs=probs) as srv:
        cfg = JudgeConfig(model="judge", endpoint=srv.url, scoring="yes_no")
        worker = _worker_with_unchecked_subgoals()
        SubgoalJudge(cfg, out_dir=tmp_path / "yn", intrinsic=0.5).apply([worker])
        assert [t.reward_terms.get(INTRINSIC) for t in worker.turns] == [None, 0.5, None, None, None]
        assert all(p.endswith("Answer with one word: Yes or No.") and "ENV:" in p for p in srv.prompts)


def test_the_flat_against_hierarchical_benchmark_runs_in_quick_mode(tmp_path, capsys):
    """benchmarks/hierarchy.py --quick: it trains a tiny flat and hierarchical run and reads both kinds."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_hierarchy", CONFIGS.parent / "benchmarks" / "hierarchy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick", "--quick-dir", str(tmp_path), "--json", str(tmp_path / "h.json")]) == 0
    figures = json.loads((tmp_path / "h.json").read_text())
    for arm in ("flat", "hier"):
        (row,) = figures[arm]
        assert row["env_steps"] > 0 and row["wall_min"] > 0 and row["long_n"] + row["short_n"] == 4
    # The hierarchical run's env steps leave out the worker's subgoal_done turns and the manager's turns.
    rl = [m for m in read_jsonl(tmp_path / "hier" / "metrics.jsonl") if m.get("phase") == "mixed"]
    assert figures["hier"][0]["env_steps"] == rl[0]["hierarchy/env_steps"]
    assert "held-out (final)" in capsys.readouterr().out
