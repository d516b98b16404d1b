"""Each diagnose check on synthetic logs: quiet on noise of the logged size, firing on a change well beyond it."""

from __future__ import annotations

import numpy as np
import pytest

from polyturn.health import checks as C


def log(n: int = 20, **series) -> list[dict]:
    """RL records ``iter`` 0..n-1 with the given per-iteration series (callables of the iteration or lists)."""
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


def healthy_run(seed: int, *, n_iter: int = 90, episodes: int = 64) -> list[dict]:
    """A demo-like healthy run: success climbs 0.40 -> 0.62 with binomial noise of ``episodes`` per iteration.

    Every per-iteration metric is simulated the way the trainer logs it: means over that iteration's episodes.
    """
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n_iter):
        p = 0.40 + 0.22 * i / n_iter
        k = rng.binomial(episodes, p)
        repeats = rng.poisson(0.3 * episodes)
        turns = 5 * episodes
        recs.append({
            "phase": "ppo", "iter": i, "charts/episodes": float(episodes), "charts/success_rate": k / episodes,
            "reward/outcome/success": 10 * k / episodes, "reward/outcome/failure": -5 * (episodes - k) / episodes,
            "reward/process/valid_call": 0.05 * rng.binomial(turns, 0.7 + 0.1 * min(1.0, i / 40)) / episodes,
            "reward/subgoal/schema_inspected": 0.2 * rng.binomial(episodes, 0.9) / episodes,
            "reward/penalty/repeat": -0.5 * repeats / episodes,
            "reward/penalty/sandbox": -0.3 * rng.poisson(0.02 * episodes) / episodes,  # rare: mostly 0
            "losses/entropy": 0.35 - 0.1 * i / n_iter + 0.02 * rng.standard_normal(),
            "losses/value_loss": 0.05 + 0.1 * np.exp(-i / 10) + 0.01 * rng.standard_normal(),
            "losses/explained_variance": 0.2 + 0.06 * rng.standard_normal(),
            "losses/approx_kl": float(rng.gamma(2.0, 0.005)), "losses/clipfrac": float(rng.uniform(0.05, 0.2)),
            "charts/distinct_action_frac": 0.45 + 0.03 * rng.standard_normal(),
            "charts/repeated_episode_frac": rng.binomial(episodes, 0.02) / episodes,
        })
        recs[-1]["charts/return_mean"] = sum(v for key, v in recs[-1].items() if key.startswith("reward/"))
    return recs


# ---- calibration ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_healthy_runs_with_binomial_noise_give_no_warning(seed):
    assert C.check_all(healthy_run(seed), updates_per_iter=4) == []


# ---- reward spikes -------------------------------------------------------------------------------
def test_spike_is_found_where_it_is():
    y = [1.0 + 0.01 * np.sin(i) for i in range(30)]
    y[17] += 2.0
    assert C.spikes(y) == [17]  # the jump up and straight back down is one spike
    step = [0.0] * 15 + [3.0] * 15
    assert C.spikes(step) == [15]  # a level shift is one jump
    assert C.spikes(y, min_jump=5.0) == []  # too small to matter


def test_reward_spike_warning_names_iteration_figures_and_plot():
    ret = [1.0 + 0.01 * ((i * 7) % 5) for i in range(25)]
    ret[12] = 6.0
    w = C.check_reward_spikes(log(25, **{"charts/return_mean": ret, "reward/outcome/success": steady(5.0),
                                         "reward/process/valid_call": steady(0.2)}))
    assert [x.metric for x in w] == ["charts/return_mean"]
    assert w[0].start_iter == 12 and w[0].plot == "rewards.png" and "simplify the reward" in w[0].remedy
    assert "+4.98" in w[0].message and "iteration(s) [12]" in w[0].message


def test_no_spike_for_a_shift_of_a_few_episodes():
    # 3 of 8 episodes submitted a wrong answer, then none did (they ran out of turns): sampling noise, not a spike.
    failure, timeout = [-1.875] + [0.0] * 19, [-3.125] + [-5.0] * 19
    recs = log(20, **{"reward/outcome/failure": failure, "reward/outcome/timeout": timeout,
                      "charts/episodes": steady(8, 0)})
    assert C.check_reward_spikes(recs) == []
    recs = log(20, **{"reward/outcome/failure": failure, "reward/outcome/timeout": timeout,
                      "charts/episodes": steady(512, 0)})
    assert [w.metric for w in C.check_reward_spikes(recs)] == ["reward/outcome/failure", "reward/outcome/timeout"]
    # With less history than SPIKE_MIN_ITERS the jumps' noise is not known yet: no verdict (the live check).
    assert C.check_reward_spikes(recs[: C.SPIKE_MIN_ITERS]) == []


