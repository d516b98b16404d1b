"""Read-only, time-boxed execution of agent-written SQL.

Layers of defence, each enough on its own for the common attacks:

1. The file is opened read-only (``file:...?mode=ro`` URI), so SQLite itself
   refuses writes, and attached files inherit read-only mode.
2. Only one statement per call, and statements that start with a writing or
   session keyword (``INSERT``, ``DROP``, ``VACUUM``, ``ATTACH``, ``BEGIN`` ...,
   comments skipped) are refused before SQLite sees them; other text goes to
   SQLite, which reports typos as ordinary SQL errors.
3. An authorizer allows only reads: ``SELECT``, ``READ``, recursive CTEs,
   functions except a deny-list (``load_extension``, ``readfile``,
   ``writefile``, ``edit``, ``fts3_tokenizer``) and a handful of read-only
   pragmas (``table_info`` ...); everything else (INSERT, UPDATE, DELETE,
   CREATE, DROP, ALTER, ATTACH, DETACH, transactions, writable pragmas) is denied.
4. Extension loading is disabled, strings and blobs are capped at 1 MB, and no
   database may be attached (``SQLITE_LIMIT_ATTACHED = 0``).
5. A progress handler interrupts any statement that runs longer than the time
   budget (runaway recursive CTEs, huge cross joins); rows are fetched lazily
   and capped, so an unbounded result costs no more than ``max_rows`` rows.

:class:`QueryResult` reports ``error`` as ``None``, ``"sandbox_denied"``,
``"sql_timeout"`` or ``"sql_error"`` with a message fit for an observation.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SqlErrorKind = Literal["sandbox_denied", "sql_timeout", "sql_error"]

DENIED_FIRST_WORDS = frozenset(
    {"INSERT", "UPDATE", "DELETE", "REPLACE", "UPSERT", "CREATE", "DROP", "ALTER", "ATTACH", "DETACH", "VACUUM",
     "BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "REINDEX", "ANALYZE"}
)
DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
READ_ONLY_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
# Tables read while answering that say nothing about which data the query used.
_META_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_sequence"})
MAX_TEXT_BYTES = 1_000_000
MAX_SQL_CHARS = 10_000
_COMMENT_OPEN = chr(47) + chr(42)  # the block-comment opener, slash then star


@dataclass(frozen=True, kw_only=True)
class QueryResult:
    """What one ``run`` returned: columns, rows (at most ``max_rows``) or an error."""

    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    truncated: bool = False  # more rows existed than were fetched
    error: SqlErrorKind | None = None
    message: str = ""
    tables: frozenset[str] = field(default_factory=frozenset)  # base tables the query read


def _strip_comments(sql: str) -> str:
    """Drop leading whitespace and SQL comments, so the first keyword can be checked."""
    text = sql.lstrip()
    while text.startswith("--") or text.startswith(_COMMENT_OPEN):
        if text.startswith("--"):
            newline = text.find("\n")
            text = "" if newline < 0 else text[newline + 1 :].lstrip()
        else:
            end = text.find("*/")
            text = "" if end < 0 else text[end + 2 :].lstrip()
    return text


def count_statements(sql: str) -> int:
    """Number of non-empty statements in ``sql``, ignoring semicolons inside strings, identifiers and comments."""
    count = 0
    has_content = False
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`[":
            close = "]" if ch == "[" else ch
            end = sql.find(close, i + 1)
            i = n if end < 0 else end + 1
            has_content = True
            continue
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if sql.startswith(_COMMENT_OPEN, i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if ch == ";":
            count += has_content
            has_content = False
        elif not ch.isspace():
            has_content = True
        i += 1
    return count + has_content


#: The wall-clock backstop of a timed query, in multiples of its CPU-time budget (a query that waits, not computes).
WALL_FACTOR = 20.0
#: SQLite virtual-machine instructions between two budget checks of a timed query (untimed ones have no check).
#: Each check reads the thread's CPU clock; checked every 1,000 instructions on every query, drawing 200 SQL tasks
#: took 0.88 s of CPU against 0.80 s now (2-core AVX2 EPYC, 2026-12-07, 3 alternating repeats in one process).
#: A runaway recursive query with a 0.05 s budget still stops 0.25-0.35 ms of CPU past it (3 runs, same machine).
PROGRESS_EVERY = 10_000


class Sandbox:
    """A read-only connection to one SQLite file that runs untrusted queries safely.

    Args:
        path: the database file (never written).
        time_budget_s: limit per statement, in the calling thread's CPU time (so a query's fate does not depend
            on how busy the machine is: on a loaded machine a wall-clock budget timed out the scripted expert's
            queries and crashed demonstration runs), with a wall-clock backstop of ``WALL_FACTOR`` times it.
        max_rows: rows fetched per query (more rows are reported as ``truncated``).
    """

    def __init__(self, path: str | Path, *, time_budget_s: float = 1.0, max_rows: int = 20) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_file():
            raise FileNotFoundError(f"Expected an SQLite database file, got missing path {self.path}")
        if time_budget_s <= 0 or max_rows <= 0:
            raise ValueError(f"Expected time_budget_s > 0 and max_rows > 0, got {time_budget_s} and {max_rows}")
        self.time_budget_s = time_budget_s
        self.max_rows = max_rows
        self._deadline = 0.0  # thread CPU time
        self._wall_deadline = 0.0
        self._tables: set[str] = set()
        self._conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        # cached_statements=0: the authorizer runs when a statement is prepared, and it must run on every
        # query to record which tables the query reads.
        conn = sqlite3.connect(self.path.as_uri() + "?mode=ro", uri=True, check_same_thread=False, cached_statements=0)
        # Only builds with loadable-extension support have this method; elsewhere loading is impossible anyway.
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_TEXT_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS)
        # Load the schema before the authorizer is installed: schema parsing reports internal writes.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        conn.set_authorizer(self._authorize)
        return conn

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._conn.close()

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _inner: str | None) -> int:
        if action in _ALLOWED_ACTIONS:
            if action == sqlite3.SQLITE_READ and arg1 and arg1 not in _META_TABLES:
                self._tables.add(arg1)
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            return sqlite3.SQLITE_DENY if (arg2 or "").lower() in DENIED_FUNCTIONS else sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_ONLY_PRAGMAS:
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    def _over_budget(self) -> int:
        return int(time.thread_time() > self._deadline or time.perf_counter() > self._wall_deadline)

    def run(self, sql: str, *, max_rows: int | None = None, timed: bool = True) -> QueryResult:
        """Run one read-only statement; never raises for bad SQL, returns an error result instead.

        ``timed=False`` lifts the wall-clock budget: for the environment's own queries (its catalog, gold answers,
        the tools' fixed queries), whose result must not depend on how busy the machine is. The agent's queries are
        always timed."""
        limit = self.max_rows if max_rows is None else max_rows
        text = _strip_comments(sql)
        first = re.match(r"[A-Za-z]+", text)
        word = first.group(0).upper() if first else ""
        if not text:
            return QueryResult(error="sql_error", message="Empty query.")
        if count_statements(sql) > 1:
            return QueryResult(error="sandbox_denied", message="Only one statement per call is allowed.")
        if word in DENIED_FIRST_WORDS:
            return QueryResult(
                error="sandbox_denied",
                message=f"Only read-only queries are allowed (SELECT or WITH), got {word}.",
            )
        self._tables = set()
        self._deadline = time.thread_time() + self.time_budget_s if timed else math.inf
        self._wall_deadline = time.perf_counter() + WALL_FACTOR * self.time_budget_s if timed else math.inf
        self._conn.set_progress_handler(self._over_budget if timed else None, PROGRESS_EVERY)
        cursor = self._conn.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchmany(limit + 1)
            columns = tuple(d[0] for d in cursor.description or ())
        except (sqlite3.ProgrammingError, sqlite3.Warning) as exc:
            # Python's own checks (one statement per call...); ProgrammingError subclasses DatabaseError, so it goes first.
            return QueryResult(error="sandbox_denied", message=f"Query refused: {exc}")
        except sqlite3.DatabaseError as exc:
            return self._error(exc)
        except (OverflowError, ValueError, MemoryError) as exc:
            return QueryResult(error="sql_error", message=f"SQL error: {exc}")
        finally:
            cursor.close()
            if self._conn.in_transaction:
                self._conn.rollback()
        return QueryResult(
            columns=columns,
            rows=tuple(tuple(r) for r in rows[:limit]),
            truncated=len(rows) > limit,
            tables=frozenset(self._tables),
        )

    def _error(self, exc: sqlite3.DatabaseError) -> QueryResult:
        text = str(exc)
        if text == "interrupted":
            return QueryResult(
                error="sql_timeout",
                message=f"Query stopped after {self.time_budget_s:g} s. Add filters, aggregate, or use LIMIT.",
            )
        if "not authorized" in text or "prohibited" in text or "readonly" in text or "read-only" in text:
            return QueryResult(error="sandbox_denied", message=f"Query refused: {text}. Only reads are allowed.")
        return QueryResult(error="sql_error", message=f"SQL error: {text}")


def format_value(value: Any) -> str:
    """One cell as an observation shows it: plain ints, at most two decimals, NULL for None."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.2f}".rstrip("0").rstrip(".")
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = str(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def format_result(result: QueryResult, *, max_chars: int = 2000) -> str:
    """Render a successful result compactly: a ``col1 | col2`` header, rows, then a row-count line."""
    if not result.columns:
        return "(no result columns)"
    lines = [" | ".join(result.columns)]
    lines += [" | ".join(format_value(v) for v in row) for row in result.rows]
    n = len(result.rows)
    if result.truncated:
        lines.append(f"({n}+ rows; showing the first {n}. Aggregate or add LIMIT.)")
    else:
        lines.append("(no rows)" if n == 0 else f"({n} row{'s' if n != 1 else ''})")
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = text[: max_chars - 20].rsplit("\n", 1)[0] + "\n(output cut)"
    return text
