"""The signals the health checks read: a run's records, a metric's noise, window shifts, action diversity."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest

from polyturn.health import signals as S


def test_the_noise_estimates():
    rng = np.random.default_rng(0)
    y = np.linspace(0, 10, 400) + rng.normal(0, 0.5, 400)  # a trend does not count as noise
    assert S.noise_sd(y) == pytest.approx(0.5, rel=0.15)
    assert S.binomial_sd(0.5, 64) == pytest.approx(0.0625)
    assert S.binomial_sd(0.0, 8) > 0  # a rate of 0 still has noise
    recs = [{"phase": "bc", "step": 0, "losses/bc_loss": 1.0}]  # non-RL records are ignored
    recs += [{"phase": "ppo", "iter": i, "step": 100 + i, "charts/success_rate": 0.5, "charts/episodes": 64.0}
             for i in range(30)]
    assert S.rate_sd(recs, S.series(recs, "charts/success_rate")[1]) == pytest.approx(0.0625)
    sh = S.shift(np.array([0.0] * 5 + [1.0] * 5), 5, 5, 1.0)
    assert sh.change == 1.0 and sh.z == pytest.approx(1 / np.sqrt(2 / 5))


def test_read_records_skips_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"iter": 0, "phase": "ppo"}) + "\n" + '{"iter": 1, "pha')
    assert S.read_records(path) == [{"iter": 0, "phase": "ppo"}]
    path.write_text('{"iter": 0, "pha\n' + json.dumps({"iter": 1}) + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl:1"):
        S.read_records(path)


def test_action_diversity():
    d = S.action_diversity([["a", "b"], ["a", "b"], ["c"]])
    assert d == {"charts/distinct_action_frac": 0.6, "charts/repeated_episode_frac": pytest.approx(2 / 3)}


def test_doctests_of_the_signals():
    result = doctest.testmod(S)
    assert result.attempted > 0 and result.failed == 0
