"""A served conversation's token context, and OpenAI messages / tools mapped to polyturn's.

:class:`ChatState` wraps the rollout's :class:`~polyturn.rollout.context.Conversation`
(same chat format, same context policy), so a served session's tokens are
exactly what a rollout of the same conversation would hold. It remembers the
message *items* it holds; a request whose messages extend them appends only
the new ones to the session's cache row, anything else starts the row over.

Items: ``("system", text)``, ``("task", text)`` (the first user message),
``("action", text)`` (an assistant message), ``("obs", text)`` (what follows an
assistant message: a tool result or the user's reply; consecutive ones merge).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from polyturn.envs.actions import ToolCall, format_action, parse_action
from polyturn.models.actor import Actor
from polyturn.rollout.context import Conversation, RolloutSettings

Item = tuple[str, str]


class RequestError(ValueError):
    """A request that cannot be served as sent; the message says what to change (HTTP 400)."""


def check_unicode(text: str, *, where: str) -> None:
    """:class:`RequestError` unless ``text`` is valid Unicode.

    JSON lets a client send a lone surrogate (``"\\ud800"``), which UTF-8 and so the tokenizer cannot encode.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{where}: Expected valid Unicode text, got a lone surrogate at character {e.start}") \
            from None


def message_items(messages: list[dict[str, Any]]) -> list[Item]:
    """OpenAI chat messages (already validated by pydantic) as items; :class:`RequestError` when they cannot be."""
    items: list[Item] = []
    for k, m in enumerate(messages):
        role, content = m["role"], m.get("content")
        text = content if isinstance(content, str) else "".join(
            p.get("text", "") for p in (content or []) if isinstance(p, dict)
        )
        if role in ("system", "developer"):
            if items:
                raise RequestError(f"messages[{k}]: Expected a system message only first, got one after other messages")
            check_unicode(text, where=f"messages[{k}].content")
            items.append(("system", text))
        elif role == "assistant":
            if not any(kind == "task" for kind, _ in items):
                raise RequestError(f"messages[{k}]: Expected a user message before the first assistant message")
            action = assistant_text(text, m.get("tool_calls"), index=k)
            check_unicode(action, where=f"messages[{k}]")
            items.append(("action", action))
        elif role in ("user", "tool"):
            check_unicode(text, where=f"messages[{k}].content")
            if not text.strip():
                raise RequestError(f"messages[{k}]: Expected non-empty content for a {role} message")
            if not any(kind == "task" for kind, _ in items):
                if role == "tool":
                    raise RequestError(f"messages[{k}]: Expected a user message before any tool message")
                items.append(("task", text))
            elif items[-1][0] in ("task", "obs"):
                items[-1] = (items[-1][0], items[-1][1] + "\n" + text)
            else:
                items.append(("obs", text))
        else:  # pydantic restricts roles; kept for direct callers
            raise RequestError(f"messages[{k}]: Expected role system, user, assistant or tool, got {role!r}")
    if not items or items[-1][0] not in ("task", "obs"):
        raise RequestError("Expected the last message to be from the user or a tool (the agent answers it), "
                           "got " + ("no messages" if not items else "an assistant or system message last"))
    return items


def with_user_message(items: list[Item], message: str) -> list[Item]:
    """A chat session's items with the user's next ``message``: the task when there is none yet, an observation
    after the agent's action, else joined to the message the agent has not answered (its last turn failed)."""
    items = list(items)
    if not items:
        return [("task", message)]
    if items[-1][0] == "action":
        return items + [("obs", message)]
    items[-1] = (items[-1][0], items[-1][1] + "\n" + message)
    return items


def assistant_text(content: str, tool_calls: list[dict] | None, *, index: int) -> str:
    """An assistant message as ReAct text: its content as the thought, then its (single) tool call."""
    if not tool_calls:
        return content
    if len(tool_calls) != 1:
        raise RequestError(f"messages[{index}]: Expected at most one tool call per assistant message "
                           f"(polyturn agents act once a turn), got {len(tool_calls)}")
    fn = tool_calls[0]["function"]
    where = f"messages[{index}].tool_calls[0].function"
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError as e:
        raise RequestError(f"{where}.arguments: Expected a JSON object, got invalid JSON ({e.msg})") from None
    except RecursionError:
        raise RequestError(f"{where}.arguments: Expected a JSON object, got JSON nested too deeply") from None
    if not isinstance(args, dict):
        raise RequestError(f"{where}.arguments: Expected a JSON object, got {type(args).__name__}")
    try:
        return format_action(fn["name"], args, thought=content.strip() or None)
    except ValueError as e:  # a tool name polyturn's actions cannot hold
        raise RequestError(f"{where}.name: {e}") from None


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """Tool docs for a system prompt from OpenAI ``tools`` (the format of ``ToolEnv.tool_docs``)."""
    lines = ["Reply with an optional line `Thought: <short reasoning>` and then exactly one line",
             "`Action: tool_name[{json args}]`. Tools:"]
    for t in tools:
        fn = t["function"]
        props = ", ".join(f'"{k}": ...' for k in (fn.get("parameters") or {}).get("properties", {}))
        lines.append(f"- {fn['name']}[{{{props}}}]: {fn.get('description') or ''}".rstrip())
    prompt = "\n".join(lines)
    check_unicode(prompt, where="tools")
    return prompt


