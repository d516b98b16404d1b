"""A scripted agent for ``polyturn/CustomerService-v0``, exact or with human-like mistakes.

The expert reads only what an agent sees (the customer's messages and the
tool results, with the regular expressions below), never the hidden goal:

1. read the request from the opening message (:data:`REQUESTS`);
2. ask for the email and zip code and verify with ``find_customer``;
3. ask only for the details the request needs (order number; item and reason
   for a refund; item and wanted variant for an exchange; the new address);
4. find the order with ``list_orders`` when the customer does not know its
   number, then read it (``get_order``, or ``track_shipment`` for tracking);
5. check the policy: if the request is forbidden, refuse politely and end;
6. otherwise say what it will do, get a yes, make the one write, and end
   (for tracking: tell the tracking number and status, then end).

:class:`NoiseConfig` gives the per-episode probability of each mistake:
skipping verification (the first account call is refused: a policy
violation), a wrong order id (a failed call, then the right one), asking
again for the email (a re-ask that costs patience), ending the conversation
before the request is resolved, writing before the customer confirmed (a
violation), trying a forbidden request anyway (a violation), and one
malformed action (rewritten on the next turn).

``explain=True`` (off by default, which the shipped figures used) makes each
thought state the facts its decision rests on, so that a small actor copies the
decision from text it has just written instead of recalling it: the request
("The customer wants a refund; ask for the order, the item and the reason."),
the order it looks up, and before the write or the refusal the order's status,
the item's id and the policy's verdict ("O12345 is delivered 3 days ago; the
item is I52604, unwanted; the policy allows refund. Ask for a yes."). The
actions are the same as without it.

``checks=True`` (with ``explain``) spells out two more steps a small actor got
wrong (docs/envs/customer-service.md): after ``list_orders`` the thought first
copies the order line that holds the product, then looks that order up; and
before the verdict it writes each policy check with its answer, stopping at the
first that fails ("checks: delivered? yes; unwanted, within 30 days? 45 > 30,
no; the policy forbids it: ..."), so the verdict follows from text just written.
"""

from __future__ import annotations


import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import Field

from polyturn.envs.actions import format_action
from polyturn.envs.noise import MistakeRates
from polyturn.envs.scripted import Script, ScriptedExpert
from polyturn.envs.customer_service.backend import RETURN_WINDOW_DAYS

#: request type -> pattern of the opening message that names it (checked in this order)
REQUESTS = {
    "exchange": re.compile(r"exchange|swap", re.I),
    "cancel": re.compile(r"cancel", re.I),
    "refund": re.compile(r"return|refund|send something back", re.I),
    "address": re.compile(r"address", re.I),
    "track": re.compile(r"track|where", re.I),
}
#: reason category -> phrases customers use for it
REASON_WORDS = {
    "damaged": re.compile(r"dropped|chewed|spilled|ruined", re.I),
    "defective": re.compile(r"stopped working|defective|faulty|won't turn on|doesn't work", re.I),
    "unwanted": re.compile(r"changed my mind|isn't what i wanted|don't need", re.I),
}
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]*\w")
_ZIP = re.compile(r"zip code is (\d{5})")
_ORDER = re.compile(r"\bO\d{5}\b")
_ITEM = re.compile(r"It's the ([^.()]+?) \(([^()]+)\)\.")
_PRODUCT = re.compile(r"order with the (.+?)\.")
_WANT_VARIANT = re.compile(r"I'd like it in (.+?) instead")
_WANT_PRODUCT = re.compile(r"I'd like the (.+?) instead")
_ADDRESS = re.compile(r"My new address is (.+)\.")
_ORDER_LINE = re.compile(r"^(O\d+) placed \S+, \w+: (.*)$", re.M)
_ITEM_LINE = re.compile(r"^- (I\d+): (.+?) \((.+?)\), [\d.]+, (\w+); other variants: (.*)$", re.M)
_TRACK = re.compile(r"(\w+) tracking (\w+), shipped \S+, (delivered|in transit)")
_VERIFY = "To verify your identity, could you tell me your email and zip code?"
_ASK = {
    "refund": "Which order is it (the order number), which item would you like to return, and why?",
    "exchange": "What is the order number, which item would you like to exchange, and which variant would you "
                "like instead?",
    "cancel": "What is the order number of the order you want to cancel?",
    "track": "What is the order number?",
    "address": "What is your new address?",
}
#: request type -> the thought that names it, with ``explain``
_WANTS = {
    "refund": "The customer wants a refund; ask for the order, the item and the reason.",
    "exchange": "The customer wants an exchange; ask for the order, the item and the variant wanted.",
    "cancel": "The customer wants to cancel an order; ask for its number.",
    "track": "The customer wants to track a package; ask for the order number.",
    "address": "The customer wants to change the address; ask for the new one.",
}


