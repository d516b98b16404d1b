"""What the critic reads: a turn's state (and action) as text, and its tokenization.

The critic never sees the actor's prompt or tokens. It reads its own rendering
of the state, built from the pieces below, with its own tokenizer:

```
[PRIVILEGED] <privileged text>          (only when include_privileged)
[TASK] <the user's request>
[ACTION] <a_0>  [OBSERVATION] <o_1>      (one block per earlier turn, oldest first)
...
[CANDIDATE] <a_t>                        (only for Q(s, a))
```

For a BERT tokenizer (MiniLM) the sequence is ``[CLS] state [SEP]`` or
``[CLS] state [SEP] action [SEP]``; a tokenizer with no CLS/SEP (the
byte-level BPE of :func:`polyturn.models.tokenizer.train_tokenizer`) gets no
extra tokens. ``token_type_ids`` are 0 on the state and 1 on the action
segment; :class:`polyturn.models.critic.SeparateCritic` uses them to keep V(s)
independent of the action.

Truncation policy (:func:`encode_inputs`), from most to least important:

1. The privileged text, the task and the candidate action always survive.
   Only if together they exceed the budget are they cut, water-filling style:
   short parts stay whole and the long ones share the rest equally. The
   privileged text and the task keep their beginning; the action keeps its end
   (the ``Action: tool[...]`` line ends a ReAct action).
2. Earlier turns fill the remaining room newest first; the oldest are dropped.
   The newest turn that does not fit whole is kept cut to the room left
   (its beginning: the action and the start of the observation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

__all__ = [
    "CRITIC_MARKERS",
    "CriticInput",
    "critic_segments",
    "critic_text",
    "encode_inputs",
    "fit_parts",
]

PRIVILEGED_MARK = "[PRIVILEGED]"
TASK_MARK = "[TASK]"
ACTION_MARK = "[ACTION]"
OBSERVATION_MARK = "[OBSERVATION]"
CANDIDATE_MARK = "[CANDIDATE]"
#: Pass these as ``special_tokens`` when training a critic tokenizer, so each
#: marker is one token: ``train_tokenizer(texts, special_tokens=CRITIC_MARKERS)``.
CRITIC_MARKERS: tuple[str, ...] = (PRIVILEGED_MARK, TASK_MARK, ACTION_MARK, OBSERVATION_MARK, CANDIDATE_MARK)

# The shortest budget that leaves every fixed part (privileged, task, action) a few tokens.
MIN_MAX_LEN = 16


@dataclass
class CriticInput:
    """One state (and optionally action) for the critic to score.

    Attributes:
        task: the user's request (the first observation of the episode).
        history: ``(action, observation)`` pairs of the earlier turns, oldest
            first; ``history[i][1]`` is what the environment answered to
            ``history[i][0]``.
        privileged: training-time text the actor never sees (hidden intent,
            gold answer); read only by a critic with ``include_privileged``.
        action: the candidate action, for Q(s, a); ``None`` for V(s) only.
        features: structured environment features (``info["features"]``),
            read only by a critic built with ``feature_names``.
    """

    task: str
    history: list[tuple[str, str]]
    privileged: str | None = None
    action: str | None = None
    features: dict[str, float] | None = None


def _turn_text(action: str, observation: str) -> str:
    return f"{ACTION_MARK} {action}\n{OBSERVATION_MARK} {observation}\n"


def critic_segments(inp: CriticInput, *, include_privileged: bool) -> list[tuple[str, str]]:
    """The pieces of the critic's text as ``(kind, text)``, in reading order.

    ``kind`` is one of ``"privileged"``, ``"task"``, ``"turn"``, ``"action"``.
    Every piece starts with its marker, so no piece is empty.
    """
    segments: list[tuple[str, str]] = []
    if include_privileged and inp.privileged:
        segments.append(("privileged", f"{PRIVILEGED_MARK} {inp.privileged}\n"))
    segments.append(("task", f"{TASK_MARK} {inp.task}\n"))
    segments.extend(("turn", _turn_text(a, o)) for a, o in inp.history)
    if inp.action is not None:
        segments.append(("action", f"{CANDIDATE_MARK} {inp.action}"))
    return segments


def critic_text(inp: CriticInput, *, include_privileged: bool) -> str:
    """The critic's full, untruncated text for ``inp`` (see the module docstring)."""
    return "".join(text for _, text in critic_segments(inp, include_privileged=include_privileged))


def _water_fill(lengths: list[int], budget: int) -> list[int]:
    """Largest allowances with sum <= budget where short parts keep their full length."""
    alloc = [0] * len(lengths)
    todo = sorted(range(len(lengths)), key=lambda i: lengths[i])
    left = budget
    for rank, i in enumerate(todo):
        share = left // (len(todo) - rank)
        alloc[i] = min(lengths[i], share)
        left -= alloc[i]
    return alloc


