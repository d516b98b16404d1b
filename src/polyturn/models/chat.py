"""How a conversation becomes the actor's token ids.

A context is built **append-only**: the ids of turn t are a prefix of the ids
of turn t+1, so a whole episode is one token sequence and the ids the actor
sampled are exactly the ids it is trained on (never re-tokenized).

Two renderings share one interface, :class:`ChatFormat`:

* the tokenizer's own chat template when it has one (SmolLM2's ChatML, or any
  local HF model): the pieces between messages are derived from the template
  by rendering a probe conversation with sentinel contents;
* the **simple template** of the tiny models, documented here::

      <|system|>tool docs<|end|>        (optional)
      <|user|>the task<|end|>
      <|assistant|>Thought: ...
      Action: tool[{...}]<|end|>
      <|tool|>the observation<|end|>
      <|assistant|>...

The actor stops an action at the first token of ``end_text`` (``<|end|>`` or
``<|im_end|>``); the rest of ``end_text`` plus the observation wrapper is
appended as forced (non-sampled) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

SIMPLE_SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")

_A = "\x00ASSISTANT\x00"
_O = "\x00OBSERVATION\x00"
_U = "\x00USER\x00"
_S = "\x00SYSTEM\x00"


@dataclass(frozen=True)
class ChatFormat:
    """Text pieces around messages; ``render_*`` give exact strings to tokenize.

    ``prefix_with_system`` / ``prefix_no_system`` wrap the task (``{task}``,
    ``{system}``) and end with the assistant's opening; ``end_text`` closes an
    assistant message (its first token is the stop token); ``obs_text`` wraps
    an observation and opens the next assistant message.
    """

    prefix_with_system: str
    prefix_no_system: str
    end_text: str
    obs_text: str
    kind: str

    def render_prefix(self, task: str, system: str | None) -> str:
        """The context before the first action: optional system prompt, the task, the assistant opening."""
        if system:
            return self.prefix_with_system.replace(_S, system).replace(_U, task)
        return self.prefix_no_system.replace(_U, task)

    def render_observation(self, observation: str) -> str:
        """What follows the stop token of an action: the rest of ``end_text``, the observation, the next opening."""
        return self.obs_text.replace(_O, observation)

    def render_memory(self, notes: list[str]) -> str:
        """The memory segment kept when old turns are dropped (a user-side message listing the notes)."""
        body = "Notes from earlier turns:\n" + "\n".join(f"- {n}" for n in notes)
        return self.render_observation(body)


SIMPLE_FORMAT = ChatFormat(
    prefix_with_system=f"<|system|>{_S}<|end|>\n<|user|>{_U}<|end|>\n<|assistant|>",
    prefix_no_system=f"<|user|>{_U}<|end|>\n<|assistant|>",
    end_text="<|end|>",
    obs_text=f"\n<|tool|>{_O}<|end|>\n<|assistant|>",
    kind="simple",
)


def _render(tok: PreTrainedTokenizerBase, messages: list[dict], *, gen: bool) -> str:
    out = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    if not isinstance(out, str):  # pragma: no cover - defensive against template quirks
        raise TypeError(f"Expected the chat template to render a str, got {type(out).__name__}")
    return out


def chat_format_for(tok: PreTrainedTokenizerBase) -> ChatFormat:
    """The :class:`ChatFormat` for a tokenizer: its chat template if it has one, else the simple template.

    Observations are rendered as ``user`` messages prefixed ``Observation:``
    because few templates know a ``tool`` role.
    """
    if not getattr(tok, "chat_template", None):
        return SIMPLE_FORMAT
    user = {"role": "user", "content": _U}
    system = {"role": "system", "content": _S}
    asst = {"role": "assistant", "content": _A}
    obs = {"role": "user", "content": "Observation: " + _O}
    prefix_sys = _render(tok, [system, user], gen=True)
    prefix_no = _render(tok, [user], gen=True)
    with_a = _render(tok, [user, asst], gen=False)
    if not with_a.startswith(prefix_no) or _A not in with_a:
        raise ValueError(
            "Expected an append-only chat template (the prompt with a generation opening is a prefix of the "
            "prompt with the assistant's reply); this tokenizer's template is not. Use a model whose template "
            "is append-only (ChatML and Llama-3 styles are) or remove its chat_template to use the simple one."
        )
    end_text = with_a[with_a.index(_A) + len(_A):]
    with_obs = _render(tok, [user, asst, obs], gen=True)
    if not with_obs.startswith(with_a):
        raise ValueError("Expected an append-only chat template across turns; this tokenizer's template is not.")
    return ChatFormat(
        prefix_with_system=prefix_sys,
        prefix_no_system=prefix_no,
        end_text=end_text,
        obs_text=end_text_tail(end_text, tok) + with_obs[len(with_a):],
        kind="template",
    )


def end_text_tail(end_text: str, tok: PreTrainedTokenizerBase) -> str:
    """The part of ``end_text`` after its first token (the stop token), e.g. ``"\\n"`` after ``<|im_end|>``."""
    ids = tok.encode(end_text, add_special_tokens=False)
    if not ids:
        raise ValueError(f"Expected a non-empty end-of-message text, got {end_text!r}")
    first = tok.decode(ids[:1])
    if not end_text.startswith(first):
        raise ValueError(f"Expected end text {end_text!r} to start with its first token {first!r}")
    return end_text[len(first):]


def stop_token_id(fmt: ChatFormat, tok: PreTrainedTokenizerBase) -> int:
    """The token that ends a sampled action."""
    return tok.encode(fmt.end_text, add_special_tokens=False)[0]
