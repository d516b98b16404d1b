"""``POST /v1/chat/completions`` and ``GET /v1/models``, OpenAI-compatible.

Messages in, the agent's next turn out. ``tools`` are the agent's tools: a
ReAct action calling one of them comes back as ``tool_calls`` (finish reason
``tool_calls``), and assistant ``tool_calls`` / ``tool`` messages sent back
are rendered as the ReAct action and its observation. ``stream: true`` sends
Server-Sent Events, one chunk per sampled token (with ``tools`` the answer
comes as one chunk, since a tool call is known only at the end of the action);
``stream_options: {"include_usage": true}`` adds OpenAI's final usage chunk.

``seed`` is honoured by ``--engine vllm`` (vLLM's per-request seed: the same messages, temperature and seed give
the same answer); the home engine samples a batch from one generator and ignores it.

Extension: ``session_id`` (a chat session from ``POST /v1/sessions``) keeps the
conversation's cache row across requests: only the new messages are
prefilled. Without it a request leases a row for its own turn only. A
hierarchical version answers only in a session (its manager's subgoals live
there: :mod:`polyturn.serve.hierarchy`); its responses carry the ``subgoal``
in force, and a stream sends the answer as one chunk (a ``subgoal_done[]``
the worker writes is never sent).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from polyturn.serve import hierarchy
from polyturn.serve.conversation import RequestError, action_reply, assistant_text, message_items, \
    tools_system_prompt
from polyturn.serve.service import Service, Version

log = logging.getLogger(__name__)
router = APIRouter()
COMPLETIONS = "/v1/chat/completions"


class FunctionCall(BaseModel):
    """A tool call's function (arguments as a JSON string, as OpenAI sends them)."""

    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field("{}", max_length=16000)