def test_no_spike_for_a_rare_small_penalty():
    sandbox = [0.0] * 30
    sandbox[9] = -0.3 / 64  # one refused query among 64 episodes: an outlier of a mostly-0 series, but tiny
    recs = log(30, **{"reward/penalty/sandbox": sandbox, "reward/outcome/success": steady(5.0)})
    assert C.check_reward_spikes(recs) == []


# ---- reward hacking ------------------------------------------------------------------------------
def test_reward_hacking_fires_when_a_shaping_term_climbs_and_success_does_not():
    term = [0.2] * 8 + list(np.linspace(0.2, 3.0, 12))  # a loophole: paid on every repeat
    w = C.check_reward_hacking(log(20, **{"reward/process/repeat_paid": term, "charts/success_rate": steady(0.3, 0.03),
                                          "charts/episodes": steady(64, 0), "reward/outcome/success": steady(3.0)}))
    assert [x.metric for x in w] == ["reward/process/repeat_paid"]
    assert "outcome-based" in w[0].remedy and w[0].evidence["term_z"] >= C.Z_WARN and "s.e." in w[0].message


def test_reward_hacking_found_in_the_first_iterations():
    term = [0.3, 0.2, 0.3] + [3.0, 3.2, 2.9, 3.1, 3.0, 3.2, 2.8]  # exploited from iteration 3 on
    w = C.check_reward_hacking(log(10, **{"reward/process/repeat_paid": term, "charts/success_rate": steady(0.0, 0.0),
                                          "charts/episodes": steady(16, 0), "reward/outcome/timeout": steady(-5.0, 0)}))
    assert len(w) == 1 and w[0].start_iter == 0 and "iterations 0-2 to 3-7" in w[0].message


def test_no_reward_hacking_when_success_rises_with_the_term():
    term = list(np.linspace(0.1, 3.0, 20))
    succ = list(np.linspace(0.2, 0.9, 20))
    recs = log(20, **{"reward/subgoal/clarified": term, "charts/success_rate": succ, "charts/episodes": steady(64, 0),
                      "reward/outcome/success": steady(3.0)})
    assert C.check_reward_hacking(recs) == []


def test_no_reward_hacking_for_a_small_rise_or_outcome_terms():
    small = list(np.linspace(0.10, 0.25, 20))  # significant but immaterial against an outcome scale of 5
    succ = list(np.linspace(0.5, 0.45, 20))
    assert C.check_reward_hacking(log(20, **{"reward/process/well_formed": small, "charts/success_rate": succ,
                                             "reward/outcome/success": steady(5.0)})) == []
    term = list(np.linspace(-5.0, -1.0, 20))
    assert C.check_reward_hacking(log(20, **{"reward/outcome/failure": term, "charts/success_rate": succ})) == []


# ---- collapse and diversity ----------------------------------------------------------------------
def test_collapse_fires_when_entropy_falls_and_repeats_rise():
    ent = [2.0] * 10 + list(np.linspace(2.0, 0.3, 10))
    rep = [-0.05] * 10 + list(np.linspace(-0.05, -1.0, 10))  # reward/penalty/repeat grows more negative
    w = C.check_collapse(log(20, **{"losses/entropy": ent, "reward/penalty/repeat": rep}))
    assert len(w) == 1 and w[0].kind == "collapse" and w[0].start_iter >= 10
    assert "entropy bonus" in w[0].remedy and "curriculum.temperature" in w[0].remedy


def test_collapse_at_a_low_entropy():
    w = C.check_collapse(log(10, **{"losses/entropy": steady(0.01, 0.002),
                                    "charts/repeated_episode_frac": steady(0.9, 0)}))
    assert len(w) == 1 and "below 0.02" in w[0].message
    assert w[0].evidence["repeat_signal"] == "charts/repeated_episode_frac"
    w = C.check_collapse(log(10, **{"losses/entropy": steady(0.005, 0.001)}))
    assert len(w) == 1 and w[0].evidence["repeat_signal"] is None  # deterministic sampling is collapse by itself


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


def test_low_diversity_from_repeated_episodes_or_fewer_distinct_actions():
    w = C.check_low_diversity(log(12, **{"charts/repeated_episode_frac": [0.0] * 6 + [0.7] * 6}))
    assert [x.metric for x in w] == ["charts/repeated_episode_frac"] and w[0].start_iter <= 6
    dist = [0.5] * 10 + [0.15] * 10
    w = C.check_low_diversity(log(20, **{"charts/distinct_action_frac": dist, "charts/episodes": steady(64, 0)}))
    assert [x.metric for x in w] == ["charts/distinct_action_frac"] and "fell from 0.50" in w[0].message
    assert C.check_low_diversity(log(20, **{"charts/repeated_episode_frac": steady(0.1, 0.05)})) == []


