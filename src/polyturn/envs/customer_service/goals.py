"""Hidden customer goals: the intent, the details the customer knows, and the required final state.

Six intents: ``return``, ``exchange``, ``cancel``, ``change_address``,
``track`` and ``forbidden``: a request the policy forbids, which the agent must
refuse politely without changing anything. A forbidden request looks like an
ordinary one when it opens (the customer asks for a refund, an exchange or a
cancellation); only the data or the details show that it is forbidden:

* ``refund_late``: an unwanted item delivered more than 30 days ago;
* ``refund_damaged``: an item the customer damaged;
* ``exchange_other_product``: an exchange for a different product;
* ``cancel_shipped``: cancelling an order that has shipped or arrived.

:func:`make_goal` draws the world and the goal from ``(seed, level)`` and
plants the order the goal is about (its product appears in no other order of
the customer, so "the Desk Lamp I bought" names one order). Levels: 1 address
change or tracking; 2 cancel or return; 3 exchange or forbidden; +1 when the
customer does not know the order number (the agent must find the order with
``list_orders``).
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass

from polyturn.envs.customer_service.backend import apply_address, apply_cancel, apply_exchange, apply_refund
from polyturn.envs.customer_service.database import PRODUCTS, World, random_address, random_world

INTENTS = ("return", "exchange", "cancel", "change_address", "track", "forbidden")
FORBIDDEN_CASES = ("refund_late", "refund_damaged", "exchange_other_product", "cancel_shipped")
#: case -> what the customer asks for in the opening message
REQUEST = {"return": "refund", "refund_late": "refund", "refund_damaged": "refund", "exchange": "exchange",
           "exchange_other_product": "exchange", "cancel": "cancel", "cancel_shipped": "cancel",
           "change_address": "address", "track": "track"}
BASE_LEVEL = {"change_address": 1, "track": 1, "cancel": 2, "return": 2, "exchange": 3, "forbidden": 3}
LEVELS = (1, 2, 3, 4)
REASON_TEXTS = {
    "unwanted": ("I changed my mind about it.", "It just isn't what I wanted.", "I don't need it anymore."),
    "defective": ("It stopped working after a few days.", "It's defective, it won't turn on.",
                  "It is faulty and doesn't work properly."),
    "damaged": ("I dropped it and it broke.", "My dog chewed it up.", "I spilled coffee on it and now it's ruined."),
}
OPENINGS = {
    "refund": ("I'd like to return an item and get a refund.", "I want to send something back for a refund.",
               "Can I get a refund for something I bought?"),
    "exchange": ("I'd like to exchange an item I bought.", "I want to swap something I ordered for another one.",
                 "Can I exchange something from my order?"),
    "cancel": ("I need to cancel an order.", "Please help me cancel an order I placed.", "I want to cancel my order."),
    "address": ("I moved and need to update the address on my account.", "I need to change my account address.",
                "Can you update my address? I have a new one."),
    "track": ("Where is my package? I'd like to track my order.", "Can you tell me where my order is?",
              "I want to track a shipment."),
}


@dataclass(frozen=True, kw_only=True)
class Persona:
    """How the customer talks and how much patience they have (mistakes they forgive before leaving)."""

    style: str
    patience: int
    greeting: str
    leave_line: str


PERSONAS = (
    Persona(style="polite", patience=3, greeting="Hello! ", leave_line="I'm sorry, this isn't working. Goodbye."),
    Persona(style="busy", patience=2, greeting="Hi. ", leave_line="I don't have time for this. Bye."),
    Persona(style="impatient", patience=1, greeting="", leave_line="Forget it, I'm leaving."),
)


@dataclass(frozen=True, kw_only=True)
class Goal:
    """One episode's hidden goal (see the module docstring); ``answers`` are what the customer says per slot."""

    task_id: str
    level: int
    intent: str
    case: str  # the intent, or the forbidden case
    customer_id: str
    name: str
    email: str
    zip_code: str
    order_id: str | None
    item_id: str | None
    product: str | None
    variant: str | None
    reason: str | None  # defective | unwanted | damaged, for refund requests
    new_variant: str | None
    new_address: str | None
    knows_order_id: bool
    persona: Persona
    opening: str
    answers: dict[str, str]

    @property
    def request(self) -> str:
        """What the customer asks for: refund, exchange, cancel, address or track."""
        return REQUEST[self.case]

    @property
    def forbidden(self) -> bool:
        """Whether the agent must refuse."""
        return self.intent == "forbidden"

    def apply(self, conn: sqlite3.Connection) -> None:
        """Bring ``conn`` (a copy of the initial database) to the state the goal requires."""
        if self.case == "return":
            apply_refund(conn, str(self.item_id))
        elif self.case == "exchange":
            apply_exchange(conn, str(self.item_id), str(self.new_variant))
        elif self.case == "cancel":
            apply_cancel(conn, str(self.order_id))
        elif self.case == "change_address":
            apply_address(conn, self.customer_id, str(self.new_address))

    def required_state(self) -> str:
        """The required final state, in words."""
        return {
            "return": f"item {self.item_id} refunded (a refund payment on order {self.order_id}); nothing else changed",
            "exchange": f"item {self.item_id} exchanged to {self.new_variant}; nothing else changed",
            "cancel": f"order {self.order_id} cancelled and its active items refunded; nothing else changed",
            "change_address": f"customer {self.customer_id}'s address is {self.new_address!r}; nothing else changed",
            "track": f"database unchanged; the customer is told tracking number and status of order {self.order_id}",
        }.get(self.case, f"database unchanged; the agent refuses politely ({self.case.replace('_', ' ')})")

    def privileged(self) -> str:
        """The hidden goal and the required final state, for a privileged critic."""
        about = "" if self.product is None else (
            f" about {self.product} ({self.variant}) = {self.item_id} of {self.order_id}")
        wants = {"reason": self.reason, "wants": self.new_variant, "new address": self.new_address}
        extra = "; ".join(f"{k}: {v}" for k, v in wants.items() if v)
        knows = "" if self.order_id is None else (
            " knows the order number;" if self.knows_order_id else " does not know the order number;")
        return (f"Hidden goal: {self.case.replace('_', ' ')}{about}" + (f"; {extra}" if extra else "") + ". "
                f"Customer {self.name} ({self.customer_id}), email {self.email}, zip {self.zip_code};{knows} "
                f"{self.persona.style}, patience {self.persona.patience}. "
                f"Required final state: {self.required_state()}.")