class NoiseConfig(MistakeRates):
    """Per-episode probabilities of the expert's mistakes (all 0: the exact expert)."""

    skip_verification: float = Field(0.0, ge=0, le=1, description="Read the account before verifying.")
    wrong_order: float = Field(0.0, ge=0, le=1, description="First order lookup with a wrong id.")
    repeat_question: float = Field(0.0, ge=0, le=1, description="Ask again for the email.")
    premature_end: float = Field(0.0, ge=0, le=1, description="End before the request is resolved.")
    skip_confirmation: float = Field(0.0, ge=0, le=1, description="Write before the customer said yes.")
    ignore_policy: float = Field(0.0, ge=0, le=1, description="Try a forbidden request anyway.")
    format_error: float = Field(0.0, ge=0, le=1, description="One malformed action, rewritten next turn.")


def reason_of(text: str) -> str | None:
    """The reason category a customer's message gives (see :data:`REASON_WORDS`)."""
    return next((name for name, pattern in REASON_WORDS.items() if pattern.search(text)), None)


def _say(thought: str, tool: str, args: Mapping[str, Any] | None = None) -> str:
    return format_action(tool, dict(args or {}), thought)


def _reply(thought: str, text: str) -> str:
    return _say(thought, "reply", {"text": text})


@dataclass(frozen=True)
class Verdict:
    """The expert's policy check of a refund, exchange or cancellation, from what the agent has read."""

    problem: str  # why the policy forbids it ("" when it allows it)
    facts: str  # the facts the decision rests on, as ``explain`` thoughts write them
    tool: str  # the write that carries the request out
    args: dict[str, Any]
    what: str  # the write in words ("refund the Desk Lamp (white) as unwanted")


def policy_verdict(request: str, answer: str, obs: str, *, order_id: str, product: str, variant: str,
                   checks: bool = False) -> Verdict:
    """The policy check the expert makes after reading the order: ``request`` (refund, exchange or cancel),
    ``answer`` the customer's details (reason, wanted variant), ``obs`` the ``get_order`` observation of the
    order, the item by ``product`` and ``variant``; with ``checks`` the facts list each check with its answer."""
    status = m.group(1) if (m := re.search(r"^Order \S+: (\w+)", obs)) else ""
    days = int(m.group(1)) if (m := re.search(r"Delivered (\d+) days ago", obs)) else 0
    item_id, others = "", []
    for line in _ITEM_LINE.finditer(obs):
        if line.group(2) == product and (not variant or line.group(3) == variant):
            item_id, others = line.group(1), line.group(5).split(", ")
    problem, steps = "", []
    window = f"within {RETURN_WINDOW_DAYS} days? {days} " + (
        f"<= {RETURN_WINDOW_DAYS}, yes" if days <= RETURN_WINDOW_DAYS else f"> {RETURN_WINDOW_DAYS}, no")
    if request == "refund":
        reason = reason_of(answer) or "unwanted"
        steps.append("delivered? " + ("yes" if status == "delivered" else f"no, {status}"))
        if status != "delivered":
            problem = f"the order is {status}, and only delivered items can be refunded"
        elif reason == "damaged":
            steps.append("damaged after delivery? yes")
            problem = "items damaged after delivery cannot be refunded"
        elif reason == "unwanted":
            steps.append(f"unwanted, {window}")
            if days > RETURN_WINDOW_DAYS:
                problem = (f"it was delivered {days} days ago, and unwanted items can only be refunded within "
                           f"{RETURN_WINDOW_DAYS} days")
        else:
            steps.append(f"{reason}, refundable any time? yes")
        args: dict[str, Any] = {"order_id": order_id, "item_id": item_id, "reason": reason}
        tool, what = "refund", f"refund the {product} ({variant}) as {reason}"
    elif request == "exchange":
        wanted = (m.group(1) if (m := _WANT_VARIANT.search(answer) or _WANT_PRODUCT.search(answer)) else "")
        steps.append(f"{wanted} among the other variants ({', '.join(others)})? "
                     + ("yes" if wanted in others else "no"))
        if wanted not in others:
            problem = "exchanges are only possible for another variant of the same product"
        else:
            steps.append(window)
            if days > RETURN_WINDOW_DAYS:
                problem = f"it was delivered {days} days ago, and exchanges are only possible within 30 days"
        args = {"order_id": order_id, "item_id": item_id, "new_variant": wanted}
        tool, what = "exchange", f"exchange the {product} ({variant}) for {wanted}"
    else:
        ok = status in ("pending", "processing")
        steps.append("pending or processing? " + ("yes" if ok else f"no, {status}"))
        if not ok:
            problem = f"the order is already {status}, and only pending or processing orders can be cancelled"
        args, tool, what = {"order_id": order_id}, "cancel_order", "cancel your order"
    facts = f"{order_id} is {status}" + (f" {days} days ago" if days else "") + (
        f"; the item is {item_id}" if request != "cancel" else "") + (
        f", {args['reason']}" if request == "refund" else "")
    if checks:
        facts += "; checks: " + "; ".join(steps)
    return Verdict(problem=problem, facts=facts, tool=tool, args=args, what=what)