# ---- oscillation and plateau ---------------------------------------------------------------------
def test_oscillation_from_large_steps_for_many_iterations():
    kl = [0.01] * 10 + [0.08] * 12
    cf = [0.1] * 10 + [0.45] * 12
    w = C.check_oscillation(log(22, **{"losses/approx_kl": kl, "losses/clipfrac": cf}))
    assert [x.metric for x in w] == ["losses/approx_kl"] and "lower actor.lr" in w[0].remedy
    kl[12] = 0.2  # one large step is not oscillation
    assert C.check_oscillation(log(22, **{"losses/approx_kl": [0.01] * 12 + [0.2] + [0.01] * 9,
                                          "losses/clipfrac": [0.1] * 12 + [0.5] + [0.1] * 9})) == []


def test_oscillation_from_success_swinging_beyond_binomial_noise():
    swing = [0.3 if i % 2 else 0.7 for i in range(20)]
    w = C.check_oscillation(log(20, **{"charts/success_rate": swing, "charts/episodes": steady(64, 0)}))
    assert [x.metric for x in w] == ["charts/success_rate"] and w[0].evidence["variance_ratio"] > 4
    rng = np.random.default_rng(1)
    noisy = list(rng.binomial(64, 0.5, 40) / 64)  # as much swing as 64 episodes give by chance
    assert C.check_oscillation(log(40, **{"charts/success_rate": noisy, "charts/episodes": steady(64, 0)})) == []


def test_plateau_when_success_return_and_critic_are_flat():
    flat = log(45, **{"charts/success_rate": steady(0.4, 0.0),
                      "charts/return_mean": steady(1.0, 0.0), "losses/explained_variance": steady(0.3, 0.0),
                      "charts/episodes": steady(64, 0)})
    w = C.check_plateau(flat)
    assert [x.metric for x in w] == ["charts/success_rate"] and w[0].end_iter == 44
    assert "late-stage plateau" in w[0].remedy
    rising = log(45, **{"charts/success_rate": list(np.linspace(0.2, 0.7, 45)), "charts/return_mean": steady(1.0, 0.3),
                        "losses/explained_variance": steady(0.3, 0.05), "charts/episodes": steady(64, 0)})
    assert C.check_plateau(rising) == []


def test_stalled_actor_is_a_plateau_only_where_approx_kl_is_measured():
    stalled = log(8, **{"losses/approx_kl": steady(0.0, 0.0)})
    w = C.check_plateau(stalled, updates_per_iter=4)
    assert [x.metric for x in w] == ["losses/approx_kl"] and "actor does not move" in w[0].message
    assert C.check_plateau(stalled, updates_per_iter=1) == []  # one update: approx_kl is 0 by construction
    assert C.check_plateau(log(8, **{"losses/approx_kl": steady(0.002, 0.0005)}), updates_per_iter=4) == []
    # Each iteration stepped one minibatch (approx_kl 0, measured before it) and the KL limit declined the next:
    # the declined one's approx_kl shows the actor moved.
    declined = log(8, **{"losses/approx_kl": steady(0.0, 0.0), "losses/declined_approx_kl": steady(0.2, 0.01)})
    assert C.check_plateau(declined, updates_per_iter=4) == []


# ---- the critic ----------------------------------------------------------------------------------
def test_critic_divergence_fires_on_a_sustained_rise():
    vl = [1.0, 0.8, 0.7, 0.65, 0.6] + [0.6 * 1.5**k for k in range(1, 9)]
    w = C.check_critic_divergence(log(len(vl), **{"losses/value_loss": vl}))
    assert len(w) == 1 and "target network" in w[0].remedy and "x on average" in w[0].message


def test_critic_divergence_fires_on_an_erratic_blow_up():
    # A planted critic learning rate of 1.0 (tests/eval/test_planted_faults.py): the loss jumps by orders of
    # magnitude from one iteration to the next, so its own noise estimate is too wide for the z-test alone.
    vl = [0.0221, 909.6, 50617.9, 61236.7, 766183.5, 1013.0, 64561.9, 8992.9, 296.3, 0.305]
    w = C.check_critic_divergence(log(len(vl), **{"losses/value_loss": vl}))
    assert [x.metric for x in w] == ["losses/value_loss"]
    spike = [0.02] * 5 + [0.02, 0.02, 500.0, 0.02, 0.02]  # one wild minibatch is not divergence
    assert C.check_critic_divergence(log(len(spike), **{"losses/value_loss": spike})) == []