def intent_of(privileged: str) -> str:
    """The intent (one of :data:`INTENTS`) of the goal whose :meth:`Goal.privileged` text is ``privileged``.

    Episode records keep the privileged text, not the goal, so evaluation reads the intent back from it:
    ``"Hidden goal: refund late about ..."`` is ``forbidden``, ``"Hidden goal: change address. ..."`` is
    ``change_address``. A ValueError for any other text.
    """
    head = privileged.removeprefix("Hidden goal: ")
    if head == privileged:
        raise ValueError(f"Expected a CustomerService privileged text ('Hidden goal: ...'), got {privileged[:60]!r}")
    for case in sorted((*INTENTS, *FORBIDDEN_CASES), key=len, reverse=True):
        name = case.replace("_", " ")
        if head.startswith(name) and head[len(name):len(name) + 1] in (" ", ".", ";"):
            return "forbidden" if case in FORBIDDEN_CASES else case
    raise ValueError(f"Expected one of the goal cases {(*INTENTS, *FORBIDDEN_CASES)}, got {head[:40]!r}")


def _levels_of(intent: str) -> tuple[int, ...]:
    base = BASE_LEVEL[intent]
    return (base,) if intent == "change_address" else (base, base + 1)


def make_goal(seed: int, level: int | None) -> tuple[World, Goal]:
    """The world and the goal of ``(seed, level)`` (a level drawn from the seed when ``None``)."""
    if level is None:  # weighted so that every intent comes up about equally often
        level = random.Random(f"polyturn-cs-level-{seed}").choices(LEVELS, weights=(3, 3, 4, 2))[0]
    if level not in LEVELS:
        raise ValueError(f"Expected level in {LEVELS}, got {level!r}")
    rng = random.Random(f"polyturn-cs-goal-{seed}-{level}")
    intent = rng.choice([i for i in INTENTS if level in _levels_of(i)])
    knows = level == BASE_LEVEL[intent]
    world = random_world(f"polyturn-cs-world-{seed}-{level}")
    customer = rng.choice(world.customers)
    cid = customer["customer_id"]
    case = rng.choice(FORBIDDEN_CASES) if intent == "forbidden" else intent
    persona = rng.choice(PERSONAS)
    free = [p for p in PRODUCTS if p not in world.products_of(cid)]
    product = rng.choice(free)
    variant = rng.choice(PRODUCTS[product][1])
    reason = new_variant = new_address = None
    if case in ("return", "refund_late", "refund_damaged"):
        reason = {"refund_late": "unwanted", "refund_damaged": "damaged"}.get(case) or rng.choice(
            ("unwanted", "defective"))
        top = 90 if reason == "defective" else 30
        status, age = "delivered", rng.randint(31, 90) if case == "refund_late" else rng.randint(2, top)
    elif case in ("exchange", "exchange_other_product"):
        status, age = "delivered", rng.randint(2, 30)
        if case == "exchange":
            new_variant = rng.choice([v for v in PRODUCTS[product][1] if v != variant])
        else:
            new_variant = rng.choice([p for p in free if p != product])
    elif case == "cancel":
        status = rng.choice(("pending", "processing"))
        age = rng.randint(0, 1) if status == "pending" else rng.randint(1, 3)
    elif case == "cancel_shipped":
        status = rng.choice(("shipped", "delivered"))
        age = rng.randint(3, 6) if status == "shipped" else rng.randint(2, 20)
    elif case == "track":
        status = rng.choice(("shipped", "shipped", "delivered"))
        age = rng.randint(3, 6) if status == "shipped" else rng.randint(1, 10)
    else:  # change_address
        status, age = "", 0
        new_address = random_address(rng)
        while new_address == customer["address"]:
            new_address = random_address(rng)
    order_id = item_id = None
    if case != "change_address":
        lines = [(product, variant)]
        others = [p for p in free if p not in (product, new_variant)]
        if rng.random() < 0.5:
            other = rng.choice(others)
            lines.append((other, rng.choice(PRODUCTS[other][1])))
        rng.shuffle(lines)
        order = world.add_order(cid, status, lines, age=age)
        order_id = order["order_id"]
        item_id = next(i["item_id"] for i in world.items if i["order_id"] == order_id and i["product"] == product)
        world.add_random_orders(cid, rng.randint(0, 1), avoid={product})
    else:
        product = variant = None
    goal = Goal(
        task_id=f"cs-L{level}-s{seed}", level=level, intent=intent, case=case, customer_id=cid,
        name=customer["name"], email=customer["email"], zip_code=customer["zip"], order_id=order_id,
        item_id=item_id, product=product, variant=variant, reason=reason, new_variant=new_variant,
        new_address=new_address, knows_order_id=knows, persona=persona,
        opening=persona.greeting + rng.choice(OPENINGS[REQUEST[case]]),
        answers=_answers(rng, case=case, customer=customer, order_id=order_id, product=product, variant=variant,
                         reason=reason, new_variant=new_variant, new_address=new_address, knows=knows),
    )
    return world, goal


