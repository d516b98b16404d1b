"""The SQL sandbox: hostile queries are refused or stopped, and the database never changes."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import pytest

from polyturn.envs.sql.sandbox import Sandbox, count_statements, format_result, format_value

BLOCK_COMMENT = chr(47) + chr(42) + " note " + chr(42) + chr(47)  # a SQL block comment


@pytest.fixture()
def db_copy(sales_db: Path, tmp_path: Path) -> Path:
    """A private copy of the sales database in an otherwise empty folder."""
    folder = tmp_path / "db"
    folder.mkdir()
    return Path(shutil.copy(sales_db, folder / "sales.sqlite"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hostile(tmp: Path) -> list[tuple[str, set[str]]]:
    evil, copy = tmp / "evil.db", tmp / "copy.db"
    forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    doubling = "WITH RECURSIVE r(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM r) SELECT length(x) FROM r"
    schema_attack = "SELECT * FROM sqlite_master; PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql = ''"
    return [
        ("DROP TABLE orders", {"sandbox_denied"}),
        ("DELETE FROM orders", {"sandbox_denied"}),
        ("UPDATE prices SET price = 0", {"sandbox_denied"}),
        ("INSERT INTO regions VALUES (99, 'x', 'y', 'z')", {"sandbox_denied"}),
        ("REPLACE INTO products VALUES (1, 'a', 'b')", {"sandbox_denied"}),
        (f"ATTACH DATABASE '{evil}' AS evil", {"sandbox_denied"}),
        ("PRAGMA writable_schema = 1", {"sandbox_denied"}),
        ("PRAGMA journal_mode = WAL", {"sandbox_denied"}),
        ("SELECT load_extension('libevil')", {"sandbox_denied", "sql_error"}),
        (f"SELECT writefile('{evil}', 'x')", {"sandbox_denied", "sql_error"}),
        ("SELECT 1; DROP TABLE orders", {"sandbox_denied"}),
        ("SELECT 1; SELECT 2", {"sandbox_denied"}),
        (forever, {"sql_timeout"}),
        ("SELECT COUNT(*) FROM orders a, orders b, orders c", {"sql_timeout"}),
        ("CREATE TEMP TABLE t(x)", {"sandbox_denied"}),
        (f"VACUUM INTO '{copy}'", {"sandbox_denied"}),
        ("WITH x AS (SELECT 1) DELETE FROM orders", {"sandbox_denied"}),
        ("BEGIN IMMEDIATE", {"sandbox_denied"}),
        (BLOCK_COMMENT + " DROP TABLE orders", {"sandbox_denied"}),
        ("-- hi\nDROP VIEW sales", {"sandbox_denied"}),
        (doubling, {"sql_error", "sql_timeout"}),  # strings capped at 1 MB
        ("SELECT randomblob(1000000000)", {"sql_error"}),
        ("ANALYZE", {"sandbox_denied"}),
        (schema_attack, {"sandbox_denied"}),
    ]


def test_hostile_queries_change_nothing(db_copy: Path, tmp_path: Path) -> None:
    before = _sha(db_copy)
    files_before = sorted(p.name for p in tmp_path.rglob("*"))
    sandbox = Sandbox(db_copy, time_budget_s=0.2)
    cases = _hostile(tmp_path)
    assert len(cases) >= 10
    for sql, kinds in cases:
        start = time.perf_counter()
        result = sandbox.run(sql)
        assert result.error in kinds, (sql, result)
        assert result.message and not result.rows
        assert time.perf_counter() - start < 2.0, sql
    # the connection still works after all of that
    assert sandbox.run("SELECT COUNT(*) FROM regions").rows[0][0] > 0
    sandbox.close()
    assert _sha(db_copy) == before
    assert sorted(p.name for p in tmp_path.rglob("*")) == files_before


def test_timeout_is_reported_quickly(db_copy: Path) -> None:
    sandbox = Sandbox(db_copy, time_budget_s=0.1)
    start = time.perf_counter()
    result = sandbox.run("SELECT COUNT(*) FROM orders a, orders b")
    assert result.error == "sql_timeout" and "0.1 s" in result.message
    assert time.perf_counter() - start < 1.0
    sandbox.close()


def test_the_envs_own_queries_are_not_timed(db_copy: Path) -> None:
    """A budget too small for any query (a machine so busy that a full scan takes longer than the agent's budget)
    times the agent's queries out, but not the env's own: its catalog, gold answers and task draws, which must not
    depend on the machine's load (a timed-out gold query used to change which tasks were drawn, and a timed-out
    catalog query crashed the env's construction with an IndexError)."""
    from polyturn.envs.sql.env import SQLAnalystEnv

    sandbox = Sandbox(db_copy, time_budget_s=1e-9)
    sql = "SELECT MIN(order_date), MAX(order_date) FROM orders"
    assert sandbox.run(sql).error == "sql_timeout"
    assert sandbox.run(sql, timed=False).rows[0][0] < sandbox.run(sql, timed=False).rows[0][1]
    sandbox.close()
    busy, calm = SQLAnalystEnv(db_path=db_copy, time_budget_s=1e-9), SQLAnalystEnv(db_path=db_copy)
    for seed in range(8):
        (q1, _), (q2, _) = busy.reset(seed=seed), calm.reset(seed=seed)
        assert q1 == q2 and busy.task == calm.task
    obs, *_ = busy.step('Thought: look.\nAction: describe_table[{"table": "orders"}]')
    assert "order_date" in obs
    obs, *_ = busy.step('Thought: q.\nAction: run_sql[{"sql": "SELECT MIN(order_date), MAX(order_date) FROM orders"}]')
    assert "stopped after" in obs  # the agent's own query is still timed


def test_reads_work_and_rows_are_capped(db_copy: Path) -> None:
    sandbox = Sandbox(db_copy, max_rows=5)
    result = sandbox.run("SELECT * FROM sales")
    assert result.error is None and len(result.rows) == 5 and result.truncated
    assert result.columns[:3] == ("order_date", "year", "quarter")
    assert {"orders", "regions", "products"} <= result.tables
    assert sandbox.run("SELECT * FROM products").tables == {"products"}
    assert sandbox.run("PRAGMA table_info(sales)").error is None
    assert sandbox.run(BLOCK_COMMENT + " SELECT 1;").rows == ((1,),)
    assert sandbox.run("SELECT 1; -- trailing comment").rows == ((1,),)
    full = sandbox.run("SELECT * FROM sales", max_rows=50)
    assert len(full.rows) == 50
    sandbox.close()


def test_sql_errors_are_results_not_exceptions(db_copy: Path) -> None:
    sandbox = Sandbox(db_copy)
    for sql in ["SELEC 1", "SELECT nope FROM sales", "SELECT * FROM nowhere", "", "   ", "SELECT 'unterminated"]:
        result = sandbox.run(sql)
        assert result.error == "sql_error", (sql, result)
        assert result.message
    sandbox.close()


def test_statement_counting() -> None:
    assert count_statements("SELECT 1") == 1
    assert count_statements("SELECT 1;  ") == 1
    assert count_statements("SELECT ';' AS x; -- ; ;") == 1
    assert count_statements("SELECT 1; SELECT 2") == 2
    assert count_statements(f"SELECT 1 {BLOCK_COMMENT}; DROP TABLE x") == 2
    assert count_statements("") == 0


def test_formatting() -> None:
    assert format_value(3.0) == "3"
    assert format_value(3.14159) == "3.14"
    assert format_value(2.5) == "2.5"
    assert format_value(None) == "NULL"
    assert format_value(12) == "12"
    assert format_value("华东") == "华东"
    from polyturn.envs.sql.sandbox import QueryResult

    text = format_result(QueryResult(columns=("product", "total"), rows=(("Fan", 10), ("Lamp", 2.25)), truncated=False))
    assert text == "product | total\nFan | 10\nLamp | 2.25\n(2 rows)"
    assert format_result(QueryResult(columns=("x",), rows=())) == "x\n(no rows)"
    assert "showing the first 1" in format_result(QueryResult(columns=("x",), rows=((1,),), truncated=True))


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="Expected an SQLite database file"):
        Sandbox(tmp_path / "nope.sqlite")
    assert not (tmp_path / "nope.sqlite").exists()