def test_critic_divergence_from_explained_variance_far_below_zero():
    ev = [0.1] * 5 + [-3.0] * 6
    w = C.check_critic_divergence(log(11, **{"losses/explained_variance": ev}))
    assert [x.metric for x in w] == ["losses/explained_variance"]
    one_off = [0.1] * 5 + [-12.0] + [0.1] * 5  # returns with almost no variance make one wild value
    assert C.check_critic_divergence(log(11, **{"losses/explained_variance": one_off})) == []


def test_no_critic_divergence_for_a_noisy_decreasing_loss_or_a_tiny_creep():
    rng = np.random.default_rng(3)
    noisy = list(np.linspace(2.0, 0.5, 30) + 0.05 * rng.standard_normal(30))
    assert C.check_critic_divergence(log(30, **{"losses/value_loss": noisy})) == []
    creep = [1.0 + 0.01 * k for k in range(30)]
    assert C.check_critic_divergence(log(30, **{"losses/value_loss": creep})) == []


def test_non_finite_value_loss_is_divergence():
    recs = log(6, **{"losses/value_loss": steady(0.5)})
    recs[4]["losses/value_loss"] = "nan"  # how RunLogger writes a non-finite float
    w = C.check_critic_divergence(recs)
    assert len(w) == 1 and "not finite" in w[0].message


def test_critic_not_converging_while_returns_are_stable():
    stuck = log(20, **{"losses/value_loss": steady(0.5, 0.05), "charts/return_mean": steady(1.0, 0.2),
                       "losses/explained_variance": steady(0.02, 0.02)})
    w = C.check_critic_not_converging(stuck)
    assert [x.kind for x in w] == ["critic_not_converging"] and "critic.epochs" in w[0].remedy
    learning = log(20, **{"losses/value_loss": list(np.linspace(0.5, 0.1, 20)), "charts/return_mean": steady(1.0, 0.2),
                          "losses/explained_variance": steady(0.02, 0.02)})
    assert C.check_critic_not_converging(learning) == []
    moving = log(20, **{"losses/value_loss": steady(0.5, 0.05), "charts/return_mean": list(np.linspace(-3, 5, 20)),
                        "losses/explained_variance": steady(0.02, 0.02)})
    assert C.check_critic_not_converging(moving) == []  # returns moving: the critic chases a target


@pytest.mark.slow
def test_false_alarm_rate_over_300_healthy_runs():
    """The figure in docs/evaluation.md: 3 of 300 demo-like healthy runs (seeds 1000-1299) get any warning."""
    fired = [C.check_all(healthy_run(seed), updates_per_iter=4) for seed in range(1000, 1300)]
    assert sum(bool(w) for w in fired) == 3


def test_collapse_needs_success_not_to_rise():
    """Entropy falling and repeated calls rising for a while, as success climbs (the demo run): no collapse.

    The same curves with a flat success rate are a collapse.
    """
    n = 60
    entropy = lambda i, rng: 0.35 * 0.97 ** i + 0.005 * rng.standard_normal()  # noqa: E731
    repeat = lambda i, rng: (0.05 if not 25 <= i < 40 else 0.18) + 0.01 * rng.standard_normal()  # noqa: E731
    rising = log(n, **{"losses/entropy": entropy, "reward/penalty/repeat": repeat, "charts/episodes": [64] * n,
                       "charts/success_rate": lambda i, rng: 0.33 + 0.3 * i / n + 0.03 * rng.standard_normal()})
    flat = log(n, **{"losses/entropy": entropy, "reward/penalty/repeat": repeat, "charts/episodes": [64] * n,
                     "charts/success_rate": lambda i, rng: 0.33 + 0.03 * rng.standard_normal()})
    assert C.check_collapse(rising) == []
    (w,) = C.check_collapse(flat)
    assert w.kind == "collapse" and "repeat" in w.message


def test_no_critic_warning_from_ill_conditioned_explained_variance():
    # Each iteration's returns are nearly constant (sd 0.005 around -5); the critic is off by about 0.1. The ratio
    # 1 - Var(G - V) / Var(G) is then about -400: it measures the spread of ~0, not the critic, so it is not logged
    # as a number (NaN, which RunLogger writes as "nan") and no check reads it.
    import torch

    from polyturn.algos.value import explained_variance

    rng = np.random.default_rng(0)
    evs = []
    for _ in range(20):
        g = torch.from_numpy(-5.0 + 0.005 * rng.standard_normal(64))
        evs.append(float(explained_variance(g + torch.from_numpy(0.1 * rng.standard_normal(64)), g, torch.ones(64))))
    recs = log(20, **{"losses/explained_variance": evs, "losses/value_loss": steady(0.5, 0.05),
                      "charts/return_mean": steady(-5.0, 0.005)})
    assert C.check_critic_divergence(recs) == [] and C.check_critic_not_converging(recs) == []
