"""Best-of-n: sample n candidate turns, play the action critic's favourite (``rollout.best_of``, ``--best-of``).

A critic that reads privileged text is a training-time object: the hidden
information does not exist at deployment. :func:`deployable_scorer` refuses one
at evaluation and serving unless the caller labels the result an oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyturn.models.action_critic import ActionCritic, load_action_critic
from polyturn.models.critic_text import CriticInput


class PrivilegedCriticError(ValueError):
    """A critic that reads privileged text was asked to act where that text does not exist."""


class CriticScorer:
    """Scores candidate turns with an action-level critic (no grad, eval mode), on its own device."""

    def __init__(self, critic: ActionCritic, *, batch_size: int = 64) -> None:
        self.critic = critic.eval()
        self.batch_size = batch_size

    @property
    def privileged(self) -> bool:
        """Whether the critic reads privileged text."""
        return self.critic.include_privileged

    def __call__(self, inputs: Sequence[CriticInput]) -> list[float]:
        with torch.no_grad():
            return self.critic.scores(list(inputs), batch_size=self.batch_size).float().cpu().tolist()


def deployable_scorer(critic_dir: str, *, oracle: bool, where: str = "evaluation") -> CriticScorer:
    """Load the action critic in ``critic_dir`` for acting; a privileged one only with ``oracle``."""
    scorer = CriticScorer(load_action_critic(critic_dir))
    if scorer.privileged and not oracle:
        raise PrivilegedCriticError(
            f"Expected an unprivileged critic at {where}, got {critic_dir}, which reads privileged text "
            "(trained with critic.privileged: true): that information does not exist at deployment. Use a critic "
            "trained with critic.privileged=false, or pass --oracle to run it as an oracle upper bound (the row "
            "is labelled oracle)."
        )
    return scorer


def pick_best(scores: Sequence[float]) -> int:
    """Index of the highest score (the first of ties)."""
    if not scores:
        raise ValueError("Expected at least one candidate score, got none")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))