def refusal_action(verdict: Verdict, *, explain: bool = False) -> str:
    """The expert's polite refusal of a request ``verdict`` forbids (its thought states the facts with ``explain``)."""
    thought = (f"{verdict.facts}; the policy forbids it: {verdict.problem}. Refuse politely." if explain
               else "The policy forbids this; refuse politely.")
    return _reply(thought, f"I'm sorry, but I can't do that: {verdict.problem}.")


def _write_thought(tool: str) -> str:
    return f"The policy allows it; {tool}."


def write_action(verdict: Verdict) -> str:
    """The write that carries the request out, as the expert writes it once the customer said yes."""
    return _say(_write_thought(verdict.tool), verdict.tool, verdict.args)


def verdict_of(facts: Mapping[str, Any], expert_options: Mapping[str, Any]) -> Verdict:
    """:func:`policy_verdict` on the facts the env marks at a forbidden or allowed state (``info["forbidden"]``,
    ``info["allowed"]``: the request, the customer's details, the order as ``get_order`` shows it, its id, product
    and variant), in the style of ``expert_options`` (``checks``)."""
    return policy_verdict(facts["request"], facts["answer"], facts["order"], order_id=facts["order_id"],
                          product=facts["product"], variant=facts["variant"],
                          checks=bool(expert_options.get("checks", False)))


def refusal_actions(forbidden: Mapping[str, Any], expert_options: Mapping[str, Any]) -> tuple[str, str] | None:
    """``EnvSpec.refusals``: at a state the env marks forbidden (``info["forbidden"]``: the request, the customer's
    details, the order as ``get_order`` shows it, the order id, product and variant, and ``confirmed``), the
    expert's refusal in the style of ``expert_options`` (``explain``, ``checks``, as ``bc.expert_options``) and the
    step that carries the request on instead (:func:`proceed_action`: before the customer's yes, asking for one, the
    turn where the decision is made; after it, the forbidden write), as action texts; None when the expert's own
    check would let the request through."""
    verdict = verdict_of(forbidden, expert_options)
    if not verdict.problem:
        return None
    explain = bool(expert_options.get("explain", False))
    return (refusal_action(verdict, explain=explain),
            proceed_action(verdict, explain=explain, confirmed=bool(forbidden["confirmed"])))


#: The reason a refusal gives at a state where the policy allows the request (the contrast pair's rejected turn).
UNFOUNDED = "the policy does not allow this request"


