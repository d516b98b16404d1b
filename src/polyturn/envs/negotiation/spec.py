"""The spec of ``polyturn/Negotiation-v0`` (:class:`polyturn.envs.spec.EnvSpec`)."""

from __future__ import annotations

from polyturn.envs.spec import EnvMetric, EnvSpec, final_feature


SPEC = EnvSpec(
    id="polyturn/Negotiation-v0",
    entry_point="polyturn.envs.negotiation.factory:make_negotiation_env",
    expert="polyturn.envs.negotiation.expert:NegotiationExpert",
    # opponent="self" (make_env kwargs) gives the two-role self-play game; these players can fill a role
    partners="polyturn.envs.negotiation.players:TRAIN_PLAYERS",
    holdout_partners="polyturn.envs.negotiation.holdout:HOLDOUT_PLAYERS",  # evaluation only
    task_description="an AI negotiator splitting a pool of items with an opponent by calling tools (propose, "
                     "accept, reject, walk_away); a deal worth more to the agent is better",
    action_types=("propose", "accept", "reject", "walk_away", "remember"),
    observation_kinds={"propose": "user_reply", "reject": "user_reply"},
    metrics=(EnvMetric(name="deal_rate", title="Deal rate", description="Episodes that ended in a deal / episodes.",
                       value=final_feature("deal"), unit="rate"),
             EnvMetric(name="deal_worth", title="Deal worth",
                       description="What the agent's share is worth to it, as a fraction of the pool (0 without "
                                   "a deal).", value=final_feature("deal_worth"))),
)
