"""The spec of ``polyturn/CustomerService-v0`` (:class:`polyturn.envs.spec.EnvSpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyturn.envs.spec import EnvMetric, EnvSpec, final_feature


def intent(record: Mapping[str, Any]) -> str:
    """The hidden goal's intent of a CustomerService episode record (read from its privileged text)."""
    from polyturn.envs.customer_service.goals import intent_of  # the spec imports no env code until used

    return intent_of(str(record.get("privileged", "")))


SPEC = EnvSpec(
    id="polyturn/CustomerService-v0",
    entry_point="polyturn.envs.customer_service.env:CustomerServiceEnv",
    expert="polyturn.envs.customer_service.expert:CustomerServiceExpert",
    task_description="AI customer-service agents. Both served the same customer over an order database and could "
                     "call tools (reply, find_customer, list_orders, get_order, track_shipment, refund, exchange, "
                     "cancel_order, update_address, end_conversation); doing what the customer needs within "
                     "the store's policy matters most",
    action_types=("reply", "find_customer", "list_orders", "get_order", "track_shipment", "refund", "exchange",
                  "cancel_order", "update_address", "end_conversation", "remember"),
    observation_kinds={"reply": "user_reply", "find_customer": "lookup", "list_orders": "lookup",
                       "get_order": "lookup", "track_shipment": "lookup"},
    metrics=(EnvMetric(name="error_responses", title="Error responses",
                       description="Steps with an error (invalid or failed calls, repeats, questions for what the "
                                   "customer already gave), per episode: seed 001's error responses.",
                       value=final_feature("n_errors"), higher_is_better=False),
             EnvMetric(name="policy_violations", title="Policy violations",
                       description="Actions the store's policy refused, per episode.",
                       value=final_feature("policy_violations"), higher_is_better=False),
             EnvMetric(name="reasks", title="Re-asks",
                       description="Times the customer had to repeat what they had already said, per episode.",
                       value=final_feature("n_reasks"), higher_is_better=False)),
    breakdowns={"intent": intent},
)