def contrast_actions(allowed: Mapping[str, Any], expert_options: Mapping[str, Any]) -> tuple[str, str] | None:
    """``EnvSpec.contrasts``: at a state the env marks allowed (``info["allowed"]``: the facts of
    :func:`refusal_actions` and whether the customer has confirmed), the expert's next step in the style of
    ``expert_options`` (before the customer's yes: what it will do, asking for one; after it: the write) and a
    refusal written as the expert writes one, with :data:`UNFOUNDED` as its reason; None when the expert's own
    check would refuse."""
    explain = bool(expert_options.get("explain", False))
    v = verdict_of(allowed, expert_options)
    if v.problem:
        return None
    return (proceed_action(v, explain=explain, confirmed=bool(allowed["confirmed"])),
            refusal_action(replace(v, problem=UNFOUNDED), explain=explain))


def proceed_action(verdict: Verdict, *, explain: bool = False, confirmed: bool = False) -> str:
    """The expert's step that carries a request on, whatever the policy says: before the customer's yes, what it
    will do and a question for the yes (its thought, with ``explain``, the facts and "the policy allows"); after it,
    the write. Where the policy forbids the request, the unconfirmed one is the decision a refusal replaces: the two
    part at the verdict ("allows" / "forbids")."""
    if confirmed:
        return write_action(verdict)
    thought = f"{verdict.facts}; the policy allows {verdict.tool}. Ask for a yes." if explain else (
        "Say what I will do and ask for a yes.")
    return _reply(thought, f"I will {verdict.what}. Shall I proceed?")


