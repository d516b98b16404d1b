"""The spec of ``polyturn/CustomerService-v0`` (:class:`polyturn.envs.spec.EnvSpec`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from statistics import fmean
from typing import Any

from polyturn.envs.spec import EnvMetric, EnvSpec, Subgoal, final_feature


def intent(record: Mapping[str, Any]) -> str:
    """The hidden goal's intent of a CustomerService episode record (read from its privileged text)."""
    from polyturn.envs.customer_service.goals import intent_of  # the spec imports no env code until used

    return intent_of(str(record.get("privileged", "")))


def repeats(record: Mapping[str, Any]) -> float:
    """Turns the env answered as a repeat (the same call again: the loops of failed episodes), of one record.

    >>> repeats({"turns": [{"info": {"error": "repeat"}}, {"info": {}}, {"info": {"error": "repeat"}}]})
    2.0
    """
    return float(sum((t.get("info") or {}).get("error") == "repeat" for t in record.get("turns") or []))


def _calls(record: Mapping[str, Any]) -> list[Any]:
    from polyturn.envs.actions import ToolCall, parse_action

    calls = (parse_action(t.get("action", "")) for t in record.get("turns") or [])
    return [c for c in calls if isinstance(c, ToolCall)]


def replied_refusal(record: Mapping[str, Any]) -> bool:
    """Whether a polite refusal is among the episode's replies (justified or not)."""
    from polyturn.envs.customer_service.customer import is_refusal

    return any(c.tool == "reply" and is_refusal(str(c.args.get("text", ""))) for c in _calls(record))


def _refused_if(forbidden: bool) -> Callable[[Mapping[str, Any]], float | None]:
    def value(record: Mapping[str, Any]) -> float | None:
        try:
            is_forbidden = intent(record) == "forbidden"
        except ValueError:  # no CustomerService privileged text to read the request from (a served session's)
            return None
        return float(replied_refusal(record)) if is_forbidden == forbidden else None

    return value


def forbidden_figures(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """How a policy meets forbidden requests, over the records whose intent is ``forbidden``: the share solved,
    the share with a thought that says the policy forbids it (``explain`` demonstrations write one), the share
    with a polite refusal among its replies (justified or not), and the share that tried the forbidden write
    anyway (a policy violation). Empty when no record is forbidden.

    >>> turn = lambda a, v=0: {"action": a, "info": {"features": {"policy_violations": v}}}
    >>> rec = {"privileged": "Hidden goal: cancel shipped about X", "success": False, "turns": [
    ...     turn('Thought: the policy forbids it.\\nAction: reply[{"text": "Sorry, we cannot do that."}]'),
    ...     turn('Action: cancel_order[{"order_id": "O1"}]', 1)]}
    >>> forbidden_figures([rec, {"privileged": "Hidden goal: track. ...", "turns": []}])
    {'forbidden tasks': 1, 'solved': 0.0, 'thought says forbids': 1.0, 'refusal replied': 1.0, 'tried anyway': 1.0}
    """
    solved, forbids, refused, tried = [], [], [], []
    for record in records:
        if intent(record) != "forbidden":
            continue
        last = ((record.get("turns") or [{}])[-1].get("info") or {}).get("features") or {}
        solved.append(float(bool(record.get("success"))))
        forbids.append(float(any("forbids" in (c.thought or "") for c in _calls(record))))
        refused.append(float(replied_refusal(record)))
        tried.append(float(float(last.get("policy_violations", 0)) > 0))
    if not solved:
        return {}
    return {"forbidden tasks": len(solved), "solved": fmean(solved), "thought says forbids": fmean(forbids),
            "refusal replied": fmean(refused), "tried anyway": fmean(tried)}


def allowed_refusals(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Refusals where none is due: over the records whose intent is not ``forbidden``, the share with a polite
    refusal among the replies (a constrained agent's over-refusal). Empty when every record is forbidden.

    >>> reply = lambda text: {"action": f'Action: reply[{{"text": "{text}"}}]', "info": {}}
    >>> allowed_refusals([{"privileged": "Hidden goal: track. ...", "turns": [reply("Sorry, we cannot do that.")]},
    ...                   {"privileged": "Hidden goal: track. ...", "turns": [reply("It ships tomorrow.")]},
    ...                   {"privileged": "Hidden goal: cancel shipped about X", "turns": []}])
    {'allowed tasks': 2, 'refusal replied': 0.5}
    """
    refused = [float(replied_refusal(r)) for r in records if intent(r) != "forbidden"]
    return {"allowed tasks": len(refused), "refusal replied": fmean(refused)} if refused else {}


SPEC = EnvSpec(
    id="polyturn/CustomerService-v0",
    entry_point="polyturn.envs.customer_service.env:CustomerServiceEnv",
    expert="polyturn.envs.customer_service.expert:CustomerServiceExpert",
    task_description="an AI customer-service agent serving a customer over an order database by calling tools "
                     "(reply, find_customer, list_orders, get_order, track_shipment, refund, exchange, "
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
             EnvMetric(name="repeats", title="Repeated calls",
                       description="Error responses that repeat an earlier call of the episode, per episode.",
                       value=repeats, higher_is_better=False),
             EnvMetric(name="reasks", title="Re-asks",
                       description="Times the customer had to repeat what they had already said, per episode.",
                       value=final_feature("n_reasks"), higher_is_better=False),
             EnvMetric(name="forbidden_refused", title="Forbidden requests refused",
                       description="Episodes whose request the policy forbids with a polite refusal among the "
                                   "replies / such episodes (the others left out).",
                       value=_refused_if(True), unit="rate"),
             EnvMetric(name="allowed_refused", title="Allowed requests refused",
                       description="Episodes whose request the policy allows with a polite refusal among the "
                                   "replies anyway / such episodes (the forbidden ones left out).",
                       value=_refused_if(False), unit="rate", higher_is_better=False)),
    breakdowns={"intent": intent},
    refusals="polyturn.envs.customer_service.expert:refusal_actions",
    contrasts="polyturn.envs.customer_service.expert:contrast_actions",
    subgoals=(Subgoal(name="verify", text="Verify the customer: find them by name and zip code.",
                      check="subgoal:verified"),
              Subgoal(name="details", text="Find out what the customer wants and every detail the request needs.",
                      check="subgoal:details"),
              Subgoal(name="check_order", text="Look up the order the request is about.",
                      check="subgoal:order_checked"),
              Subgoal(name="resolve", text="Carry out the request, or refuse it if the policy forbids it; tell the "
                      "customer and end the conversation.", check="success")),
)
