"""Constrained RL by Lagrange multipliers (PPO-Lagrangian): the multiplier update and what the actor reads of it.

The problem is ``max_pi J_r(pi)`` subject to ``J_c_k(pi) <= d_k`` for each cost term ``k`` (``J_c_k`` the mean
cost per episode, ``d_k`` its limit). Its Lagrangian ``J_r - sum_k lambda_k (J_c_k - d_k)`` is maximised over the
policy and minimised over ``lambda >= 0``; the multipliers take one projected gradient step per iteration
(:func:`lagrange_update`, as PPO-Lagrangian does: Ray, Achiam & Amodei 2019), and the policy step follows the
penalised advantage (:func:`lagrangian_advantages`) or, for imitation, imitates the cheap successes most
(:func:`cost_weights`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyturn.algos._validate import check_float, check_like, check_positive, check_shape


def lagrange_update(multipliers: Tensor, costs: Tensor, limits: Tensor, *, lr: float, max_value: float) -> Tensor:
    """One projected gradient-ascent step of the multipliers on the measured constraint violation::

        lambda_k <- clip(lambda_k + lr * (J_c_k - d_k), 0, max_value)

    A cost over its limit raises its multiplier, one under it lowers it, never below 0 (an inequality constraint's
    multiplier) nor above ``max_value`` (which bounds how far one constraint can outweigh the reward).

    >>> lagrange_update(torch.tensor([0.0, 1.0, 9.9]), torch.tensor([0.5, 0.0, 3.0]), torch.tensor([0.1, 0.5, 0.0]),
    ...                 lr=0.5, max_value=10.0)
    tensor([ 0.2000,  0.7500, 10.0000])

    Args:
        multipliers: ``[K]`` float, the current ``lambda_k >= 0``.
        costs: ``[K]`` the iteration's measured mean cost per episode of each term.
        limits: ``[K]`` the limits ``d_k``.
        lr: the multipliers' learning rate (>= 0; 0 keeps them fixed).
        max_value: the clip's upper end (> 0).

    Returns:
        ``[K]`` the new multipliers, dtype of ``multipliers``.
    """
    multipliers = check_float("multipliers", multipliers, ndim=1)
    costs = check_like("costs", costs, "multipliers", multipliers)
    limits = check_like("limits", limits, "multipliers", multipliers)
    if lr < 0:
        raise ValueError(f"Expected lr >= 0, got {lr}")
    check_positive("max_value", max_value)
    return (multipliers + lr * (costs - limits)).clamp(0.0, max_value)


def lagrangian_advantages(adv: Tensor, cost_adv: Tensor, multipliers: Tensor) -> Tensor:
    """The penalised advantage the policy gradient follows::

        A = A_r - sum_k lambda_k * A_c_k

    >>> lagrangian_advantages(torch.tensor([[1.0, 0.5]]), torch.tensor([[[1.0, 0.0]], [[0.5, 2.0]]]),
    ...                       torch.tensor([0.5, 1.0]))
    tensor([[ 0.0000, -1.5000]])

    Args:
        adv: ``[E, T]`` the reward advantages.
        cost_adv: ``[K, E, T]`` each cost term's advantages (higher: more cost to come than expected).
        multipliers: ``[K]`` the ``lambda_k``.

    Returns:
        ``[E, T]``, dtype of ``adv``.
    """
    adv = check_float("adv", adv, ndim=2)
    cost_adv = check_float("cost_adv", cost_adv, ndim=3)
    multipliers = check_float("multipliers", multipliers, ndim=1)
    check_shape("cost_adv", cost_adv, (multipliers.shape[0], *adv.shape), "[K, *adv.shape]")
    return adv - (multipliers.to(cost_adv.dtype)[:, None, None] * cost_adv).sum(0).to(adv.dtype)


def cost_weights(costs: Tensor, multipliers: Tensor) -> Tensor:
    """Each episode's imitation weight once its costs are priced::

        w_e = max(0, 1 - sum_k lambda_k * c_k(e))

    A success is worth 1 to rejection-sampling fine-tuning; its costs, priced at the multipliers, take that much
    off, so while a constraint is active (``lambda_k > 0``) a costly success is imitated less, and not at all once
    its priced cost reaches a success's worth. With every multiplier at 0 every weight is 1 (plain rft).

    >>> cost_weights(torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]]), torch.tensor([0.25, 0.5]))
    tensor([1.0000, 0.7500, 0.0000])

    Args:
        costs: ``[E, K]`` each episode's summed cost of each term (>= 0).
        multipliers: ``[K]`` the ``lambda_k``.

    Returns:
        ``[E]`` in ``[0, 1]``, dtype of ``costs``.
    """
    costs = check_float("costs", costs, ndim=2)
    multipliers = check_float("multipliers", multipliers, ndim=1)
    if costs.shape[1] != multipliers.shape[0]:
        raise ValueError(f"Expected costs of shape [E, {multipliers.shape[0]}] like multipliers, "
                         f"got {tuple(costs.shape)}")
    return (1.0 - costs @ multipliers.to(costs.dtype)).clamp(0.0, 1.0)