class CustomerServiceExpert(ScriptedExpert):
    """Scripted support agent (a :class:`ScriptedExpert`: ``cls(env, noise=..., seed=...)``; it reads only
    observations). ``noise``: a :class:`NoiseConfig`, or one probability for every mistake."""

    NOISE = NoiseConfig
    RNG_NAME = "polyturn-cs-expert"
    END_TOOL = "end_conversation"

    def __init__(self, env: Any, *, noise: float | NoiseConfig = 0.0, seed: int = 0, explain: bool = False,
                 checks: bool = False) -> None:
        super().__init__(env, noise=noise, seed=seed)
        for name, value in (("explain", explain), ("checks", checks)):
            if not isinstance(value, bool):
                raise ValueError(f"Expected {name} to be true or false, got {value!r}")
        if checks and not explain:
            raise ValueError("Expected checks together with explain: true (checks adds steps to its thoughts)")
        self.explain, self.checks = explain, checks

    def _why(self, plain: str, explained: str) -> str:
        """The thought: ``explained`` (the facts behind the decision) with ``explain``, else ``plain``."""
        return explained if self.explain else plain

    def _plan(self, obs: str, info: Mapping[str, Any]) -> None:
        """Draw every mistake up front (in :class:`NoiseConfig`'s field order), then the format error's step."""
        self._mistakes = {name for name in NoiseConfig.model_fields if self._chance(name)}
        self._script = self._agent(obs)
        self._broken_step = self.rng.randrange(4) if "format_error" in self._mistakes else -1

    # ----- script -----------------------------------------------------------------------------
    def _verify(self) -> Generator[str, str, str]:
        answer = yield _reply("Verify the customer's identity first.", _VERIFY)
        email, zip_code = _EMAIL.search(answer), _ZIP.search(answer)
        obs = yield _say("Verify with the email and zip code.", "find_customer",
                         {"email": email.group(0) if email else "", "zip": zip_code.group(1) if zip_code else ""})
        found = re.search(r"Verified customer (C\d+)", obs)
        return found.group(1) if found else ""

    def _account_call(
        self, verified: list[str], thought: str, tool: str, args: dict[str, Any]
    ) -> Generator[str, str, str]:
        """A call that needs a verified customer; verifies first (after the refusal) if skipped."""
        obs = yield _say(thought, tool, args)
        if obs.startswith("Refused: the customer is not verified"):
            verified[0] = yield from self._verify()
            obs = yield _say(thought, tool, args)
        return obs

    def _write(self, verified: list[str], thought: str, tool: str, args: dict[str, Any], confirm: str,
               explained: str) -> Script:
        """Confirm (``explained``: the confirming turn's thought with ``explain``), make the write, end."""
        if "skip_confirmation" not in self._mistakes:
            yield _reply(self._why("Say what I will do and ask for a yes.", explained), confirm)
            yield from self._account_call(verified, thought, tool, args)
        else:
            obs = yield from self._account_call(verified, thought, tool, args)
            if obs.startswith("Refused: the customer has not confirmed"):
                yield _reply("Ask for the confirmation I skipped.", confirm)
                yield _say(thought, tool, args)
        yield _say("The request is done.", "end_conversation")

    def _agent(self, opening: str) -> Script:
        request = next((name for name, pattern in REQUESTS.items() if pattern.search(opening)), "track")
        verified = [""]
        if "skip_verification" not in self._mistakes:
            verified[0] = yield from self._verify()
        answer = yield _reply(self._why("Ask only for the details this request needs.", _WANTS[request]),
                              _ASK[request])
        if "repeat_question" in self._mistakes:
            yield _reply("Check the email again.", "Sorry, could you tell me your email again?")
        if request == "address":
            found = _ADDRESS.search(answer)
            address = found.group(1) if found else ""
            if "premature_end" in self._mistakes:
                yield _say("That should be all.", "end_conversation")
                return
            yield from self._write(verified, "Update the address.", "update_address",
                                   {"address": address},
                                   f"I will change your address to {address}. Shall I proceed?",
                                   f"The new address is {address}; update_address changes it. Ask for a yes.")
            return
        order = _ORDER.search(answer)
        order_id = order.group(0) if order else ""
        item = _ITEM.search(answer)
        product = item.group(1) if item else (m.group(1) if (m := _PRODUCT.search(answer)) else "")
        variant = item.group(2) if item else ""
        found_in = ""  # with checks: the list_orders line that holds the product
        if not order_id:
            wanted = f"{product} ({variant})" if variant else product
            obs = yield from self._account_call(
                verified, self._why("The customer has no order number; list the orders.",
                                    f"The customer has no order number; list the orders to find the {wanted}."),
                "list_orders", {})
            needle = wanted if variant else f"{product} ("
            line = next((m for m in _ORDER_LINE.finditer(obs) if needle in m.group(2)), None)
            order_id, found_in = (line.group(1), line.group(0)) if line else ("", "")
        tool = "track_shipment" if request == "track" else "get_order"
        if "wrong_order" in self._mistakes and order_id:
            wrong = order_id[:-1] + str((int(order_id[-1]) + 1) % 10)
            yield from self._account_call(verified, "Look the order up.", tool, {"order_id": wrong})
        lookup = self._why("Look the order up.", f"Look up order {order_id} with {tool}.")
        if self.checks and found_in:
            lookup = f'The {product} is in this line: "{found_in}". {lookup}'
        obs = yield from self._account_call(verified, lookup, tool, {"order_id": order_id})
        if "premature_end" in self._mistakes:
            yield _say("That should be all.", "end_conversation")
            return
        if request == "track":
            found = _TRACK.search(obs)
            carrier, number, status = found.groups() if found else ("", "", "")
            yield _reply(self._why("Tell the customer where the package is.",
                                   f"{order_id} is {status} with {carrier}, tracking {number}; tell the customer."),
                         f"Your order {order_id} is {status} with {carrier}; the tracking number is {number}.")
            yield _say("The customer has what they needed.", "end_conversation")
            return
        yield from self._resolve(verified, request, answer, obs, order_id, product, variant)

    def _resolve(self, verified: list[str], request: str, answer: str, obs: str, order_id: str, product: str,
                 variant: str) -> Script:
        """Refund, exchange or cancel after the policy check, or refuse politely."""
        v = policy_verdict(request, answer, obs, order_id=order_id, product=product, variant=variant,
                           checks=self.checks)
        problem, facts, tool, args, what = v.problem, v.facts, v.tool, v.args, v.what
        if problem and "ignore_policy" not in self._mistakes:
            yield refusal_action(v, explain=self.explain)
            yield _say("I explained why; end the conversation.", "end_conversation")
            return
        if problem:  # the mistake: try it anyway; the backend refuses, then refuse politely
            yield _reply("Say what I will do and ask for a yes.", f"I will {what}. Shall I proceed?")
            yield _say("Try the request.", tool, args)
            yield _reply("It was refused; apologise.", f"I'm sorry, but I can't do that: {problem}.")
            yield _say("End the conversation.", "end_conversation")
            return
        confirm = f"I will {what}. Shall I proceed?"  # no ids: the customer knows the order; fewer values to copy
        yield from self._write(verified, _write_thought(tool), tool, args, confirm,
                               f"{facts}; the policy allows {tool}. Ask for a yes.")
