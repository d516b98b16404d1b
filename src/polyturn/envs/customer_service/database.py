"""The order database of ``polyturn/CustomerService-v0``, generated from a seed.

Each episode gets its own in-memory SQLite database (a few customers with a
few orders each, ~1 ms to build), because the agent's tools write to it:
refunds, exchanges, cancellations and address changes. Tables::

    customers (customer_id, name, email, zip, address)
    orders    (order_id, customer_id, placed, status)        status: pending | processing | shipped |
                                                                      delivered | cancelled
    items     (item_id, order_id, product, variant, price, status)   status: active | refunded | exchanged
    shipments (order_id, tracking, carrier, status, shipped, delivered)  status: in_transit | delivered
    payments  (payment_id, order_id, kind, method, amount)   kind: charge | refund (negative amount)

The world is first built as plain rows (:class:`World`), so a goal can plant
the order it needs before the rows are written (:func:`write_db`). Dates are
ISO strings relative to the fixed :data:`TODAY`. Every variant of a product has
the product's price, so an exchange never moves money.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from dataclasses import dataclass, field
from typing import Any

TODAY = dt.date(2025, 6, 30)

#: product -> (price, variants). Exchanges stay within one product's variants.
PRODUCTS: dict[str, tuple[float, tuple[str, ...]]] = {
    "Wireless Headphones": (89.0, ("black", "white", "blue")),
    "Running Shoes": (120.0, ("size 8", "size 9", "size 10", "size 11")),
    "Cotton T-Shirt": (19.5, ("size S", "size M", "size L", "size XL")),
    "Coffee Maker": (64.0, ("black", "silver")),
    "Hiking Backpack": (75.0, ("green", "grey", "navy")),
    "Desk Lamp": (32.0, ("white", "black")),
    "Water Bottle": (15.0, ("500 ml", "750 ml", "1 litre")),
    "Phone Case": (12.0, ("red", "clear", "black")),
    "Yoga Mat": (28.0, ("purple", "blue", "green")),
    "Bluetooth Speaker": (55.0, ("black", "red")),
    "Smart Watch": (199.0, ("40 mm", "44 mm")),
    "Rain Jacket": (98.0, ("size S", "size M", "size L")),
}
FIRST_NAMES = ("Ann", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena",
               "Marco", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Wei", "Yara", "Zoe")
LAST_NAMES = ("Lee", "Garcia", "Wang", "Smith", "Okafor", "Novak", "Silva", "Khan", "Muller", "Tanaka",
              "Rossi", "Brown", "Zhang", "Haddad", "Kim", "Lopez")
STREETS = ("Maple St", "Oak Ave", "Pine Rd", "Cedar Ln", "Elm St", "Birch Way", "Lake Dr", "Hill Rd",
           "River Rd", "Park Ave", "Sunset Blvd", "Mill Ln")
CITIES = ("Springfield", "Riverton", "Lakeside", "Fairview", "Georgetown", "Ashland", "Clayton", "Dover")
CARRIERS = ("UPS", "FedEx", "USPS", "DHL")
METHODS = ("credit_card", "paypal", "gift_card")
TABLES = ("customers", "orders", "items", "shipments", "payments")
SCHEMA = """
CREATE TABLE customers (customer_id TEXT PRIMARY KEY, name TEXT, email TEXT, zip TEXT, address TEXT);
CREATE TABLE orders (order_id TEXT PRIMARY KEY, customer_id TEXT, placed TEXT, status TEXT);
CREATE TABLE items (item_id TEXT PRIMARY KEY, order_id TEXT, product TEXT, variant TEXT, price REAL, status TEXT);
CREATE TABLE shipments (order_id TEXT PRIMARY KEY, tracking TEXT, carrier TEXT, status TEXT, shipped TEXT,
                        delivered TEXT);
