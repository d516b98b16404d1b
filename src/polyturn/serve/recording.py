"""Finished sessions written as episode records (``--record DIR``).

``DIR/sessions.jsonl`` gets one record a line in the format ``polyturn demos``
writes (docs/ARCHITECTURE.md), so ``polyturn train --set bc.demos=DIR/sessions.jsonl``
and the evaluation commands read it as it is. Served records add per turn the
agent's ``action_ids`` and ``logprobs`` (token-in / token-out), ``context_ids`` (the
tokens appended to the session's context before the action: the prompt, or the
observation since the last action) with ``context_restart`` (the context started
over with them), the sampling ``temperature``, ``latency_s``, ``queue_s``,
``n_tokens``, ``gen_s`` and ``forced``; and per record
``policy_version``, ``session_id``, ``kind`` (``env`` or ``chat``),
``end_reason`` and ``feedback``. A turn's exact context is the ``context_ids`` of
the turns since the last restart, each followed by its ``action_ids``
(:mod:`polyturn.acting.ope` re-scores recorded actions on it).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from polyturn.acting.jsonl import RECORD_FILE, append_jsonl


class Recorder:
    """Appends records to ``directory/sessions.jsonl`` (thread-safe, one flushed line per record)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / RECORD_FILE
        self._lock = threading.Lock()
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (through the one JSONL writer, :func:`polyturn.acting.jsonl.append_jsonl`)."""
        with self._lock:
            append_jsonl(self.path, record)
            self.written += 1
