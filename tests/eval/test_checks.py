"""Each diagnose warning on synthetic logs that should, and should not, trigger it."""

from __future__ import annotations

import numpy as np
import pytest

from polyturn.eval import checks as C


def log(n: int = 20, **series) -> list[dict]:
    """RL records ``iter`` 0..n-1 with the given per-update series (callables of the iteration or lists)."""
    rng = np.random.default_rng(0)
    out = [{"phase": "bc", "step": 0, "losses/bc_loss": 1.0}]  # non-RL records are ignored
    for i in range(n):
        rec = {"phase": "ppo", "iter": i, "step": 100 + i}
        for k, f in series.items():
            rec[k] = float(f[i]) if isinstance(f, (list, np.ndarray)) else float(f(i, rng))
        out.append(rec)
    return out


def steady(level: float, noise: float = 0.01):
    return lambda i, rng: level + noise * rng.standard_normal()


# ---- reward spikes -------------------------------------------------------------------------------
def test_spike_is_found_where_it_is():
    y = [1.0 + 0.01 * np.sin(i) for i in range(30)]
    y[17] += 2.0
    assert C.spikes(y) == [17]  # the jump up and straight back down is one spike
    step = [0.0] * 15 + [3.0] * 15
    assert C.spikes(step) == [15]  # a level shift is one jump


def test_no_spike_in_a_smooth_trend_or_noise():
    rng = np.random.default_rng(0)
    assert C.spikes(np.linspace(0, 5, 40)) == []
    assert C.spikes(np.linspace(0, 5, 40) + 0.05 * rng.standard_normal(40)) == []


def test_reward_spike_warning():
    ret = [1.0 + 0.01 * ((i * 7) % 5) for i in range(25)]
    ret[12] = 6.0
    w = C.check_reward_spikes(log(25, **{"charts/return_mean": ret, "reward/process/valid_call": steady(0.2)}))
    assert [x.metric for x in w] == ["charts/return_mean"]
    assert w[0].start_iter == 12 and "simplify the reward" in w[0].remedy


# ---- collapse ------------------------------------------------------------------------------------
def test_collapse_fires_when_entropy_falls_and_repeats_rise():
    ent = [2.0] * 10 + list(np.linspace(2.0, 0.6, 10))
    rep = [-0.05] * 10 + list(np.linspace(-0.05, -1.0, 10))  # reward/penalty/repeat grows more negative
    w = C.check_collapse(log(20, **{"losses/entropy": ent, "reward/penalty/repeat": rep}))
    assert len(w) == 1 and w[0].kind == "collapse" and w[0].start_iter >= 5
    assert "entropy bonus" in w[0].remedy


def test_no_collapse_when_entropy_falls_but_repeats_do_not_rise():
    ent = list(np.linspace(2.0, 0.5, 20))  # a normal, sharpening policy
    assert C.check_collapse(log(20, **{"losses/entropy": ent, "reward/penalty/repeat": steady(-0.05, 0.005)})) == []


def test_no_collapse_when_repeats_rise_but_entropy_holds():
    rep = list(np.linspace(0.0, 0.5, 20))
    assert C.check_collapse(log(20, **{"losses/entropy": steady(2.0), "charts/repeat_rate": rep})) == []


def test_degenerate_text_is_collapse():
    bad = ["<|assistant|>" * 12, "aaaaaaaaaaaa", "Action: list_tables[{}]"]
    w = C.check_degenerate_text(bad)
    assert len(w) == 1 and w[0].kind == "collapse" and w[0].evidence["share"] == pytest.approx(2 / 3)
    fine = ['Action: run_sql[{"sql": "SELECT 1"}]', "Thought: check.\nAction: list_tables[{}]"] * 5
    assert C.check_degenerate_text(fine) == []


# ---- reward hacking ------------------------------------------------------------------------------
def test_reward_hacking_fires_when_a_process_term_rises_while_success_falls():
    term = [0.1] * 8 + list(np.linspace(0.1, 0.6, 12))
    succ = [0.6] * 8 + list(np.linspace(0.6, 0.2, 12))
    w = C.check_reward_hacking(log(20, **{"reward/process/valid_call": term, "charts/success_rate": succ,
                                          "reward/outcome/success": steady(5.0)}))
    assert [x.metric for x in w] == ["reward/process/valid_call"]
    assert "outcome-based" in w[0].remedy


def test_no_reward_hacking_when_success_rises_with_the_term():
    term = list(np.linspace(0.1, 0.6, 20))
    succ = list(np.linspace(0.2, 0.7, 20))
    assert C.check_reward_hacking(log(20, **{"reward/subgoal/clarified": term, "charts/success_rate": succ})) == []


def test_no_reward_hacking_for_outcome_terms():
    term = list(np.linspace(-5.0, -1.0, 20))  # outcome terms are not process/sub-goal terms
    succ = list(np.linspace(0.7, 0.2, 20))
    assert C.check_reward_hacking(log(20, **{"reward/outcome/failure": term, "charts/success_rate": succ})) == []


# ---- critic divergence ---------------------------------------------------------------------------
def test_critic_divergence_fires_on_a_steady_rise():
    vl = [1.0, 0.8, 0.7, 0.65, 0.6] + [0.6 * 1.2**k for k in range(1, 9)]
    w = C.check_critic_divergence(log(len(vl), **{"losses/value_loss": vl}))
    assert len(w) == 1 and w[0].start_iter == 4 and "target network" in w[0].remedy


def test_no_critic_divergence_for_a_noisy_decreasing_loss_or_a_tiny_creep():
    rng = np.random.default_rng(3)
    noisy = list(np.linspace(2.0, 0.5, 30) + 0.05 * rng.standard_normal(30))
    assert C.check_critic_divergence(log(30, **{"losses/value_loss": noisy})) == []
    creep = [1.0 + 0.001 * k for k in range(12)]  # rises every update but by 1% overall: below the factor
    assert C.check_critic_divergence(log(12, **{"losses/value_loss": creep})) == []


def test_non_finite_value_loss_is_divergence():
    recs = log(6, **{"losses/value_loss": steady(0.5)})
    recs[4]["losses/value_loss"] = "nan"  # how RunLogger writes a non-finite float
    w = C.check_critic_divergence(recs)
    assert len(w) == 1 and "not finite" in w[0].message


def test_check_all_on_a_healthy_log_is_quiet():
    rng = np.random.default_rng(5)
    n = 30
    healthy = log(n, **{
        "charts/return_mean": list(np.linspace(-2, 6, n) + 0.1 * rng.standard_normal(n)),
        "charts/success_rate": list(np.linspace(0.1, 0.7, n)),
        "reward/process/valid_call": list(np.linspace(0.1, 0.2, n)),
        "reward/penalty/repeat": steady(-0.05, 0.005),
        "losses/entropy": list(np.linspace(2.0, 1.5, n)),
        "losses/value_loss": list(np.linspace(3.0, 1.0, n) + 0.05 * rng.standard_normal(n)),
    })
    assert C.check_all(healthy, actions=["Action: list_tables[{}]"] * 3) == []
