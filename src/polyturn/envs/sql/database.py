"""The embedded sales database behind ``polyturn/SQLAnalyst-v0``.

A small SQLite file generated deterministically from a seed: the same seed
gives a byte-identical file. Schema (identifiers short and regular, because a
tiny language model has to learn to write queries against them):

* ``regions(id, region, zone, zone_zh)``: provinces and cities, each in one of
  seven sales zones (English and Chinese names, e.g. ``East China`` / ``华东``).
* ``products(id, product, category)``: 24 products in 4 categories.
* ``prices(product_id, quarter, price)``: the integer unit price of each
  product in each quarter (``'2024-Q3'``). Prices change at every quarter
  boundary, by 1-6% (electronics mostly get cheaper, the rest dearer), so
  revenue is not proportional to units.
* ``orders(id, order_date, year, quarter, region_id, product_id, units, discount, revenue)``:
  about 38k orders from 2022-01-01 to 2024-12-31 with quarterly seasonality, a
  few seasonal products and a per-product (and per zone and product) growth
  trend, so rankings differ by zone and period. ``revenue`` is stored: units *
  the quarter's price * (1 - discount), rounded. ``discount`` is the fraction
  taken off the order's price (0 for most orders; 0.05-0.30 in promotions,
  which come in some product-quarters, most often in Q4).
* ``sales``: a denormalised VIEW with ``order_date, year, quarter ('2024-Q3'),
  region, zone, zone_zh, product, category, units, revenue`` (revenue is an
  integer: units * the quarter's price * (1 - discount), rounded). Tasks and
  the expert query this view.

Files are cached under ``$POLYTURN_CACHE/sql/`` (default
``~/.cache/polyturn/sql/``), keyed by seed and :data:`DB_VERSION`, and written
atomically (temporary file, then rename), so parallel workers can share them.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import sqlite3
import tempfile
from pathlib import Path

# Bump when the generator or schema changes: cached files are keyed by it.
DB_VERSION = 4

FIRST_DAY = dt.date(2022, 1, 1)
LAST_DAY = dt.date(2024, 12, 31)

# zone, Chinese name, share of orders, regions in the zone
ZONES: tuple[tuple[str, str, float, tuple[str, ...]], ...] = (
    ("East China", "华东", 0.26, ("Shanghai", "Jiangsu", "Zhejiang", "Shandong", "Fujian", "Anhui")),
    ("North China", "华北", 0.15, ("Beijing", "Tianjin", "Hebei", "Shanxi")),
    ("South China", "华南", 0.17, ("Guangdong", "Guangxi", "Hainan")),
    ("Central China", "华中", 0.14, ("Henan", "Hubei", "Hunan", "Jiangxi")),
    ("Southwest", "西南", 0.12, ("Sichuan", "Chongqing", "Yunnan", "Guizhou")),
    ("Northwest", "西北", 0.07, ("Shaanxi", "Gansu", "Xinjiang", "Ningxia")),
    ("Northeast", "东北", 0.09, ("Liaoning", "Jilin", "Heilongjiang")),
)

# product, category, base price, seasonal multipliers for Q1..Q4
PRODUCTS: tuple[tuple[str, str, int, tuple[float, float, float, float]], ...] = (
    ("Laptop", "Electronics", 5200, (0.9, 0.9, 1.1, 1.2)),
    ("Phone", "Electronics", 3400, (1.0, 0.9, 1.0, 1.3)),
    ("Tablet", "Electronics", 2300, (1.0, 1.0, 1.0, 1.2)),
    ("Monitor", "Electronics", 1300, (1.0, 1.0, 1.0, 1.0)),
    ("Headphones", "Electronics", 450, (0.9, 1.0, 1.0, 1.3)),
    ("Camera", "Electronics", 3900, (0.8, 1.2, 1.2, 1.0)),
    ("Fridge", "Appliances", 3600, (0.8, 1.1, 1.3, 0.9)),
    ("Washer", "Appliances", 2800, (1.0, 1.0, 1.0, 1.1)),
    ("Kettle", "Appliances", 160, (1.2, 0.9, 0.8, 1.2)),
    ("Blender", "Appliances", 320, (1.0, 1.1, 1.1, 0.9)),
    ("Vacuum", "Appliances", 1100, (1.0, 1.0, 0.9, 1.2)),
    ("Heater", "Appliances", 380, (1.6, 0.4, 0.2, 1.8)),
    ("Fan", "Appliances", 220, (0.3, 1.4, 2.2, 0.2)),
    ("Desk", "Furniture", 900, (1.1, 1.0, 1.1, 0.9)),
    ("Chair", "Furniture", 650, (1.1, 1.0, 1.1, 0.9)),
    ("Sofa", "Furniture", 4200, (0.8, 1.0, 1.0, 1.2)),
    ("Lamp", "Furniture", 140, (1.1, 0.9, 0.9, 1.2)),
    ("Shelf", "Furniture", 560, (1.0, 1.0, 1.1, 0.9)),
    ("Bike", "Sports", 1500, (0.5, 1.5, 1.5, 0.5)),
    ("Treadmill", "Sports", 4600, (1.5, 0.9, 0.7, 0.9)),
    ("Yoga Mat", "Sports", 90, (1.4, 1.0, 0.9, 0.8)),
    ("Tent", "Sports", 700, (0.3, 1.6, 1.8, 0.3)),
    ("Racket", "Sports", 260, (0.8, 1.2, 1.2, 0.8)),
    ("Football", "Sports", 120, (0.7, 1.2, 1.3, 0.8)),
)

ORDERS_PER_DAY = 30.0
QUARTER_FACTOR = (0.85, 0.95, 1.0, 1.25)  # overall seasonality, Q4 strongest

# Price moves at each quarter boundary: a step of 1-6%, upwards with this probability by category.
PRICE_STEP = (0.01, 0.06)
PRICE_UP = {"Electronics": 0.3, "Appliances": 0.7, "Furniture": 0.7, "Sports": 0.7}
# Promotions: the chance that a product has one in a quarter (Q1..Q4), the share of its orders then
# discounted and their discounts; outside promotions a few orders get a small coupon.
PROMO_CHANCE = (0.25, 0.25, 0.25, 0.6)
PROMO_SHARE = (0.3, 0.7)
PROMO_DISCOUNTS = (0.1, 0.15, 0.2, 0.25, 0.3)
COUPON_SHARE = 0.08
COUPON_DISCOUNTS = (0.05, 0.1)

SCHEMA = """
CREATE TABLE regions (id INTEGER PRIMARY KEY, region TEXT NOT NULL, zone TEXT NOT NULL, zone_zh TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, product TEXT NOT NULL, category TEXT NOT NULL);
CREATE TABLE prices (product_id INTEGER NOT NULL REFERENCES products(id), quarter TEXT NOT NULL,
                     price INTEGER NOT NULL, PRIMARY KEY (product_id, quarter)) WITHOUT ROWID;