class ToolCallIn(BaseModel):
    """An assistant message's tool call."""

    id: str | None = Field(None, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """A text part of a message's content (images are not supported)."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of the conversation."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = Field(None, max_length=128)
    name: str | None = Field(None, max_length=64)


class FunctionDef(BaseModel):
    """A tool's definition."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, max_length=4000)
    parameters: dict[str, Any] | None = None

    @field_validator("parameters")
    @classmethod
    def _properties_object(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and "properties" in parameters and not isinstance(parameters["properties"], dict):
            raise ValueError("Expected parameters.properties to be a JSON object (a JSON schema's properties), "
                             f"got {type(parameters['properties']).__name__}")
        return parameters


class ToolDef(BaseModel):
    """A tool the agent may call."""

    type: Literal["function"]
    function: FunctionDef


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` sends a last chunk with the usage (and ``usage: null`` in the others)."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The OpenAI request body (unsupported fields are ignored; ``n`` must be 1)."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(max_length=200)
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=100_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=100_000)
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = Field(None, max_length=64)
    user: str | None = Field(None, max_length=256)
    session_id: str | None = Field(None, max_length=128)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)  # vLLM's per-request seed (--engine vllm); home ignores it
    logprobs: bool = False  # each sampled token's log-prob (of the agent's raw action text), non-streamed
    top_logprobs: int | None = Field(None, ge=0, le=20)  # with logprobs: that many likeliest tokens per position


def _check_logprobs(body: ChatCompletionRequest, version: Any) -> int:
    """How many top log-probs a request asks for (0 for none); a request this server cannot answer is refused."""
    if body.top_logprobs and not body.logprobs:
        raise RequestError("Expected logprobs: true with top_logprobs, got logprobs false")
    if not body.logprobs:
        return 0
    if body.stream:
        raise RequestError("Expected stream: false with logprobs: true (log-probs come with whole replies only)")
    if version.manager is not None:
        raise RequestError("Expected a flat version for logprobs: true, got a hierarchical one")
    if body.top_logprobs and not version.engine.reports_top_logprobs:
        raise RequestError("Expected the batched home engine for top_logprobs, got --engine vllm or --unbatched")
    return body.top_logprobs or 0


def _logprobs(version: Any, res: Any) -> dict[str, Any]:
    """OpenAI's ``choices[0].logprobs``: each sampled token (of the agent's raw action text, the stop token
    included) with its log-prob and, when asked for, its most likely alternatives."""
    tok = version.actor.tokenizer

    def entry(i: int, lp: float) -> dict[str, Any]:
        text = tok.decode([i])
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    tops = res.top_logprobs or [[] for _ in res.ids]
    return {"content": [{**entry(i, lp), "top_logprobs": [entry(j, q) for j, q in top]}
                        for i, lp, top in zip(res.ids, res.logprobs, tops)], "refusal": None}


def check_lengths(service: Service, messages: list[ChatMessage]) -> None:
    """Message count and length caps (``--max-message-chars``)."""
    cfg = service.config
    if len(messages) > cfg.max_messages:
        raise RequestError(f"Expected at most {cfg.max_messages} messages, got {len(messages)}")
    for k, m in enumerate(messages):
        c = m.content
        n = len(c) if isinstance(c, str) else sum(len(p.text) for p in c or [])
        if n > cfg.max_message_chars:
            raise RequestError(f"messages[{k}].content: Expected at most {cfg.max_message_chars} characters, got {n}")


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    """The loaded versions (and ``auto``, routed by the A/B shares)."""
    service: Service = request.app.state.service
    assert service.router is not None
    data = [{"id": "auto", "object": "model", "created": 0, "owned_by": "polyturn"}]
    data += [{"id": v.name, "object": "model", "created": v.created, "owned_by": "polyturn",
              "share": service.router.shares.get(v.name, 0.0)} for v in service.versions.values()]
    return {"object": "list", "data": data}


@router.post(COMPLETIONS, response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
    """The agent's next turn for ``messages``.

    With ``session_id``, messages that do not extend the session's conversation (a new conversation, a retry,
    an edited message) start it over: its turns so far are recorded as their own episode first.
    """
    service: Service = request.app.state.service
    check_lengths(service, body.messages)
    items = message_items([m.model_dump() for m in body.messages])
    tool_names = {t.function.name for t in body.tools} if body.tools else None
    ephemeral = body.session_id is None
    if ephemeral and any(v.manager is not None for v in service.versions.values()
                         if body.model in (v.name, "", "auto", "polyturn")):
        raise RequestError("Expected a session_id for a hierarchical version (its manager's subgoals are kept in "
                           "the session), got none: open one with POST /v1/sessions {\"model\": ...} and pass its id "
                           "(the openai client: extra_body={\"session_id\": id})")
    if ephemeral:
        s = await service.open_session(env_id=None, model=body.model, temperature=0.0)
    else:
        s = service.store.get(body.session_id)
        if s.kind != "chat":
            raise RequestError("Expected a chat session for /v1/chat/completions, got an environment session; "
                               "use POST /v1/sessions/{id}/turns")
        if body.model not in ("auto", "polyturn", s.arm):
            raise RequestError(f"Expected model {s.arm!r} (this session's version) or 'auto', got {body.model!r}")
    request.state.arm = s.arm
    v = service.versions[s.arm]
    if body.tools and v.settings.system_prompt and items[0][0] != "system":
        items = [("system", tools_system_prompt([t.model_dump() for t in body.tools]))] + items
    max_tokens = body.max_completion_tokens or body.max_tokens
    top_k = _check_logprobs(body, v)
    cid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())

    async def run(on_token=None) -> dict:
        try:
            async with s.lock:
                s.touch()
                if s.hier is not None:  # the worker's context is kept apart from the client's messages
                    res, text = await hierarchy.worker_answer(service, s, items, endpoint="chat_completions",
                                                              max_tokens=max_tokens, temperature=body.temperature,
                                                              top_p=body.top_p)
                    reply = action_reply(text, tool_names=tool_names, hit_cap=res.hit_cap)
                    s.hier.shown(text, assistant_text(reply.content or "", [reply.tool_call], index=0)
                                 if reply.tool_call else text)
                    s.touch()
                    return {"reply": reply, "usage": _usage(s, res), "forced": res.forced,
                            "subgoal": s.hier.subgoal()}
                restarted = s.state.sync(items)
                if restarted and not ephemeral and s.turns:
                    service.start_over(s, reason="restart")
                observation = items[-1][1]
                t0 = time.perf_counter()
                res, text = await service.agent_turn(s, endpoint="chat_completions", max_tokens=max_tokens,
                                                     temperature=body.temperature, top_p=body.top_p,
                                                     on_token=on_token, seed=body.seed, top_logprobs=top_k)
                reply = action_reply(text, tool_names=tool_names, hit_cap=res.hit_cap)
                item_text = assistant_text(reply.content or "", [reply.tool_call], index=0) if reply.tool_call \
                    else text
                s.state.add_sampled(res.ids, res.logprobs, text=text, hit_cap=res.hit_cap, item_text=item_text)
                if not ephemeral:
                    s.turns.append(service.turn_record(s, res, text, observation=observation,
                                                       latency_s=time.perf_counter() - t0))
                    s.touch()
        finally:
            if ephemeral:
                service.versions[s.arm].engine.release(s.slot)
                service.store.pop(s.id)
                service.metrics.sessions.labels(s.arm).dec()
        return {"reply": reply, "usage": _usage(s, res), "forced": res.forced,
                "logprobs": _logprobs(v, res) if body.logprobs else None}

    if not body.stream:
        out = await run()
        reply = out["reply"]
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_call:
            message["tool_calls"] = [reply.tool_call]
        return JSONResponse({
            "id": cid, "object": "chat.completion", "created": created, "model": s.arm,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                         "logprobs": out.get("logprobs")}],
            "usage": out["usage"], "session_id": None if ephemeral else s.id,
            **({"subgoal": out["subgoal"]} if s.hier is not None else {}),
        })
    request.state.streamed = True  # the router counts it when the stream ends (_stream), not at the 200
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return StreamingResponse(_stream(run, service, v, cid=cid, created=created,
                                     whole=bool(tool_names) or s.hier is not None, include_usage=include_usage),
                             media_type="text/event-stream")


def _usage(s, res) -> dict[str, int]:
    """OpenAI's usage of a turn: the context before the action (the session's row), the action."""
    usage = {"prompt_tokens": len(s.state.conv.seg.ids) - len(res.ids) if s.state.conv else 0,
             "completion_tokens": len(res.ids)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


async def _stream(run, service: Service, version: Version, *, cid: str, created: int, whole: bool,
                  include_usage: bool):
    """SSE chunks: the role, then text deltas as tokens arrive (with ``whole``: the answer as one chunk at the
    end, e.g. a tool call, known only then), then the finish reason and ``[DONE]``.

    The status line is sent before the turn runs, so a failed turn comes as an error event: a request error
    with its message, any other as a generic server error (logged, counted as a 500 and fed to the router's
    error rate). With ``include_usage`` a last chunk (no choices) carries the usage, as OpenAI sends it.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[int] = asyncio.Queue()
    stop_id = version.actor.stop_id
    model = version.name

    def event(data: dict) -> str:
        return "data: " + json.dumps(data, ensure_ascii=False) + "\n\n"

    def chunk(delta: dict, finish: str | None = None) -> str:
        data = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        if include_usage:
            data["usage"] = None
        return event(data)

    task = asyncio.create_task(run(on_token=None if whole else
                                   (lambda tok: loop.call_soon_threadsafe(queue.put_nowait, tok))))
    yield chunk({"role": "assistant", "content": ""})
    ids: list[int] = []
    sent = ""
    while not (task.done() and queue.empty()):
        try:
            tok = await asyncio.wait_for(queue.get(), timeout=0.05)
        except TimeoutError:
            continue
        if tok == stop_id:
            continue
        ids.append(tok)
        text = version.actor.tokenizer.decode(ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            continue
        yield chunk({"content": text[len(sent):]})
        sent = text
    try:
        out = task.result()
    except RequestError as e:  # e.g. a task too long for the context: the client's to fix, as a 400 would be
        service.count_outcome(model, COMPLETIONS, 400)
        yield event({"error": {"message": str(e), "type": "invalid_request_error", "param": None, "code": None}})
        return
    except Exception:
        log.exception("streamed completion on %s failed", model)
        service.count_outcome(model, COMPLETIONS, 500)
        yield event({"error": {"message": "Internal server error", "type": "server_error", "param": None,
                               "code": None}})
        return
    service.count_outcome(model, COMPLETIONS, 200)
    reply = out["reply"]
    if whole:
        delta: dict[str, Any] = {"content": reply.content}
        if reply.tool_call:
            delta["tool_calls"] = [{"index": 0, **reply.tool_call}]
        yield chunk(delta)
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [], "usage": out["usage"]})
    yield "data: [DONE]\n\n"
