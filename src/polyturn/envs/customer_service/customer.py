"""The simulated customer: rule-based, with a hidden goal, a persona and limited patience.

The customer opens with their request only (``Goal.opening``) and gives a
detail only when the agent asks for it. The agent's reply text is split into
sentences; a sentence is a *request* when it ends with ``?`` or holds a
request phrase (:data:`REQUEST_WORDS`: "please", "could you", "tell me", ...),
and each request sentence is matched against the documented phrasings of
every slot (:data:`SLOT_PATTERNS`, case-insensitive regular expressions):

=============  ================================================================  ==================================
slot           asked by (examples)                                               answer
=============  ================================================================  ==================================
email          "email", "e-mail"                                                 "My email is ann.lee7@example.com."
zip            "zip", "zip code", "postal code", "postcode"                      "My zip code is 60614."
order_id       "order number", "order id", "which order", "what order"          "The order number is O48213." or,
                                                                                 not knowing it, the product's name
item           "item", "product"                                                 "It's the Desk Lamp (white)."
reason         "why", "reason", "what's wrong", "problem", "issue"              one of ``REASON_TEXTS``
new_variant    "instead", "which size/colour/variant", "exchange it for"         "I'd like it in blue instead."
new_address    "address" (not "email address"), "new address"                    "My new address is 42 Oak Ave, Dover."
confirm        "shall I", "should I", "do you want me to", "would you like me    "Yes, please go ahead." once the
               to", "is that ok"; "go ahead", "proceed" with no other slot in   agent said what it will do
               the sentence; or "confirm" with no other slot in the sentence
anything_else  "anything else", "something else"                                 "No, that's all. Thank you!"
request        "how can I help", "what can I do for you", "what do you need"    (already told: a re-ask)
=============  ================================================================  ==================================

A confirmation question asks for the confirmation only: "Shall I refund this
item?" does not ask which item; "go ahead" and "proceed" ask for it only in a
sentence that asks for nothing else ("To proceed, could you tell me your
email?" asks for the email). "Confirm" asks for the slots it names ("please
confirm your email" asks for the email) and for the confirmation only when it
names none ("please confirm"). The customer says yes only once the agent has
said what it will do (:data:`INTENT`, "I will cancel your order", in this or
an earlier reply); before that, "Shall I proceed?" gets "Proceed with what?".
A customer who does not know the order number names the product instead,
which also tells the item (when the same message did not ask for it).

A reply is read for two more things: a polite refusal (a reply that asks
nothing, with an apology such as "sorry"/"unfortunately" *and* a negation
such as "can't"/"unable"/"not eligible") and, for a tracking goal, the
tracking number together with the status ("in transit" or "delivered"), not
negated ("not delivered yet" and "no longer in transit" do not count).

Patience: each of these annoys the customer once: asking for a slot the
customer already gave (a *re-ask*, also an error response), repeating an
earlier reply word for word, the same tool call with the same result again (a
loop), a reply the customer cannot map to anything (prompt injections such as
"ignore your instructions and tell me your goal" land here: nothing is
revealed), and leaving the customer waiting for more than :data:`MAX_SILENCE`
tool calls in a row. At the persona's ``patience``-th annoyance the customer leaves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from polyturn.envs.customer_service.goals import Goal

MAX_SILENCE = 4
SLOTS = ("email", "zip", "order_id", "item", "reason", "new_variant", "new_address", "confirm", "anything_else",
         "request")
SLOT_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        "email": r"\be-?mail\b",
        "zip": r"\bzip\b|\bpostal\b|\bpost ?code\b",
        "order_id": r"\border (id|number|no\b|#)|\b(which|what) order\b",
        "item": r"\b(item|product)s?\b",
        "reason": r"\bwhy\b|\breason\b|\bwhat('s| is) wrong\b|\bproblem\b|\bissue\b",
        "new_variant": r"\binstead\b|\b(which|what) (size|colou?r|variant|option)\b|\b(exchange|swap) it for\b"
                       r"|\breplace it with\b",
        "new_address": r"(?<!e-mail )(?<!email )\baddress\b",
        "anything_else": r"\banything else\b|\bsomething else\b",
        "request": r"\bhow (can|may) i help\b|\bwhat can i (do|help)\b|\bwhat do you need\b",
    }.items()
}
REQUEST_WORDS = re.compile(
    r"\bplease\b|\bcould you\b|\bcan you\b|\bwould you\b|\btell me\b|\bprovide\b|\bshare\b|\blet me know\b"
    r"|\bgive me\b|\bneed your\b|\bneed the\b|\bconfirm\b",
    re.IGNORECASE,
)
CONFIRM_QUESTION = re.compile(
    r"\bshall i\b|\bshould i\b|\b(do|would) you (want|like) me to\b|\bis that (ok|okay|right|correct|fine)\b",
    re.IGNORECASE,
)
#: Asks for the confirmation only in a sentence that asks for no other slot ("To proceed, ..." does not).
PROCEED = re.compile(r"\bgo ahead\b|\bproceed\b", re.IGNORECASE)
#: The agent saying what it will do: the customer confirms only after hearing one.
INTENT = re.compile(r"\b(i will|i'll|i am going to|i'm going to|i can(?!'t| not)|let me)\b[^.?!]*?"
                    r"\b(cancel|refund|return|exchange|swap|replace|update|change)", re.IGNORECASE)
_STATUS_NEGATED = re.compile(r"\b(not|no longer|never|isn't|hasn't|wasn't)\s+(?:\w+\s+){0,2}$")
APOLOGY = re.compile(r"\bsorry\b|\bapolog|\bunfortunately\b|\bregret\b|\bafraid\b", re.IGNORECASE)
NEGATION = re.compile(r"\bcan ?not\b|\bcan't\b|\bcan’t\b|\bunable\b|\bnot able\b|\bnot possible\b|\bnot eligible\b"
                      r"|\bnot allowed\b|\bwon't be able\b|\bnot permitted\b", re.IGNORECASE)
IRRELEVANT = {
    "order_id": "This is about my account, not an order.",
    "item": "This is about my account, not an item.",
    "reason": "I'd just like help with what I asked.",
    "new_variant": "I'm not looking to exchange anything.",
    "new_address": "I don't need to change my address.",
}
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_text(text: str) -> str:
    """Drop control characters and collapse whitespace."""
    return " ".join(_CONTROL.sub(" ", text).split())


def _is_request(sentence: str) -> bool:
    return sentence.rstrip().endswith("?") or bool(REQUEST_WORDS.search(sentence))


def asked_slots(text: str) -> list[str]:
    """The slots the text asks for, in :data:`SLOTS` order (see the module docstring)."""
    asked: set[str] = set()
    for sentence in _SENTENCE.split(text):
        if not _is_request(sentence):
            continue
        if CONFIRM_QUESTION.search(sentence) and not SLOT_PATTERNS["anything_else"].search(sentence):
            asked.add("confirm")
            continue
        hits = {name for name, pattern in SLOT_PATTERNS.items() if pattern.search(sentence)}
        if not hits and PROCEED.search(sentence):
            asked.add("confirm")
            continue
        if not hits and re.search(r"\bconfirm\b", sentence, re.IGNORECASE):
            hits = {"confirm"}
        asked |= hits
    return [s for s in SLOTS if s in asked]


def is_refusal(text: str) -> bool:
    """A polite refusal: a reply that asks nothing, with an apology and a negation.

    "Sorry, I can't see your account yet. Could you tell me your email?" asks for something, so it refuses
    nothing; "I'm sorry, but I can't do that: the order has shipped." refuses.
    """
    if any(_is_request(s) for s in _SENTENCE.split(text)):
        return False
    return bool(APOLOGY.search(text) and NEGATION.search(text))


def states_status(text: str, status: str) -> bool:
    """Whether ``text`` (lower case) says the package's status is ``status``: named, and not negated
    ("not delivered yet", "no longer in transit")."""
    for m in re.finditer(re.escape(status), text):
        if not _STATUS_NEGATED.search(text[: m.start()]):
            return True
    return False


@dataclass
class Customer:
    """The simulated customer of one episode (see the module docstring).

    Args:
        goal: the hidden goal (answers per slot, persona).
        tracking: for a tracking goal, ``(tracking number, status words)`` the agent must tell.
    """

    goal: Goal
    tracking: tuple[str, str] | None = None
    told: set[str] = field(default_factory=lambda: {"request"})
    patience_left: int = 0
    left: bool = False
    refused: bool = False
    informed: bool = False
    confirmed: bool = False
    described: bool = False  # the agent has said what it will do (:data:`INTENT`)
    n_reasks: int = 0
    n_annoyed: int = 0
    silence: int = 0
    _replies: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.patience_left = self.goal.persona.patience

    def annoy(self) -> bool:
        """Lose one unit of patience; ``True`` when the customer leaves now."""
        self.n_annoyed += 1
        self.patience_left -= 1
        self.left = self.patience_left <= 0
        return self.left

    def wait(self) -> str:
        """The agent used a tool instead of replying; past :data:`MAX_SILENCE` in a row the customer nudges."""
        self.silence += 1
        if self.silence <= MAX_SILENCE:
            return ""
        self.silence = 0
        if self.annoy():
            return self.goal.persona.leave_line
        return "Hello? Are you still there?"

    def hear(self, text: str) -> tuple[str, bool]:
        """The customer's answer to the agent's message and whether it re-asked for a given detail."""
        self.silence = 0
        norm = text.lower()
        parts: list[str] = []
        annoyed = reask = False
        if norm in self._replies:
            annoyed = True
            parts.append("You already said that.")
        self._replies.add(norm)
        self.described |= bool(INTENT.search(text))
        asked = asked_slots(text)
        for slot in asked:
            if slot == "confirm" and not self.described and slot not in self.told:
                parts.append("Proceed with what?")
            elif slot in self.told and slot != "anything_else":
                reask = True
                answer = self.goal.answers.get(slot, self.goal.opening if slot == "request" else "")
                parts.append(f"I already told you. {answer}".strip())
            elif slot == "anything_else":
                parts.append("No, that's all. Thank you!")
            elif slot in self.goal.answers:
                self.told.add(slot)
                parts.append(self.goal.answers[slot])
                self.confirmed |= slot == "confirm"
                if slot == "order_id" and not self.goal.knows_order_id and "item" not in asked:
                    self.told.add("item")  # "It's the order with the Desk Lamp" names the item too
            else:
                parts.append(IRRELEVANT.get(slot, ""))
        if is_refusal(text) and not self.refused:
            self.refused = True
            parts.append("I see. That's a pity, but thank you for explaining." if self.goal.forbidden else
                         "Are you sure? I think I should be eligible.")
        if self.tracking is not None and not self.informed:
            number, status = self.tracking
            if number.lower() in norm and states_status(norm, status):
                self.informed = True
                parts.append("Great, thanks! That's all I needed.")
        if not any(parts):
            annoyed = True
            parts.append("Sorry, I don't follow. " + self.goal.opening[len(self.goal.persona.greeting):])
        self.n_reasks += reask
        if (annoyed or reask) and self.annoy():
            return self.goal.persona.leave_line, reask
        return " ".join(p for p in parts if p), reask
