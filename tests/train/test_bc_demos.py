"""BC reads the demonstrations in the very context the rollouts sample from."""

from __future__ import annotations

import pytest

from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.train.logger import read_metrics
from polyturn.train.bc_phase import behaviour_cloning
from polyturn.train.trainer import NullReporter, Trainer
from tests.conftest import StepsReporter


def _prefix(seg) -> list[int]:
    """The tokens before the first action token (system prompt, task, assistant opening)."""
    return seg.ids[: seg.action_mask.index(1)]


def test_bc_segments_carry_the_rollout_system_prompt(tmp_path, make_cfg, demos):
    tr = Trainer(make_cfg(tmp_path, "rollout.system_prompt=true", "rollout.context_budget=1024"))
    rec = tr.demos[0]
    (ep,) = tr.collector.collect([{"seed": rec["seed"], "options": {}}], temperature=1.0)
    rollout_prefix = _prefix(ep.segments[0])
    assert tr.envs[0].unwrapped.tool_docs() in tr.actor.tokenizer.decode(rollout_prefix)
    assert _prefix(tr.policy.demos[0][0]) == rollout_prefix


def test_bc_segments_without_system_prompt_match_too(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path))
    rec = tr.demos[0]
    (ep,) = tr.collector.collect([{"seed": rec["seed"], "options": {}}], temperature=1.0)
    assert _prefix(tr.policy.demos[0][0]) == _prefix(ep.segments[0])


class Recorder(NullReporter):
    """A reporter that keeps its messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)


def test_too_many_cut_demo_actions_is_a_clear_error(tmp_path, make_cfg):
    with pytest.raises(ValueError, match=r"rollout\.max_action_tokens = 8 tokens.*raise rollout\.max_action_tokens"):
        Trainer(make_cfg(tmp_path, "rollout.max_action_tokens=8"))


def test_a_few_cut_demo_actions_are_reported(tmp_path, make_cfg, demos):
    recs = read_jsonl(demos)  # 68 actions, none near the cap of 48 tokens
    recs[0]["turns"][0]["action"] = "Thought: " + "look at every table first " * 30 + "\nAction: list_tables[{}]"
    path = tmp_path / "demos.jsonl"
    write_jsonl(path, recs)
    rep = Recorder()
    tr = Trainer(make_cfg(tmp_path / "run", f"bc.demos={path}", "bc.epochs=0.01"), reporter=rep)
    assert tr.demo_cut["bc/cut_actions"] == 1 and 0 < tr.demo_cut["bc/cut_share"] <= 0.02
    assert any("1 of 68 demonstration actions" in m and "rollout.max_action_tokens = 48" in m for m in rep.messages)
    behaviour_cloning(tr.policy, logger=tr.logger, rep=tr.rep, extra=tr.demo_cut)
    bc = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "bc"]
    assert bc and bc[0]["bc/cut_actions"] == 1


def test_an_rl_iteration_counts_its_sampled_episodes_and_update_steps_on_the_reporter(tmp_path, make_cfg):
    rep = StepsReporter()
    tr = Trainer(make_cfg(tmp_path, "ppo.episodes_per_iter=6", "ppo.minibatch_episodes=4", "ppo.epochs=2",
                          "ppo.target_kl=null", "curriculum.warmup_iters=0"), reporter=rep)
    tr.rl_iteration(0)
    # 6 episodes sampled, then 2 epochs of 2 minibatches (4 + 2 episodes), each step counted as taken
    assert rep.steps == [["sampling", 6, 6], ["update", 4, 4]]
    assert rep.calls == [("sampling", 1)] * 6 + [("update", 1)] * 4
