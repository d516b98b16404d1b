"""``polyturn diagnose`` compares the critic with returns in one unit: the env's rewards."""

from __future__ import annotations

import pytest
import torch

from polyturn.eval.diagnose import compare_to_returns, discounted_returns
from polyturn.rollout.types import Episode, Turn


def _episode(rewards: list[float]) -> Episode:
    turns = [Turn(observation="o", action="a", action_ids=[1], logprobs=[0.0], reward=r, reward_terms={},
                  terminated=k == len(rewards) - 1, truncated=False, info={}, privileged="", features={})
             for k, r in enumerate(rewards)]
    return Episode(env_id="e", seed=0, task_id="t", question="q", level=1, ambiguous=False, key_actions=[],
                   turns=turns)


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_a_critic_that_predicts_the_returns_exactly_explains_all_variance(scale):
    gamma = 0.9
    eps = [_episode([-0.01, 0.2, 10.0]), _episode([-0.5, -5.0]), _episode([0.05, 0.05, 0.05, -5.0])]
    # What a perfect critic trained on ppo.reward_scale-scaled returns predicts: the scaled return-to-go.
    values = torch.zeros(3, 4)
    for i, ep in enumerate(eps):
        g = discounted_returns([t.reward for t in ep.turns], gamma)
        values[i, : len(g)] = torch.tensor(g) * scale
    next_values = torch.cat([values[:, 1:], torch.zeros(3, 1)], dim=1)
    check = compare_to_returns(eps, values, next_values, gamma=gamma, reward_scale=scale, checkpoint="c")
    assert check.explained_variance == pytest.approx(1.0, abs=1e-6)
    assert check.mse == pytest.approx(0.0, abs=1e-8)
    assert check.values == pytest.approx(check.returns, abs=1e-5)
    for _, rows in check.tables:  # the TD target r + gamma V(s') is in reward units too
        for r in rows:
            assert r["td_target"] == pytest.approx(r["G"], abs=1e-5)


def test_nearly_constant_returns_make_explained_variance_ill_conditioned(tmp_path):
    from polyturn.eval.diagnose import diagnose_blocks
    from polyturn.eval.document import to_markdown

    eps = [_episode([r]) for r in (-5.0, -5.01, -5.0, -5.02, -5.0, -5.01)]  # one turn each: G = the reward
    values = torch.tensor([[-5.1], [-4.9], [-5.05], [-5.0], [-4.95], [-5.1]])
    check = compare_to_returns(eps, values, values, gamma=0.9, reward_scale=1.0, checkpoint="c")
    assert check.explained_variance is None  # 1 - Var(G - V) / Var(G) would be about -78
    assert check.returns_var == pytest.approx(5.56e-5, rel=0.01)
    text = check.explained_variance_text()
    assert text.startswith("ill-conditioned") and "Var(G) = 5.56e-05" in text
    md = to_markdown(diagnose_blocks(tmp_path, [], warnings=[], critic=check, note=None, held_out=[], pairs={}))
    assert "explained variance = ill-conditioned, not shown: the returns are nearly constant (Var(G) = 5.56e-05" in md


def test_diagnose_reports_the_action_critics_held_out_pair_accuracy(tmp_path):
    import json

    from polyturn.eval.diagnose import diagnose, pair_accuracy_summary

    rows = [{"phase": "mixed", "iter": 0, "critic/pairs": 10.0, "critic/pair_acc": 0.5,
             "critic/pair_acc_first_diff": 0.4, "charts/return_mean": 0.0},
            {"phase": "ppo", "iter": 1, "critic/pairs": 30.0, "critic/pair_acc": 0.9,
             "critic/pair_acc_first_diff": 0.6, "charts/return_mean": 1.0, "critic/branch_pairs": 6.0,
             "critic/branch_acc": 0.5},
            {"phase": "ppo", "iter": 2, "critic/pairs": 0.0, "charts/return_mean": 1.0}]  # no pair: no accuracy
    s = pair_accuracy_summary(rows)
    assert s["critic/pair_acc"] == pytest.approx((0.5 * 10 + 0.9 * 30) / 40)
    assert s["critic/pair_acc_first_diff/last"] == 0.6 and s["critic/pairs"] == 40
    assert s["critic/branch_acc"] == 0.5 and s["critic/branch_pairs"] == 6  # weighted by its own pairs
    assert pair_accuracy_summary([{"phase": "ppo", "iter": 0, "losses/value_loss": 1.0}]) == {}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = diagnose(tmp_path, episodes=0)
    md = res.paths["markdown"].read_text()
    assert "Action critic: held-out pairwise accuracy" in md and "| critic/pair_acc | 0.8 | 0.9 |" in md
    assert "| critic/branch_acc | 0.5 | 0.5 |" in md and "(40 pairs, 6 branch pairs in all)" in md
    assert json.loads(res.paths["json"].read_text())["pair_accuracy"]["critic/pair_acc"] == pytest.approx(0.8)
