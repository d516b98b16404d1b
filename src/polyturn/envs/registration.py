"""Register polyturn's environments with gymnasium.

``import polyturn.envs`` (and so ``import polyturn``) calls :func:`register_envs`,
after which ``gymnasium.make("polyturn/SQLAnalyst-v0", **kwargs)`` works. Entry
points are strings, so registering imports no env module.
"""

from __future__ import annotations

import gymnasium

# env id -> entry point; add new envs here.
ENTRY_POINTS: dict[str, str] = {
    "polyturn/SQLAnalyst-v0": "polyturn.envs.sql.env:SQLAnalystEnv",
    "polyturn/TwentyQuestions-v0": "polyturn.envs.twenty_questions.env:TwentyQuestionsEnv",
    "polyturn/Negotiation-v0": "polyturn.envs.negotiation.env:NegotiationEnv",
    "polyturn/CustomerService-v0": "polyturn.envs.customer_service.env:CustomerServiceEnv",
}


def register_envs() -> None:
    """Register every polyturn env id (idempotent)."""
    for env_id, entry_point in ENTRY_POINTS.items():
        if env_id not in gymnasium.registry:
            # max_turns truncation lives in the env itself, so no TimeLimit wrapper here.
            gymnasium.register(id=env_id, entry_point=entry_point)