CREATE TABLE payments (payment_id INTEGER PRIMARY KEY, order_id TEXT, kind TEXT, method TEXT, amount REAL);
"""
Row = dict[str, Any]


def day(days_ago: int) -> str:
    """The ISO date ``days_ago`` days before :data:`TODAY`."""
    return (TODAY - dt.timedelta(days=days_ago)).isoformat()


def days_since(iso: str) -> int:
    """Whole days from the ISO date ``iso`` to :data:`TODAY`."""
    return (TODAY - dt.date.fromisoformat(iso)).days


def random_address(rng: random.Random) -> str:
    """A street address such as ``"42 Oak Ave, Dover"``."""
    return f"{rng.randint(2, 998)} {rng.choice(STREETS)}, {rng.choice(CITIES)}"


@dataclass
class World:
    """The database as plain rows, before it is written (goals plant their order here)."""

    rng: random.Random
    customers: list[Row] = field(default_factory=list)
    orders: list[Row] = field(default_factory=list)
    items: list[Row] = field(default_factory=list)
    shipments: list[Row] = field(default_factory=list)
    payments: list[Row] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    def new_id(self, prefix: str, digits: int) -> str:
        """A fresh id such as ``O48213`` (unique within the world)."""
        while True:
            value = prefix + "".join(self.rng.choice("0123456789") for _ in range(digits))
            if value not in self._ids and value[len(prefix)] != "0":
                self._ids.add(value)
                return value

    def add_customer(self) -> Row:
        """A customer with a unique email and a 5-digit zip code."""
        rng = self.rng
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        while True:
            email = f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.com"
            if all(c["email"] != email for c in self.customers):
                break
        row = {"customer_id": self.new_id("C", 4), "name": f"{first} {last}", "email": email,
               "zip": f"{rng.randint(10000, 99999)}", "address": random_address(rng)}
        self.customers.append(row)
        return row

    def products_of(self, customer_id: str) -> set[str]:
        """Products the customer has in any order (a goal's product must be unique to its order)."""
        orders = {o["order_id"] for o in self.orders if o["customer_id"] == customer_id}
        return {i["product"] for i in self.items if i["order_id"] in orders}

    def add_order(self, customer_id: str, status: str, lines: list[tuple[str, str]], *, age: int) -> Row:
        """An order of ``lines`` (product, variant) in ``status``; ``age`` is days since delivery for
        delivered orders and days since the order was placed otherwise."""
        rng = self.rng
        shipped = delivered = None
        if status == "delivered":
            delivered_day = age
            placed_ago = age + rng.randint(3, 5)
            shipped = day(placed_ago - rng.randint(1, 2))
            delivered = day(delivered_day)
        else:
            placed_ago = age
            if status == "shipped":
                shipped = day(max(0, age - 2))
        order = {"order_id": self.new_id("O", 5), "customer_id": customer_id, "placed": day(placed_ago),
                 "status": status}
        self.orders.append(order)
        total = 0.0
        for product, variant in lines:
            price = PRODUCTS[product][0]
            total += price
            self.items.append({"item_id": self.new_id("I", 5), "order_id": order["order_id"], "product": product,
                               "variant": variant, "price": price, "status": "active"})
        if shipped is not None:
            tracking = "1Z" + "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ23456789") for _ in range(8))
            self.shipments.append({"order_id": order["order_id"], "tracking": tracking,
                                   "carrier": rng.choice(CARRIERS),
                                   "status": "delivered" if delivered else "in_transit",
                                   "shipped": shipped, "delivered": delivered})
        method = rng.choice(METHODS)
        self.payments.append({"order_id": order["order_id"], "kind": "charge", "method": method, "amount": total})
        if status == "cancelled":
            self.payments.append({"order_id": order["order_id"], "kind": "refund", "method": method,
                                  "amount": -total})
        return order

    def add_random_orders(self, customer_id: str, n: int, *, avoid: set[str] = frozenset()) -> None:
        """``n`` orders of 1-3 random products, none of them in ``avoid`` or already ordered."""
        rng = self.rng
        for _ in range(n):
            taken = self.products_of(customer_id) | set(avoid)
            free = [p for p in PRODUCTS if p not in taken]
            if not free:
                return
            k = min(len(free), rng.randint(1, 2))
            lines = [(p, rng.choice(PRODUCTS[p][1])) for p in rng.sample(free, k)]
            status = rng.choice(("pending", "processing", "shipped", "delivered", "delivered", "delivered",
                                 "cancelled"))
            age = {"pending": rng.randint(0, 1), "processing": rng.randint(1, 3), "shipped": rng.randint(3, 6),
                   "delivered": rng.randint(2, 120), "cancelled": rng.randint(5, 60)}[status]
            self.add_order(customer_id, status, lines, age=age)
            if status == "delivered" and rng.random() < 0.2:  # an earlier refund, for realism
                self.items[-1]["status"] = "refunded"
                first = self.payments[-1]
                self.payments.append({"order_id": first["order_id"], "kind": "refund", "method": first["method"],
                                      "amount": -self.items[-1]["price"]})


def random_world(seed: str, *, n_customers: int = 5) -> World:
    """Customers with 1-3 random orders each, drawn from ``seed``."""
    world = World(rng=random.Random(seed))
    for _ in range(n_customers):
        customer = world.add_customer()
        world.add_random_orders(customer["customer_id"], world.rng.randint(1, 3))
    return world


def write_db(world: World) -> sqlite3.Connection:
    """A fresh in-memory database holding the world's rows (payments numbered in order)."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.executescript(SCHEMA)
    for table in TABLES:
        rows: list[Row] = getattr(world, table)
        if not rows:
            continue
        cols = list(rows[0])
        marks = ", ".join("?" for _ in cols)
        conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                         [tuple(r[c] for c in cols) for r in rows])
    conn.commit()
    return conn


def copy_db(conn: sqlite3.Connection) -> sqlite3.Connection:
    """An independent in-memory copy of ``conn``."""
    other = sqlite3.connect(":memory:", check_same_thread=False)
    conn.backup(other)
    return other


def snapshot(conn: sqlite3.Connection) -> tuple[tuple[Any, ...], ...]:
    """Every row of every table, in a canonical order: two databases are in the same state iff equal."""
    rows: list[tuple[Any, ...]] = []
    for table in TABLES:
        rows += [(table, *r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3")]
    return tuple(rows)