CREATE TABLE orders (id INTEGER PRIMARY KEY, order_date TEXT NOT NULL, year INTEGER NOT NULL, quarter TEXT NOT NULL,
                     region_id INTEGER NOT NULL REFERENCES regions(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), units INTEGER NOT NULL,
                     discount REAL NOT NULL, revenue INTEGER NOT NULL);
-- Covering indexes: a filter on a period, a zone (through region_id) or a product/category reads only the
-- index, never the table (task generation's gold queries went from ~6 ms to ~2 ms per task).
CREATE INDEX orders_quarter ON orders(quarter, region_id, product_id, units, revenue);
CREATE INDEX orders_year ON orders(year, quarter, region_id, product_id, units, revenue);
CREATE INDEX orders_product ON orders(product_id, year, quarter, region_id, units, revenue);
CREATE INDEX orders_region ON orders(region_id, year, quarter, product_id, units, revenue);
CREATE VIEW sales AS
SELECT o.order_date AS order_date, o.year AS year, o.quarter AS quarter,
       r.region AS region, r.zone AS zone, r.zone_zh AS zone_zh,
       p.product AS product, p.category AS category,
       o.units AS units, o.revenue AS revenue
FROM orders o JOIN regions r ON r.id = o.region_id JOIN products p ON p.id = o.product_id;
"""

REVENUE_SQL = """
UPDATE orders SET revenue = (SELECT CAST(ROUND(orders.units * pr.price * (1 - orders.discount)) AS INTEGER)
                             FROM prices pr WHERE pr.product_id = orders.product_id AND pr.quarter = orders.quarter)
"""

ZONE_NAMES: tuple[str, ...] = tuple(z[0] for z in ZONES)
PRODUCT_NAMES: tuple[str, ...] = tuple(p[0] for p in PRODUCTS)
CATEGORY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(p[1] for p in PRODUCTS))


def cache_dir() -> Path:
    """The folder for generated databases: ``$POLYTURN_CACHE/sql`` or ``~/.cache/polyturn/sql``."""
    root = os.environ.get("POLYTURN_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "polyturn"
    return base / "sql"


def quarter_of(day: dt.date) -> str:
    """The quarter label of a date, as the ``sales`` view writes it: ``'2024-Q3'``."""
    return f"{day.year}-Q{(day.month + 2) // 3}"


def _rows(seed: int) -> tuple[list[tuple], list[tuple], list[tuple], list[tuple]]:
    """Generate (regions, products, prices, orders) rows; stdlib RNG so files stay stable across numpy versions.

    Prices and discounts come from their own random stream, so the orders (dates, regions, products,
    units) are the same as before prices changed over time.
    """
    rng = random.Random(f"polyturn-sales-{seed}")
    regions: list[tuple] = []
    region_weights: dict[str, list[float]] = {}
    for zone, zone_zh, _, names in ZONES:
        region_weights[zone] = [rng.uniform(0.5, 1.5) for _ in names]
        for name in names:
            regions.append((len(regions) + 1, name, zone, zone_zh))
    region_ids = {zone: [r[0] for r in regions if r[2] == zone] for zone in ZONE_NAMES}

    products: list[tuple] = []
    first_price: list[int] = []  # the price in the first quarter
    popularity: list[float] = []
    slope: list[float] = []
    for i, (name, category, base_price, _) in enumerate(PRODUCTS):
        price = int(round(base_price * rng.uniform(0.85, 1.15) / 10) * 10)
        products.append((i + 1, name, category))
        first_price.append(price)
        # Cheap items sell more units, so "best by units" and "best by revenue" disagree.
        popularity.append(price**-0.75 * math.exp(rng.gauss(0.0, 0.35)))
        slope.append(rng.gauss(0.0, 0.3))  # log-growth per year
    affinity = {z: [math.exp(rng.gauss(0.0, 0.45)) for _ in PRODUCTS] for z in ZONE_NAMES}
    zone_slope = {z: [rng.gauss(0.0, 0.2) for _ in PRODUCTS] for z in ZONE_NAMES}
    mean_units = [3.0 if p < 300 else 1.2 if p < 1500 else 0.4 for p in first_price]
    price_rng = random.Random(f"polyturn-prices-{seed}")
    prices, promos = _price_history(price_rng, first_price)

    orders: list[tuple] = []
    zone_cum = _cumulative([z[2] for z in ZONES])
    day = FIRST_DAY
    weights_cache: dict[tuple[str, str], list[float]] = {}
    while day <= LAST_DAY:
        q = (day.month - 1) // 3
        years = (day - FIRST_DAY).days / 365.25
        lam = ORDERS_PER_DAY * QUARTER_FACTOR[q] * (1.0 + 0.1 * years)
        n_orders = max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
        for _ in range(n_orders):
            zone = rng.choices(ZONE_NAMES, cum_weights=zone_cum)[0]
            key = (zone, quarter_of(day))
            cum = weights_cache.get(key)
            if cum is None:
                cum = _cumulative(
                    [
                        popularity[j]
                        * affinity[zone][j]
                        * PRODUCTS[j][3][q]
                        * math.exp((slope[j] + zone_slope[zone][j]) * years)
                        for j in range(len(PRODUCTS))
                    ]
                )
                weights_cache[key] = cum
            j = rng.choices(range(len(PRODUCTS)), cum_weights=cum)[0]
            region_id = rng.choices(region_ids[zone], weights=region_weights[zone])[0]
            units = 1 + int(rng.expovariate(1.0 / mean_units[j]))
            share, discounts = promos[(j, quarter_of(day))]
            discount = price_rng.choice(discounts) if price_rng.random() < share else 0.0
            orders.append(
                (len(orders) + 1, day.isoformat(), day.year, quarter_of(day), region_id, j + 1, units, discount)
            )
        day += dt.timedelta(days=1)
    return regions, products, prices, orders


def _quarters() -> list[str]:
    """The quarter labels from FIRST_DAY to LAST_DAY, in order."""
    return [f"{year}-Q{q}" for year in range(FIRST_DAY.year, LAST_DAY.year + 1) for q in range(1, 5)]


def _price_history(
    rng: random.Random, first_price: list[int]
) -> tuple[list[tuple], dict[tuple[int, str], tuple[float, tuple[float, ...]]]]:
    """Rows of ``prices`` (a different price every quarter) and, per (product index, quarter),
    the share of orders discounted and the discounts to draw from."""
    rows: list[tuple] = []
    promos: dict[tuple[int, str], tuple[float, tuple[float, ...]]] = {}
    for j, price in enumerate(first_price):
        up = PRICE_UP[PRODUCTS[j][1]]
        step = 10 if price >= 1000 else 1
        for k, quarter in enumerate(_quarters()):
            if k > 0:
                change = rng.uniform(*PRICE_STEP) * (1 if rng.random() < up else -1)
                new = int(round(price * (1 + change) / step)) * step
                price = new if new != price else price + (step if change > 0 else -step)
            rows.append((j + 1, quarter, price))
            if rng.random() < PROMO_CHANCE[k % 4]:
                promos[(j, quarter)] = (rng.uniform(*PROMO_SHARE), PROMO_DISCOUNTS)
            else:
                promos[(j, quarter)] = (COUPON_SHARE, COUPON_DISCOUNTS)
    return rows, promos


def _cumulative(weights: list[float]) -> list[float]:
    total = 0.0
    out = []
    for w in weights:
        total += w
        out.append(total)
    return out


def write_sales_db(path: str | os.PathLike[str], seed: int) -> Path:
    """Generate the sales database for ``seed`` at ``path`` (atomically replacing any file there).

    The same seed gives a byte-identical file on the same SQLite version.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    regions, products, prices, orders = _rows(seed)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp)
        try:
            # No journal: the file is private until the rename below, and this keeps the build fast.
            conn.execute("PRAGMA journal_mode = OFF")
            conn.executescript(SCHEMA)
            conn.executemany("INSERT INTO regions VALUES (?, ?, ?, ?)", regions)
            conn.executemany("INSERT INTO products VALUES (?, ?, ?)", products)
            conn.executemany("INSERT INTO prices VALUES (?, ?, ?)", prices)
            conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)", orders)
            # Stored, not computed in the view: a join on prices in every query cost ~0.6 ms of ~1.5.
            conn.execute(REVENUE_SQL)
            conn.commit()
            conn.execute("ANALYZE")  # planner statistics, so filters on product use the right index
            conn.commit()
        finally:
            conn.close()
        tmp.chmod(0o644)  # mkstemp makes 0600 files; the cache may be shared by other users' workers
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def sales_db_path(seed: int, *, directory: str | os.PathLike[str] | None = None) -> Path:
    """Path of the cached sales database for ``seed``, generating it on first use."""
    folder = Path(directory) if directory is not None else cache_dir()
    path = folder / f"sales-v{DB_VERSION}-seed{seed}.sqlite"
    if not path.exists():
        write_sales_db(path, seed)
    return path


def is_sales_db(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a SQLite file with the ``sales`` view (a database this module wrote)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = 'sales'").fetchone()
    except sqlite3.DatabaseError:
        return False
    finally:
        conn.close()
    return row is not None