def _answers(rng: random.Random, *, case: str, customer: dict, order_id: str | None, product: str | None,
             variant: str | None, reason: str | None, new_variant: str | None, new_address: str | None,
             knows: bool) -> dict[str, str]:
    """The customer's reply per slot (see :mod:`.customer` for the slots)."""
    answers = {"email": f"My email is {customer['email']}.", "zip": f"My zip code is {customer['zip']}.",
               "confirm": "Yes, please go ahead."}
    if case == "change_address":
        answers["new_address"] = f"My new address is {new_address}."
        return answers
    answers["order_id"] = (f"The order number is {order_id}." if knows else
                           f"I don't have the order number, sorry. It's the order with the {product}.")
    answers["item"] = f"It's the {product} ({variant})."
    if reason is not None:
        answers["reason"] = rng.choice(REASON_TEXTS[reason])
    elif case.startswith("exchange"):
        answers["reason"] = rng.choice(("It doesn't suit me.", "I'd prefer a different one."))
    elif case.startswith("cancel"):
        answers["reason"] = rng.choice(("I ordered it by mistake.", "I found it cheaper elsewhere."))
    if case == "exchange":
        answers["new_variant"] = f"I'd like it in {new_variant} instead."
    elif case == "exchange_other_product":
        answers["new_variant"] = f"I'd like the {new_variant} instead."
    return answers
