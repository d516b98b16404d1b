"""The generated sales database: deterministic, cached atomically, small, and non-trivial."""

from __future__ import annotations

import hashlib
import math
import sqlite3
from pathlib import Path

from polyturn.envs.sql.database import (
    DB_VERSION,
    PRODUCTS,
    ZONES,
    cache_dir,
    is_sales_db,
    sales_db_path,
    write_sales_db,
)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_byte_identical_other_seed_differs(tmp_path: Path) -> None:
    a = write_sales_db(tmp_path / "a.sqlite", 3)
    b = write_sales_db(tmp_path / "b.sqlite", 3)
    c = write_sales_db(tmp_path / "c.sqlite", 4)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sqlite", "b.sqlite", "c.sqlite"]  # no temp leftovers
    assert a.stat().st_mode & 0o777 == 0o644


def test_cache_location_and_key(polyturn_cache: Path, sales_db: Path) -> None:
    assert cache_dir() == polyturn_cache / "sql"
    assert sales_db.parent == polyturn_cache / "sql"
    assert sales_db.name == f"sales-v{DB_VERSION}-seed0.sqlite"
    mtime = sales_db.stat().st_mtime_ns
    assert sales_db_path(0) == sales_db and sales_db.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert is_sales_db(sales_db)


def test_schema_and_size(sales_db: Path) -> None:
    conn = sqlite3.connect(sales_db)
    visible = "SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' AND type IN ('table', 'view')"
    names = dict(conn.execute(visible))
    assert names == {"regions": "table", "products": "table", "prices": "table", "orders": "table", "sales": "view"}
    cols = [r[1] for r in conn.execute("PRAGMA table_info(sales)")]
    assert cols == [
        "order_date", "year", "quarter", "region", "zone", "zone_zh", "product", "category", "units", "revenue"
    ]
    n_orders = conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
    assert 10_000 <= n_orders <= 40_000
    assert 20 <= conn.execute("SELECT COUNT(*) FROM products").fetchone()[0] <= 30
    zones = dict(conn.execute("SELECT DISTINCT zone, zone_zh FROM regions"))
    assert zones == {name: zh for name, zh, _, _ in ZONES}
    assert zones["East China"] == "华东"
    quarters = [r[0] for r in conn.execute("SELECT DISTINCT quarter FROM sales ORDER BY quarter")]
    assert quarters[0] == "2022-Q1" and quarters[-1] == "2024-Q4" and len(quarters) == 12
    assert conn.execute("SELECT typeof(revenue), typeof(units) FROM sales LIMIT 1").fetchone() == ("integer", "integer")
    assert conn.execute("SELECT COUNT(*) FROM prices WHERE typeof(price) != 'integer'").fetchone()[0] == 0
    # every order has exactly one price, and the view agrees with the base tables (every order, none twice)
    assert conn.execute("SELECT COUNT(*) FROM sales").fetchone()[0] == n_orders
    rows = conn.execute(
        "SELECT o.units, pr.price, o.discount FROM orders o "
        "JOIN prices pr ON pr.product_id = o.product_id AND pr.quarter = o.quarter ORDER BY o.id"
    ).fetchall()
    revenue = [r[0] for r in conn.execute("SELECT revenue FROM sales")]
    assert len(rows) == n_orders
    # units * price * (1 - discount), rounded half up as SQLite's ROUND does
    assert sorted(revenue) == sorted(math.floor(u * p * (1 - d) + 0.5) for u, p, d in rows)
    conn.close()


def test_prices_change_every_quarter_and_discounts_exist(sales_db: Path, tmp_path: Path) -> None:
    conn = sqlite3.connect(sales_db)
    history = {}
    for product_id, quarter, price in conn.execute("SELECT * FROM prices ORDER BY product_id, quarter"):
        history.setdefault(product_id, []).append((quarter, price))
    assert len(history) == len(PRODUCTS)
    for series in history.values():
        assert [q for q, _ in series][0] == "2022-Q1" and len(series) == 12
        prices = [p for _, p in series]
        assert all(a != b for a, b in zip(prices, prices[1:]))  # a new price at every quarter boundary
        assert all(0.9 <= b / a <= 1.1 for a, b in zip(prices, prices[1:]))  # moves, not jumps
    # Revenue per unit moves over time, so revenue is not proportional to units.
    per_unit = conn.execute(
        "SELECT product, quarter, 1.0 * SUM(revenue) / SUM(units) FROM sales GROUP BY product, quarter"
    ).fetchall()
    by_product = {}
    for product, _, value in per_unit:
        by_product.setdefault(product, set()).add(round(value, 2))
    assert all(len(values) == 12 for values in by_product.values())
    discounts = dict(conn.execute("SELECT discount, COUNT(*) FROM orders GROUP BY discount"))
    n = sum(discounts.values())
    assert 0.6 <= discounts[0.0] / n <= 0.9  # most orders pay the full price
    assert set(discounts) <= {0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3} and len(discounts) >= 5
    q4, q2 = (
        conn.execute(f"SELECT AVG(discount > 0) FROM orders WHERE quarter LIKE '%-Q{q}'").fetchone()[0] for q in (4, 2)
    )
    assert q4 > q2  # promotions cluster in Q4
    conn.close()
    # deterministic from the seed: the same seed gives the same prices and discounts, another seed others
    other = sqlite3.connect(write_sales_db(tmp_path / "seed1.sqlite", 1))
    again = sqlite3.connect(write_sales_db(tmp_path / "seed0.sqlite", 0))
    first = sqlite3.connect(sales_db)
    for sql in ("SELECT * FROM prices ORDER BY 1, 2", "SELECT id, discount FROM orders ORDER BY id"):
        assert again.execute(sql).fetchall() == first.execute(sql).fetchall()
        assert other.execute(sql).fetchall() != first.execute(sql).fetchall()
    for c in (other, again, first):
        c.close()


def test_rankings_differ_by_zone_and_season(sales_db: Path) -> None:
    conn = sqlite3.connect(sales_db)

    def top3(zone: str, quarter: str, measure: str = "revenue") -> list[str]:
        sql = (
            "SELECT product FROM sales WHERE zone = ? AND quarter = ? "
            f"GROUP BY product ORDER BY SUM({measure}) DESC LIMIT 3"
        )
        return [r[0] for r in conn.execute(sql, (zone, quarter))]

    tops = {tuple(top3(z[0], "2024-Q3")) for z in ZONES}
    assert len(tops) >= 4  # zones rank products differently
    assert top3("East China", "2024-Q3") != top3("East China", "2024-Q3", "units")
    fan = dict(conn.execute("SELECT substr(quarter, 6), SUM(units) FROM sales WHERE product = 'Fan' GROUP BY 1"))
    assert fan["Q3"] > 3 * fan["Q1"]  # a seasonal product
    by_quarter = [r[0] for r in conn.execute("SELECT SUM(revenue) FROM sales GROUP BY quarter ORDER BY quarter")]
    assert by_quarter[3] > by_quarter[0] and by_quarter[-1] > by_quarter[3]  # Q4 peak and growth
    conn.close()


def test_is_sales_db_false_for_other_files(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t(x)")
    conn.close()
    assert not is_sales_db(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 10)
    assert not is_sales_db(junk)


def test_names_are_short_and_plain() -> None:
    # a tiny model copies these into SQL: letters and spaces only, short
    names = [p[0] for p in PRODUCTS] + [z[0] for z in ZONES] + [r for z in ZONES for r in z[3]]
    assert all(n.replace(" ", "").isalpha() and len(n) <= 14 for n in names)
    assert len(set(names)) == len(names)