def fit_parts(
    priv: list[int], task: list[int], action: list[int], turns: list[list[int]], budget: int
) -> tuple[list[int], list[int]]:
    """State ids and action ids of one input, cut to ``budget`` tokens in total by the truncation policy of the
    module docstring (the privileged text, the task and the action survive; the oldest turns go first)."""
    priv_n, task_n, action_n = _water_fill([len(priv), len(task), len(action)], budget)
    priv, task = priv[:priv_n], task[:task_n]
    action = action[len(action) - action_n :]
    room = budget - priv_n - task_n - action_n
    kept: list[list[int]] = []
    for turn in reversed(turns):
        if room <= 0:
            break
        kept.append(turn[:room])
        room -= len(kept[-1])
    history = [tok for turn in reversed(kept) for tok in turn]
    return priv + task + history, action


def encode_inputs(
    tokenizer: PreTrainedTokenizerBase,
    inputs: Sequence[CriticInput],
    *,
    max_len: int,
    include_privileged: bool,
    include_action: bool = True,
    feature_names: Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """Tokenize critic inputs into a right-padded batch of at most ``max_len`` tokens each.

    Args:
        tokenizer: the critic's tokenizer; must have a pad token.
        inputs: the states to encode.
        max_len: the most tokens per row, CLS/SEP included (>= 16).
        include_privileged: read ``inp.privileged``; when False it is ignored.
        include_action: encode ``inp.action`` as the action segment (for Q);
            when False actions are ignored.
        feature_names: when given, also return ``features`` [B, F] in this
            order; a missing key (or ``features=None``) reads 0.

    Returns:
        ``input_ids``, ``attention_mask``, ``token_type_ids`` (1 on the action
        segment), all long [B, L] with L the longest row, and ``features``
        (float32 [B, F]) when ``feature_names`` is given.
    """
    if max_len < MIN_MAX_LEN:
        raise ValueError(f"Expected max_len >= {MIN_MAX_LEN}, got {max_len}")
    if tokenizer.pad_token_id is None:
        raise ValueError(f"Expected a tokenizer with a pad token, got {type(tokenizer).__name__} without one")
    if not inputs:
        raise ValueError("Expected at least one CriticInput, got an empty sequence")

    per_input = []
    flat: list[str] = []
    for inp in inputs:
        if not include_action and inp.action is not None:
            inp = CriticInput(inp.task, inp.history, inp.privileged, None, inp.features)
        segs = critic_segments(inp, include_privileged=include_privileged)
        per_input.append([kind for kind, _ in segs])
        flat.extend(text for _, text in segs)
    # One batched call: the Rust tokenizer is much faster on a list than piece by piece.
    # verbose=False: a long observation exceeds model_max_length before it is cut, which is expected here.
    flat_ids = tokenizer(flat, add_special_tokens=False, verbose=False)["input_ids"]

    cls = [tokenizer.cls_token_id] if tokenizer.cls_token_id is not None else []
    sep = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []
    rows: list[tuple[list[int], list[int]]] = []
    pos = 0
    for kinds in per_input:
        parts: dict[str, list[int]] = {"privileged": [], "task": [], "action": []}
        turns: list[list[int]] = []
        for kind in kinds:
            ids = list(flat_ids[pos])
            pos += 1
            if kind == "turn":
                turns.append(ids)
            else:
                parts[kind] = ids
        has_action = "action" in kinds
        budget = max_len - len(cls) - len(sep) * (2 if has_action else 1)
        state, action = fit_parts(parts["privileged"], parts["task"], parts["action"], turns, budget)
        state_ids = cls + state + sep
        action_ids = action + sep if has_action else []
        rows.append((state_ids, action_ids))

    width = max(len(s) + len(a) for s, a in rows)
    n = len(rows)
    input_ids = torch.full((n, width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    token_type_ids = torch.zeros((n, width), dtype=torch.long)
    for i, (state_ids, action_ids) in enumerate(rows):
        length = len(state_ids) + len(action_ids)
        input_ids[i, :length] = torch.tensor(state_ids + action_ids, dtype=torch.long)
        attention_mask[i, :length] = 1
        token_type_ids[i, len(state_ids) : length] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
    if feature_names is not None:
        names = list(feature_names)
        batch["features"] = torch.tensor(
            [[float((inp.features or {}).get(k, 0.0)) for k in names] for inp in inputs], dtype=torch.float32
        ).reshape(n, len(names))
    return batch
