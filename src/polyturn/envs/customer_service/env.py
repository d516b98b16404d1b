"""``polyturn/CustomerService-v0``: a customer-service agent over an order database, tau-bench style.

A simulated customer (:mod:`.customer`) opens with a request; its hidden goal
(:mod:`.goals`) is one of six intents. The agent talks to the customer with
``reply`` and works on the episode's SQLite database (:mod:`.database`) with
the tools below, under the written policy (:data:`.backend.POLICY`, shown in
``tool_docs()``). The backend refuses every call that breaks the policy and
counts it (``policy_violations``).

Success is judged on outcomes when the agent calls ``end_conversation``: the
database's final state equals the state the hidden goal requires (computed
by applying the goal's one write to a copy of the initial database), no call
broke the policy, the customer did not leave, and what had to be said was
said (a tracking goal: the tracking number and status; a forbidden request:
a polite refusal, said once the agent had what shows it is forbidden: every
detail the request needs and the goal's order read; a refusal guessed from the
opening alone does not count).

Tools: ``find_customer``, ``list_orders``, ``get_order``, ``track_shipment``,
``refund``, ``exchange``, ``cancel_order``, ``update_address``, ``reply``,
``end_conversation``, ``remember``. ``list_orders`` and ``update_address`` act on the verified
customer; an explicit ``customer_id`` is accepted and must be theirs.

Every step's ``info`` adds ``policy_violations`` (refused calls),
``error_responses`` (steps with an error: invalid or failed calls, repeats,
questions for what the customer already gave) and ``turns``; and, at the
states where a forbidden request must now be refused, ``forbidden``: what the
spec's refusal hook turns into the expert's refusal and the forbidden write
(refusal preference pairs, ``ppo.refusal_pairs``); at the states where an
allowed refund, exchange or cancellation is due, ``allowed``: what the spec's
contrast hook turns into the expert's next step and a refusal (contrast pairs,
``ppo.refusal_pairs.contrast``). Its cost terms
(``info["cost_terms"]``, beside the reward and not in it) count the same two
per step: ``cost/violation`` (calls the backend refused as against the policy,
the forbidden write attempted) and ``cost/error_response`` (1 when the step was
answered with an error).

Reward terms are the base ones (:mod:`polyturn.envs.rewards`) and this env's
own (:class:`CustomerServiceWeights`): three sub-goals, ``subgoal/verified``
(the right customer verified), ``subgoal/details`` (every detail the goal needs
was heard from the customer) and ``subgoal/order_checked`` (the goal's order
read); a policy refusal pays ``penalty/sandbox`` (the backend refused the call).
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import Field

from polyturn.envs.actions import ToolCall, format_action
from polyturn.envs.base import BadArgs, EpisodeStart, ToolEnv, ToolResult, check_levels
from polyturn.envs.customer_service.backend import POLICY, REASONS, Backend, NotFound, PolicyViolation
from polyturn.envs.customer_service.customer import Customer, clean_text, is_refusal
from polyturn.envs.customer_service.database import copy_db, snapshot, write_db
from polyturn.envs.customer_service.goals import LEVELS, Goal, make_goal
from polyturn.envs.rewards import RewardWeights, StepEvents

TOOL_HELP = {
    "reply": 'reply[{"text": "..."}]: say something to the customer; returns their answer.',
    "find_customer": 'find_customer[{"email": "...", "zip": "..."}]: verify the customer; returns their id.',
    "list_orders": "list_orders[{}]: the verified customer's orders and their items.",
    "get_order": 'get_order[{"order_id": "O12345"}]: status, delivery, items (ids, variants), payment.',
    "track_shipment": 'track_shipment[{"order_id": "O12345"}]: carrier, tracking number and status.',
    "refund": 'refund[{"order_id": "O12345", "item_id": "I12345", "reason": "defective"}]: refund one item; '
    f"reason is one of {', '.join(REASONS)}.",
    "exchange": 'exchange[{"order_id": "O12345", "item_id": "I12345", "new_variant": "blue"}]: '
    "exchange an item for another variant of the same product.",
    "cancel_order": 'cancel_order[{"order_id": "O12345"}]: cancel a pending or processing order.',
    "update_address": 'update_address[{"address": "..."}]: change the verified customer\'s account address.',
    "end_conversation": "end_conversation[{}]: end the conversation (ends the task).",
}
#: Features from what the agent has seen (never the hidden goal or the customer's patience), so a critic
#: without the privileged text learns nothing hidden from them.
CS_FEATURES = ("verified", "orders_read", "details_known", "confirmed", "refused", "action_done",
               "policy_violations", "n_reasks", "annoyances", "n_replies", "silence")
_ID = re.compile(r"[A-Z]\d{3,6}")


class CustomerServiceWeights(RewardWeights):
    """The base reward weights plus this env's sub-goals and the penalty for a call the backend refused."""

    # The sub-goals after the penalties: the order these terms were summed in when they were defined, so a
    # step's reward stays the same float (0.02 - 0.01 + 0.2 is 0.21000000000000002; 0.2 + 0.02 - 0.01 is 0.21).
    group_order = ("outcome", "process", "penalty", "subgoal")

    penalty_sandbox: float = Field(-0.3, le=0, description="A call the policy forbids (the backend refused it).")
    subgoal_verified: float = Field(0.2, ge=0, description="The goal's customer verified.")
    subgoal_details: float = Field(0.2, ge=0, description="Every detail the goal needs heard from the customer.")
    subgoal_order_checked: float = Field(0.1, ge=0, description="The goal's order read (get_order/track_shipment).")


