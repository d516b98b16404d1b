"""The one JSONL reader and writer: episode records, demonstrations, metrics, recorded sessions.

UTF-8, one JSON object a line, Chinese kept readable (``ensure_ascii=False``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The file ``polyturn serve --record DIR`` appends finished sessions to, in DIR.
RECORD_FILE = "sessions.jsonl"


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> int:
    """Write records one JSON object a line (UTF-8, Chinese kept readable); returns how many."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"Expected a file path to write JSONL to, got the directory {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def append_jsonl(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one record as a JSON line (creating the file and its directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike[str], *, partial_tail: bool = False,
               missing: str = "a JSONL file") -> list[dict[str, Any]]:
    """Read a JSONL file of JSON objects.

    Args:
        path: the file.
        partial_tail: the file may still be being written (a run's ``metrics.jsonl``): a last line
            that is not JSON yet is left out, and bytes that are not UTF-8 are replaced.
        missing: what the file should be, for the error when it does not exist.

    A missing file raises ``FileNotFoundError``; a bad line ``ValueError`` naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Expected {missing} at {path}, found {'a directory' if path.is_dir() else 'none'}")
    try:
        # not splitlines(): JSON text may hold U+2028
        lines = path.read_text(encoding="utf-8", errors="replace" if partial_tail else "strict").split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: Expected a UTF-8 JSONL file, got bytes that are not UTF-8 ({e.reason})") from None
    records = []
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if partial_tail and k == len(lines) - 1:  # the line being written now
                break
            tail = "; only the last line may be partial" if partial_tail else ""
            raise ValueError(f"{path}:{k + 1}: Expected a JSON object, got invalid JSON ({exc.msg}){tail}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{k + 1}: Expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def read_episode_records(path: str | os.PathLike[str], *, missing: str, where: str = "",
                         partial_tail: bool = False) -> list[dict[str, Any]]:
    """:func:`read_jsonl`, refusing a file whose records are not episodes (``env_id`` and a list of ``turns``),
    e.g. a metrics log or test cases; ``where`` opens the error (default: the file's path)."""
    records = read_jsonl(path, partial_tail=partial_tail, missing=missing)
    for k, rec in enumerate(records):
        if "env_id" not in rec or not isinstance(rec.get("turns"), list):
            raise ValueError(f"{where or path}: record {k + 1}: Expected an episode record (env_id, turns, ...), got "
                             f"keys {sorted(rec)[:8]}; is it an episode JSONL file (not a metrics log or test cases)?")
    return records
