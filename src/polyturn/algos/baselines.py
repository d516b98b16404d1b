"""Critic-free baselines: compare each episode with others of the same task.

With ``critic.kind: none`` several episodes are collected per task (a group)
and each episode's advantage is its return minus the other episodes' mean
(RLOO, ``leave_one_out=True``) or the group mean (GRPO), optionally divided
by the group's standard deviation (GRPO).
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyturn.algos._validate import check_float, check_positive, check_shape, check_tensor


def group_relative_advantages(
    returns: Tensor,
    group_ids: Tensor,
    *,
    normalize_std: bool = False,
    leave_one_out: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Per-episode advantages relative to the other episodes of the same task.

    For episode ``i`` in a group of ``n`` episodes with mean return ``mu``::

        leave_one_out=True:   A_i = R_i - mean_{j != i} R_j = n / (n - 1) * (R_i - mu)
        leave_one_out=False:  A_i = R_i - mu
        normalize_std=True:   A_i /= (std + eps), std the group's sample std (n - 1)

    A group of one episode has no baseline and gets advantage 0.

    Args:
        returns: ``[N]`` float, each episode's return.
        group_ids: ``[N]`` integer, the task (group) of each episode; any
            values, groups need not be contiguous.
        normalize_std: divide by the group's standard deviation (GRPO).
        leave_one_out: baseline is the mean of the *other* episodes (RLOO),
            which keeps the estimate unbiased; otherwise the group mean.
        eps: added to the std so a group of equal returns gives 0.

    Returns:
        ``[N]`` advantages with the dtype of ``returns``, one per episode;
        broadcast it over the episode's turns or action tokens.
    """
    returns = check_float("returns", returns, ndim=1)
    group_ids = check_tensor("group_ids", group_ids)
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise TypeError(f"Expected group_ids to be an integer tensor, got dtype {group_ids.dtype}")
    check_shape("group_ids", group_ids, returns.shape, "returns")
    check_positive("eps", eps)

    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0

    def group_sum(x: Tensor) -> Tensor:
        """Sum of ``x`` over each episode's group, broadcast back to ``[N]``."""
        return x.new_zeros(n_groups).index_add(0, group, x)[group]

    n = group_sum(torch.ones_like(returns))
    centered = returns - group_sum(returns) / n
    dof = (n - 1).clamp(min=1)  # groups of one are zeroed below
    adv = centered * n / dof if leave_one_out else centered
    if normalize_std:
        adv = adv / ((group_sum(centered**2) / dof).sqrt() + eps)
    return torch.where(n > 1, adv, 0.0)