@dataclass
class Reply:
    """An action as an OpenAI assistant message: ``content`` and/or one ``tool_call``."""

    content: str | None
    tool_call: dict[str, Any] | None
    finish_reason: str


def action_reply(text: str, *, tool_names: set[str] | None, hit_cap: bool) -> Reply:
    """Map the agent's ReAct text to an assistant message; a call of a requested tool becomes ``tool_calls``."""
    parsed = parse_action(text)
    if tool_names and isinstance(parsed, ToolCall) and parsed.tool in tool_names:
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": parsed.tool, "arguments": json.dumps(parsed.args, ensure_ascii=False)}}
        return Reply(content=parsed.thought, tool_call=call, finish_reason="tool_calls")
    return Reply(content=text, tool_call=None, finish_reason="length" if hit_cap else "stop")


class ChatState:
    """The token context of one served conversation (see the module docstring)."""

    def __init__(self, actor: Actor, settings: RolloutSettings) -> None:
        self.actor = actor
        self.settings = settings
        self.conv: Conversation | None = None
        self.items: list[Item] = []
        self.sent = 0  # tokens of conv.seg already on the engine row
        self.restart = True
        self.hit_cap = False
        self.turn = 0

    def sync(self, items: list[Item]) -> bool:
        """Make the context hold ``items``: append what extends the current items, else start over.

        Returns whether it started over. A conversation whose task does not fit the context budget is a
        :class:`RequestError` that leaves the state as it was.
        """
        if self.conv is not None and items == self.items:  # a retry of a turn that failed: the same conversation
            self.invalidate()  # the row may hold what the failed turn left: send the context again
            return False
        n = len(self.items)
        if self.conv is None or len(items) <= n or items[:n] != self.items:
            self._start(items)
            return True
        for item in items[n:]:
            self._add(item)
        return False

    def add_observation(self, text: str) -> None:
        """Append an observation (a tool result or the user's reply) after the last action."""
        self.sync(self.items + [("obs", text)])

    def _start(self, items: list[Item]) -> None:
        system = items[0][1] if items and items[0][0] == "system" else None
        body = items[1:] if system is not None else items
        if not body or body[0][0] != "task":
            raise RequestError("Expected a user message to start the conversation")
        conv = Conversation(self.actor, self.settings, task=body[0][1], system=system)
        if conv.needs_rebuild():  # the task alone leaves no room for an action; the context policy always keeps it
            limit = self.settings.context_budget - self.settings.max_action_tokens
            raise RequestError(f"Expected the first user message (with the system prompt and chat formatting) to "
                               f"fit the model's context: at most {limit} tokens, got {len(conv.seg.ids)}; "
                               "shorten it")
        self.conv = conv
        self.items = list(items[: len(items) - len(body) + 1])
        self.sent = 0
        self.restart = True
        self.hit_cap = False
        for item in body[1:]:
            self._add(item)

    def _add(self, item: Item) -> None:
        assert self.conv is not None
        kind, text = item
        if kind == "action":
            ids = self.actor.encode(text)[: self.settings.max_action_tokens - 1] + [self.actor.stop_id]
            self.conv.add_action(ids, [0.0] * len(ids), turn=-1, text=text)
            self.hit_cap = False
        elif kind == "obs":
            if self.items[-1][0] != "action":
                raise RequestError("Expected an assistant message between two user/tool turns of a session")
            self.conv.add_observation(text, close_action=self.hit_cap)
        else:
            raise RequestError(f"Expected a {kind} message only at the start of a conversation")
        self.items.append(item)

    def context(self) -> tuple[list[int], bool]:
        """Tokens to append to the row before the next action, and whether the row starts over.

        The rollout's context policy applies: a context that could overflow
        ``context_budget`` is rebuilt (a new segment) and the row starts over.
        """
        assert self.conv is not None
        if self.conv.needs_rebuild():
            try:
                self.conv.rebuild()
            except ValueError:  # the task grew with the agent's `remember` notes past what the context holds
                raise RequestError(f"Expected the task and the agent's remembered notes to fit the model's context "
                                   f"({self.settings.context_budget} tokens), got more; start a new conversation") \
                    from None
            self.sent = 0
            self.restart = True
        ids = self.conv.seg.ids[self.sent:]
        restart = self.restart
        self.sent = len(self.conv.seg.ids)
        self.restart = False
        return list(ids), restart

    def add_sampled(
        self, ids: list[int], logprobs: list[float], *, text: str, hit_cap: bool, item_text: str | None = None
    ) -> None:
        """Record the agent's sampled action (the ids are already on the row).

        ``item_text`` is the action as the client will send it back (a tool
        call re-rendered from ``tool_calls``), so the next request matches.
        """
        assert self.conv is not None
        self.conv.add_action(list(ids), list(logprobs), turn=self.turn, text=text)
        self.sent = len(self.conv.seg.ids)
        self.items.append(("action", item_text if item_text is not None else text))
        self.hit_cap = hit_cap
        self.turn += 1

    def invalidate(self) -> None:
        """The row lost its state (e.g. a failed turn): the next turn re-sends the whole context."""
        self.sent = 0
        self.restart = True
