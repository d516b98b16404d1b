"""Off-policy evaluation at turn level: importance weights, per-decision WIS, weighted doubly robust, ESS.

Inputs are padded ``[N, T]`` arrays over N recorded episodes of at most T turns (NumPy, float64):

* ``log_ratios[i, t]`` = ``sum over turn t's action tokens of (log pi_new - log pi_behaviour)``: the turn's
  importance ratio in log space (a turn is one decision; its tokens' ratios multiply);
* ``mask[i, t]``: turn t exists in episode i;
* ``rewards[i, t]``: turn t's reward (0 past the end);
* ``values[i, t]``: the critic's ``V(s_t)`` before turn t (0 past the end).

The cumulative weight of turn t is ``w_t = min(clip, prod_{k <= t} rho_k)`` (truncated importance sampling:
the product, not each factor, is clipped, so one unlikely turn cannot make an episode weigh more than ``clip``
episodes). Past an episode's end its weight stays that of its last turn with reward 0 (an absorbing state), so
every step ``t`` normalises over all N episodes, as in Thomas (2015) and Thomas & Brunskill (2016).

Estimates are undiscounted (``gamma = 1``): the value of a recorded episode is its ``return``. Everything works
in log space, so weights that underflow ``exp`` (a policy far from the behaviour) still normalise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import bootstrap


def _check(name: str, x: np.ndarray, shape: tuple[int, ...]) -> None:
    if x.shape != shape:
        raise ValueError(f"Expected {name} of shape {shape}, got {x.shape}")


def log_weights(log_ratios: np.ndarray, mask: np.ndarray, *, clip: float) -> np.ndarray:
    """Cumulative per-decision log-weights ``log w[i, t]`` (clipped at ``log clip``; carried past the end).

    >>> lw = log_weights(np.log([[2.0, 3.0], [0.5, 1.0]]), np.array([[True, True], [True, False]]), clip=5.0)
    >>> np.exp(lw).round(6).tolist()
    [[2.0, 5.0], [0.5, 0.5]]
    """
    if clip <= 0:
        raise ValueError(f"Expected clip > 0 (the most one episode may weigh), got {clip}")
    _check("mask", mask, log_ratios.shape)
    if mask.size and not mask[:, 0].all():
        raise ValueError("Expected every episode to have at least one turn (mask[:, 0] all true)")
    lw = np.cumsum(np.where(mask, log_ratios, 0.0), axis=1)  # past the end: the last turn's product carried
    return np.minimum(lw, np.log(clip))


def _normalised(lw: np.ndarray) -> np.ndarray:
    """Self-normalised weights ``w[i, t] / sum_i w[i, t]`` per step, from log-weights (no underflow to 0/0)."""
    z = np.exp(lw - lw.max(axis=0, keepdims=True))
    return z / z.sum(axis=0, keepdims=True)


def per_decision_wis(lw: np.ndarray, rewards: np.ndarray) -> float:
    """Per-decision weighted importance sampling: ``sum_t sum_i w[i,t] r[i,t] / sum_i w[i,t]``.

    With every weight equal (the behaviour policy evaluated on its own records) it is the mean return.

    >>> per_decision_wis(np.zeros((2, 2)), np.array([[1.0, 2.0], [3.0, 0.0]]))
    3.0
    """
    _check("rewards", rewards, lw.shape)
    return float((_normalised(lw) * rewards).sum())


def weighted_doubly_robust(lw: np.ndarray, rewards: np.ndarray, values: np.ndarray) -> float:
    """Weighted doubly robust (Thomas & Brunskill 2016, WDR) with a state-value critic.

    ``sum_t sum_i [wn[i,t] r[i,t] - (wn[i,t] - wn[i,t-1]) V[i,t]]``, with ``wn`` the per-step normalised weights
    and ``wn[i,-1] = 1/N``. A critic of V(s) only serves as the model's Q(s, a) = V(s) for every action, so
    ``E_new[Q(s_t, .)] = V(s_t)``: each term's correction has mean zero whatever the critic, and the better it
    predicts the return still to come, the more of the weights' noise it cancels. With equal weights it is the
    mean return, whatever the values.

    >>> weighted_doubly_robust(np.zeros((2, 1)), np.array([[1.0], [3.0]]), np.array([[5.0], [7.0]]))
    2.0
    """
    _check("rewards", rewards, lw.shape)
    _check("values", values, lw.shape)
    wn = _normalised(lw)
    prev = np.concatenate([np.full((lw.shape[0], 1), 1.0 / lw.shape[0]), wn[:, :-1]], axis=1)
    return float((wn * rewards - (wn - prev) * values).sum())


def effective_sample_size(lw_final: np.ndarray) -> float:
    """Kish's effective sample size of the episodes' final weights: ``(sum w)^2 / sum w^2`` (N when all equal).

    >>> effective_sample_size(np.log(np.array([1.0, 1.0, 2.0])))
    2.6666666666666665
    """
    z = np.exp(lw_final - lw_final.max())
    return float(z.sum() ** 2 / (z**2).sum())


def bootstrap_interval(
    statistic: Callable[[np.ndarray], float], n: int, *, confidence: float = 0.95, n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile bootstrap interval of ``statistic(episode_indices)`` over ``n`` episodes
    (:func:`scipy.stats.bootstrap`, episodes resampled with replacement, the estimator recomputed on each
    resample: a weighted estimator's normalisation is part of what varies)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"Expected confidence in (0, 1), got {confidence}")
    if n < 2:
        raise ValueError(f"Expected at least 2 episodes for a bootstrap interval, got {n}")
    res = bootstrap((np.arange(n),), lambda idx: statistic(np.asarray(idx, dtype=np.int64)), vectorized=False,
                    n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                    rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