def _needed_slots(goal: Goal) -> frozenset[str]:
    slots = {"email", "zip"}
    if goal.case == "change_address":
        return frozenset(slots | {"new_address"})
    slots.add("order_id")
    if goal.request == "refund":
        slots |= {"item", "reason"}
    if goal.request == "exchange":
        slots |= {"item", "new_variant"}
    return frozenset(slots)


class CustomerServiceEnv(ToolEnv):
    """Customer service over an order database (see the module docstring).

    Args:
        level: default level(s) goals are drawn from (1-4, see :mod:`.goals`): one level, or a list drawn
            from uniformly by the seed; ``None``: drawn from the seed, weighted so every intent is as common.
        max_turns: turns before truncation.
        reward_weights: a mapping of term names (or fields of :class:`CustomerServiceWeights`) to weights, or
            an instance.
        render_mode: ``None`` or ``"ansi"``.
    """

    weights_class = CustomerServiceWeights
    cost_names = ("cost/violation", "cost/error_response")

    def __init__(
        self,
        *,
        level: int | Sequence[int] | None = None,
        max_turns: int = 14,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns, reward_weights=reward_weights, render_mode=render_mode)
        self.levels = None if level is None else check_levels(level, LEVELS)
        tools: dict[str, Callable[[dict[str, Any]], ToolResult]] = {
            "reply": self._reply,
            "find_customer": self._find_customer,
            "list_orders": self._list_orders,
            "get_order": self._get_order,
            "track_shipment": self._track_shipment,
            "refund": self._refund,
            "exchange": self._exchange,
            "cancel_order": self._cancel_order,
            "update_address": self._update_address,
            "end_conversation": self._end_conversation,
            "remember": self._tool_remember,
        }
        self.tools = {name: self._guarded(name, fn) for name, fn in tools.items()}
        self.tool_help |= TOOL_HELP
        self.goal: Goal | None = None
        self.conn: sqlite3.Connection | None = None

    # ----- episode ----------------------------------------------------------------------------
    def _new_task(self, seed: int, options: Mapping[str, Any]) -> EpisodeStart:
        task_id = options.get("task_id")
        levels = self.levels if options.get("level") is None else check_levels(options["level"], LEVELS)
        level = None if levels is None else levels[random.Random(f"polyturn-cs-level-list-{seed}").randrange(len(levels))]
        if task_id is not None:
            match = re.fullmatch(r"cs-L(\d)-s(\d+)", str(task_id))
            if match is None:
                raise ValueError(f"Expected a task_id like 'cs-L3-s17', got {task_id!r}")
            level, seed = int(match.group(1)), int(match.group(2))
        world, self.goal = make_goal(seed, level)
        if self.conn is not None:
            self.conn.close()
        self.conn = write_db(world)
        gold = copy_db(self.conn)
        self.goal.apply(gold)
        self._gold = snapshot(gold)
        gold.close()
        self.backend = Backend(self.conn)
        tracking = None
        if self.goal.case == "track":
            number, delivered = self.conn.execute("SELECT tracking, delivered FROM shipments WHERE order_id = ?",
                                                  (self.goal.order_id,)).fetchone()
            tracking = (number, "delivered" if delivered else "in transit")
        self.customer = Customer(self.goal, tracking=tracking)
        self._calls: set[str] = set()
        self._flags = dict.fromkeys(CS_FEATURES, 0.0)
        self._violations = 0
        self._violations_costed = 0  # the violations already reported as cost/violation
        self._goal_order_read = False
        self._justified_refusal = False
        return EpisodeStart(task_id=self.goal.task_id, question=self.goal.opening, level=self.goal.level,
                            ambiguous=False, privileged=self.goal.privileged(), key_actions=self._key_actions())

    def _key_actions(self) -> tuple[str, ...]:
        goal = self.goal
        assert goal is not None
        keys = ["reply", "find_customer"]
        if goal.case != "change_address" and not goal.knows_order_id:
            keys.append("list_orders")
        keys.append({"change_address": "update_address", "track": "track_shipment"}.get(goal.case, "get_order"))
        write = {"return": "refund", "exchange": "exchange", "cancel": "cancel_order"}.get(goal.case)
        keys += [write] if write else []
        return (*keys, "end_conversation")

    def _task_features(self) -> dict[str, float]:
        if self.goal is None:
            return dict.fromkeys(CS_FEATURES, 0.0)
        c = self.customer
        needed = _needed_slots(self.goal)
        return self._flags | {
            "verified": float(self.backend.session.verified is not None),
            "details_known": len(needed & c.told) / len(needed),
            "confirmed": float(c.confirmed),
            "refused": float(c.refused),
            "policy_violations": float(self._violations),
            "n_reasks": float(c.n_reasks),
            "annoyances": float(c.n_annoyed),
            "silence": float(c.silence),
        }

    def _cost_terms(self, ev: StepEvents, error: str | None) -> dict[str, float]:
        """``cost/violation``: the step's refused calls (as ``policy_violations`` counts them, also when the
        customer left on it); ``cost/error_response``: 1 when the step was answered with an error (as
        ``error_responses`` counts them)."""
        new, self._violations_costed = self._violations - self._violations_costed, self._violations
        return {"cost/violation": float(new), "cost/error_response": float(error is not None)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The base step, with ``policy_violations``, ``error_responses`` and ``turns`` added to ``info``, and
        ``forbidden`` when the next state is one where the request must be refused (:meth:`forbidden_state`)."""
        obs, reward, terminated, truncated, info = super().step(action)
        info["policy_violations"] = self._violations
        info["error_responses"] = self._counts["n_errors"]
        info["turns"] = self.turn
        if not (terminated or truncated):
            for key, state in (("forbidden", self.forbidden_state()), ("allowed", self.allowed_state())):
                if state is not None:
                    info[key] = state
        return obs, reward, terminated, truncated, info

    def forbidden_state(self) -> dict[str, Any] | None:
        """What the spec's refusal hook (:func:`.expert.refusal_actions`) needs to write the expert's refusal and the
        step that carries the request on at this state, when the written policy forbids the customer's request and
        the agent has what shows it (every detail the request needs heard, the goal's order read) and has not
        refused yet: the request, the customer's details, the order as ``get_order`` shows it, its id, the product
        and variant, and ``confirmed`` (whether the customer has said yes). None otherwise (another goal, not yet
        informed, already refused)."""
        goal = self.goal
        if goal is None or not goal.forbidden or self._justified_refusal or not self._goal_order_read:
            return None
        if not _needed_slots(goal) <= self.customer.told:
            return None
        state = self.request_facts()
        return None if state is None else {**state, "confirmed": self.customer.confirmed}

    def request_facts(self) -> dict[str, str] | None:
        """The request's facts as the refusal and contrast hooks read them: the request, the customer's details, the
        goal's order as ``get_order`` shows it, its id, product and variant (None when the session has moved to
        another customer since the order was read)."""
        goal = self.goal
        assert goal is not None
        try:
            order = self.backend.get_order(str(goal.order_id))
        except (PolicyViolation, NotFound):
            return None
        answer = " ".join(goal.answers[s] for s in ("order_id", "item", "reason", "new_variant") if s in goal.answers)
        return {"request": goal.request, "answer": answer, "order": order, "order_id": str(goal.order_id),
                "product": str(goal.product), "variant": str(goal.variant)}

    def allowed_state(self) -> dict[str, Any] | None:
        """The counterpart of :meth:`forbidden_state` for a refund, exchange or cancellation the written policy
        allows: once the agent has what shows it is allowed, and until the write is made, what the spec's contrast
        hook (:func:`.expert.contrast_actions`) needs to write the expert's next step and a refusal there (the same
        keys, and ``confirmed``: whether the customer has said yes). None otherwise."""
        goal = self.goal
        if (goal is None or goal.forbidden or goal.request not in ("refund", "exchange", "cancel")
                or not self._goal_order_read or self.customer.left or self._justified_refusal):
            return None
        if not _needed_slots(goal) <= self.customer.told or snapshot(self.conn) == self._gold:
            return None
        state = self.request_facts()
        return None if state is None else {**state, "confirmed": self.customer.confirmed}

    def tool_docs(self) -> str:
        """The policy, then the action format, the tools and one real call."""
        names = self.enabled or tuple(self.tools)
        return "\n".join([
            "Customer service: help the customer with their request, within the policy below.",
            POLICY,
            "Reply with an optional line `Thought: <short reasoning>` and then exactly one line",
            "`Action: tool_name[{json args}]`. Tools:",
            *[f"- {self.tool_help[n]}" for n in names],
            "Example reply:",
            format_action("reply", {"text": "Could you tell me your email and zip code?"}, "Verify the customer first."),
            "Write one action per reply, in exactly that form, and nothing after it.",
        ])

    def close(self) -> None:
        """Close the episode's database."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        super().close()

    def judge(self) -> bool:
        """Whether the episode succeeds if it ends now (see the module docstring)."""
        goal, c = self.goal, self.customer
        assert goal is not None and self.conn is not None
        said = (not goal.forbidden or self._justified_refusal) and (goal.case != "track" or c.informed)
        return snapshot(self.conn) == self._gold and self._violations == 0 and said and not c.left

    # ----- tool plumbing ----------------------------------------------------------------------
    def _guarded(self, name: str, fn: Callable[[dict[str, Any]], ToolResult]) -> Callable[[dict[str, Any]], ToolResult]:
        """Run ``fn`` with the customer's patience in the loop: repeated calls and long silences annoy them."""

        def run(args: dict[str, Any]) -> ToolResult:
            try:
                result = fn(args)
            except PolicyViolation as exc:
                self._violations += 1
                result = ToolResult(f"{exc}.", error="policy", sandbox_violation=True)
            except NotFound as exc:
                result = ToolResult(f"{exc}.", error="not_found")
            if result.done:
                return result
            # A loop: the same call with the same result as before (a retry after fixing its cause is not).
            # A repeated reply annoys in Customer.hear instead.
            key = name + json.dumps(args, sort_keys=True, ensure_ascii=False) + "\n" + result.observation
            looped = key in self._calls and name not in ("reply", "remember")
            self._calls.add(key)
            note = ""
            if looped and self.customer.annoy():
                note = self.goal.persona.leave_line if self.goal else ""
            elif name not in ("reply", "remember"):
                note = self.customer.wait()
            if self.customer.left:
                return ToolResult(f"{result.observation}\nCustomer: {note}\n(The customer left the conversation.)",
                                  error=result.error, done=True, success=False)
            if note:
                return ToolResult(f"{result.observation}\nCustomer: {note}", error=result.error,
                                  sandbox_violation=result.sandbox_violation, credit=result.credit)
            return result

        return run

    def _repeat_key(self, call: ToolCall) -> str:
        """An account call repeats only in the same state: a call refused before verification (or before the
        customer's yes) and made again after it is a retry, not a repeat."""
        key = super()._repeat_key(call)
        if call.tool in ("reply", "remember", "end_conversation", "find_customer"):
            return key
        session = self.backend.session
        return f"{session.verified}|{session.confirmed}|{key}"

    @staticmethod
    def _text(args: Mapping[str, Any], key: str, *, max_len: int = 200) -> str:
        value = args.get(key)
        if not isinstance(value, str):
            raise BadArgs(f'Expected "{key}" as a string, got {type(value).__name__}')
        text = clean_text(value)
        if not text:
            raise BadArgs(f'Expected a non-empty "{key}", got {value[:40]!r}')
        if len(text) > max_len:
            raise BadArgs(f'Expected "{key}" of at most {max_len} characters, got {len(text)}')
        return text

    def _ident(self, args: Mapping[str, Any], key: str) -> str:
        value = self._text(args, key, max_len=40).upper().lstrip("#")
        if not _ID.fullmatch(value):
            raise NotFound(f"No {key.replace('_', ' ')} {value!r}. Ids look like C1234, O12345 and I12345")
        return value

    def _args(self, args: Mapping[str, Any], keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        if not set(keys) <= set(args) <= set(keys) | set(optional):
            want = ", ".join([f'"{k}"' for k in keys] + [f'optional "{k}"' for k in optional]) or "none"
            raise BadArgs(f"Expected keys {want}, got {sorted(args) or 'none'}")

    # ----- tools ------------------------------------------------------------------------------
    def _reply(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("text",))
        text = self._text(args, "text", max_len=1000)
        # Whether this reply refuses with the facts in hand (judged before hearing it: its own answers don't count).
        informed = self.goal is not None and self._goal_order_read and _needed_slots(self.goal) <= self.customer.told
        answer, reask = self.customer.hear(text)
        self._justified_refusal |= informed and is_refusal(text)
        self._flags["n_replies"] += 1
        if self.goal is not None and _needed_slots(self.goal) <= self.customer.told:
            self.achieve("details")
        if "reason" in self.customer.told and self.goal is not None:
            self.backend.session.stated_reason = self.goal.reason
        self.backend.session.confirmed = self.customer.confirmed
        if self.customer.left:
            return ToolResult(f"Customer: {answer}\n(The customer left the conversation.)",
                              error="reask" if reask else None, done=True, success=False)
        return ToolResult(f"Customer: {answer}", error="reask" if reask else None)

    def _find_customer(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("email", "zip"))
        out = self.backend.find_customer(self._text(args, "email"), self._text(args, "zip", max_len=20))
        if self.goal is not None and self.backend.session.verified == self.goal.customer_id:
            self.achieve("verified")
        return ToolResult(out)

    def _list_orders(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, (), optional=("customer_id",))
        customer_id = self._ident(args, "customer_id") if "customer_id" in args else None
        return ToolResult(self.backend.list_orders(customer_id))

    def _checked(self, order_id: str) -> None:
        self._flags["orders_read"] += 1
        if self.goal is not None and order_id == self.goal.order_id:
            self._goal_order_read = True
            self.achieve("order_checked")

    def _get_order(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("order_id",))
        order_id = self._ident(args, "order_id")
        out = self.backend.get_order(order_id)
        self._checked(order_id)
        return ToolResult(out)

    def _track_shipment(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("order_id",))
        order_id = self._ident(args, "order_id")
        out = self.backend.track(order_id)
        self._checked(order_id)
        return ToolResult(out)

    def _write(self, out: str) -> ToolResult:
        self._flags["action_done"] += 1
        return ToolResult(out)

    def _refund(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("order_id", "item_id", "reason"))
        reason = self._text(args, "reason", max_len=20).lower()
        if reason not in REASONS:
            raise BadArgs(f"Expected reason among {', '.join(REASONS)}, got {reason!r}")
        order_id, item_id = self._ident(args, "order_id"), self._ident(args, "item_id")
        return self._write(self.backend.refund(order_id, item_id, reason))

    def _exchange(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("order_id", "item_id", "new_variant"))
        order_id, item_id = self._ident(args, "order_id"), self._ident(args, "item_id")
        return self._write(self.backend.exchange(order_id, item_id, self._text(args, "new_variant", max_len=60)))

    def _cancel_order(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("order_id",))
        return self._write(self.backend.cancel(self._ident(args, "order_id")))

    def _update_address(self, args: dict[str, Any]) -> ToolResult:
        self._args(args, ("address",), optional=("customer_id",))
        customer_id = self._ident(args, "customer_id") if "customer_id" in args else None
        # The customer's sentence ends with a full stop that is not part of the address ("... 42 Oak Ave, Dover.").
        address = self._text(args, "address").rstrip(".!").rstrip()
        if not address:
            raise BadArgs('Expected a non-empty "address"')
        return self._write(self.backend.update_address(customer_id, address))

    def _end_conversation(self, args: dict[str, Any]) -> ToolResult:
        if args:
            raise BadArgs(f"Expected no args ({{}}), got {sorted(args)}")
        success = self.judge()
        verdict = "resolved" if success else "not resolved"
        return ToolResult(f"Conversation ended; the request was {verdict}.", done=True, success=success)

    # ----- exploration ------------------------------------------------------------------------
    explore_tools = ("reply", "remember")
    _EXPLORE_TEXTS = (
        "Could you tell me your email and zip code?",
        "What is the order number?",
        "Which item is it, and why would you like to return it?",
        "Which variant would you like instead?",
        "What is your new address?",
        "Shall I proceed?",
    )

    def example_args(self, tool: str, rng: Any) -> dict[str, Any]:
        """Valid arguments for exploration: a question to the customer, or a note."""
        if tool == "reply":
            return {"text": self._EXPLORE_TEXTS[int(rng.integers(len(self._EXPLORE_TEXTS)))]}
        return super().example_args(tool, rng)
