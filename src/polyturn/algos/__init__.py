"""Pure tensor functions for training: advantages, policy, BC and critic losses.

Nothing here imports models or environments; every function takes and returns
tensors (losses return a dict of named scalars: ``loss`` plus diagnostics).
"""

from polyturn.algos.baselines import group_relative_advantages
from polyturn.algos.bc import bc_loss
from polyturn.algos.gae import next_state_values, normalize, semi_mdp_rewards, token_advantages, turn_gae
from polyturn.algos.lagrange import cost_weights, lagrange_update, lagrangian_advantages
from polyturn.algos.masked import Agg, aggregate, masked_mean
from polyturn.algos.ppo import a2c_loss, ppo_loss
from polyturn.algos.value import (
    cql_penalty,
    explained_variance,
    polyak_update,
    td_targets,
    value_loss,
)

__all__ = [
    "Agg",
    "a2c_loss",
    "aggregate",
    "bc_loss",
    "cost_weights",
    "cql_penalty",
    "explained_variance",
    "group_relative_advantages",
    "lagrange_update",
    "lagrangian_advantages",
    "masked_mean",
    "next_state_values",
    "normalize",
    "polyak_update",
    "ppo_loss",
    "semi_mdp_rewards",
    "td_targets",
    "token_advantages",
    "turn_gae",
    "value_loss",
]
