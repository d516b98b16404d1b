"""Episode records as evaluation reads them; what an env calls a key action comes from its spec.

Evaluation works on the JSON episode records of docs/ARCHITECTURE.md (what
:meth:`polyturn.rollout.types.Episode.to_record` and ``polyturn demos``
write; read and write them with :func:`polyturn.acting.jsonl.read_jsonl` and
:func:`polyturn.acting.jsonl.write_jsonl`), so text policies, actor policies and
saved files are all treated alike. Evaluation adds a few fields of its own:

* ``case_id`` — the test case the episode ran;
* ``expected_key_actions`` — the test case's expected key actions (else the env's);
* ``crashed`` / ``crash`` — the episode raised; ``crash`` holds the exception text;
* per turn ``latency_s`` (seconds) and ``n_tokens`` (generated tokens; absent
  for text policies, which have no tokenizer); actor policies also write
  ``gen_s``, the turn's token-proportional share of its batched decode step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from polyturn.acting.registry import spec_or_none
from polyturn.envs.spec import EnvSpec
from polyturn.rollout.types import info_valid


def env_spec_of(record: dict[str, Any]) -> EnvSpec | None:
    """The spec of the record's environment (None for an env id no longer registered: evaluated generically)."""
    return spec_or_none(record.get("env_id"))


def turn_info(turn: dict[str, Any]) -> dict[str, Any]:
    """The turn's info dict (empty if the record has none)."""
    return turn.get("info") or {}


def action_type(turn: dict[str, Any]) -> str:
    """The turn's action type (``"invalid"`` when unknown)."""
    return str(turn_info(turn).get("action_type") or "invalid")


def is_valid(turn: dict[str, Any]) -> bool:
    """Whether the env accepted the action (tool known, arguments valid; :func:`polyturn.rollout.types.info_valid`)."""
    return info_valid(turn_info(turn))


def turn_error(turn: dict[str, Any]) -> str | None:
    """The error kind the env reported for the turn (``invalid`` when the action was invalid but no kind is given)."""
    err = turn_info(turn).get("error")
    if err:
        return str(err)
    return None if is_valid(turn) else "invalid"


def expected_key_actions(record: dict[str, Any]) -> list[str]:
    """The key actions the episode should contain: the test case's, else the env's."""
    keys = record.get("expected_key_actions")
    return list(keys if keys is not None else record.get("key_actions", []))


def performed_key_actions(record: dict[str, Any]) -> Counter:
    """How often each key action was performed by a valid action (multiset over key names)."""
    types = Counter(action_type(t) for t in record.get("turns", []) if is_valid(t))
    spec = env_spec_of(record)
    out: Counter = Counter()
    for key in set(expected_key_actions(record)) | set(spec.key_actions if spec is not None else ()):
        performers = spec.action_types_for(key) if spec is not None else frozenset({key})
        out[key] = sum(types[a] for a in performers)
    return +out


def key_action_hits(record: dict[str, Any]) -> tuple[int, int]:
    """``(matched, expected)``: expected key actions the episode performed, counted as a multiset.

    A key action expected twice (two ``run_sql``) needs two performing actions.
    """
    expected = Counter(expected_key_actions(record))
    done = performed_key_actions(record)
    return sum(min(n, done[k]) for k, n in expected.items()), sum(expected.values())


def missing_key_actions(record: dict[str, Any]) -> list[str]:
    """Expected key actions not performed (as often as expected), in expected order."""
    done = performed_key_actions(record)
    out = []
    for k in expected_key_actions(record):
        if done[k] > 0:
            done[k] -= 1
        else:
            out.append(k)
    return out


def is_success(record: dict[str, Any]) -> bool:
    """Whether the episode ended with a correct answer (never for a crashed episode)."""
    return bool(record.get("success")) and not record.get("crashed")


def task_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two records the same task: the test case's id when evaluate ran it, else env and task seed."""
    if record.get("case_id") is not None:
        return ("case", record["case_id"])
    return ("seed", record.get("env_id"), record.get("seed"))


def paired(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The records of the tasks both lists played (:func:`task_key`), as ``(before, after)`` in ``before``'s order."""
    by_key = {task_key(r): r for r in after}
    return [(r, by_key[k]) for r in before if (k := task_key(r)) in by_key]


def gained_lost(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[int, int]:
    """Tasks solved only by the second of each pair, and only by the first (:func:`is_success`)."""
    gained = sum(1 for a, b in pairs if is_success(b) and not is_success(a))
    lost = sum(1 for a, b in pairs if is_success(a) and not is_success(b))
    return gained, lost


def observation_after(record: dict[str, Any], t: int) -> str:
    """What the environment answered to turn ``t``'s action."""
    turns = record.get("turns", [])
    if t + 1 < len(turns):
        return str(turns[t + 1].get("observation", ""))
    return str(record.get("final_observation", ""))


def case_key(record: dict[str, Any]) -> str:
    """The identity of the task an episode ran: ``case_id``, else env, seed and task id."""
    if record.get("case_id") is not None:
        return str(record["case_id"])
    return f"{record.get('env_id', '')}|{record.get('seed')}|{record.get('task_id', '')}"


def transcript(record: dict[str, Any], *, max_chars: int = 600) -> list[tuple[str, str]]:
    """The conversation as ``(role, text)`` pairs: ``user`` (the task), then ``agent``/``env`` alternately.

    Texts longer than ``max_chars`` are cut (marked with an ellipsis).
    """

    def cut(s: str) -> str:
        s = str(s)
        return s if len(s) <= max_chars else s[: max_chars - 1] + "…"

    turns = record.get("turns", [])
    first = turns[0].get("observation", "") if turns else record.get("question", "")
    out = [("user", cut(first))]
    for t, turn in enumerate(turns):
        out.append(("agent", cut(turn.get("action", ""))))
        out.append(("env", cut(observation_after(record, t))))
    if record.get("crashed"):
        out.append(("crash", cut(record.get("crash", ""))))
    return out


def iter_turns(records: Sequence[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int, dict[str, Any]]]:
    """``(record, t, turn)`` for every turn of every record."""
    for rec in records:
        for t, turn in enumerate(rec.get("turns", [])):
            yield rec, t, turn
