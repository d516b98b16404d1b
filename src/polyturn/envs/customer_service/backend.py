"""The written policy and the order backend that enforces it.

:data:`POLICY` is the text shown to the agent (in ``tool_docs()``). The
:class:`Backend` reads and writes the episode's database with parameterised
SQL only (no text from the agent is ever spliced into a statement). Every
write checks the policy first and raises :class:`PolicyViolation` (the env
refuses the call and counts it) or :class:`NotFound` (a failed call, not a
violation) without touching the database. The ``apply_*`` functions do the
writes alone, so the required final state of a goal is computed by the same
code that the agent's tools run.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from polyturn.envs.customer_service.database import PRODUCTS, TODAY, days_since

RETURN_WINDOW_DAYS = 30
REASONS = ("defective", "unwanted", "damaged")
POLICY = f"""Store policy (today is {TODAY.isoformat()}):
1. Verify the customer's identity before anything that reads or changes an account: find_customer with the
   email and zip code the customer gives you. Only the verified customer's orders may be read or changed.
2. Refunds: only for delivered orders, one active item at a time, with the reason the customer gave
   ("defective", "unwanted" or "damaged"). An unwanted item must have been delivered at most
   {RETURN_WINDOW_DAYS} days ago; a defective item can be refunded at any time; an item the customer damaged
   cannot be refunded.
3. Exchanges: only for another variant (size, colour ...) of the same product, for a delivered item
   delivered at most {RETURN_WINDOW_DAYS} days ago. Never for a different product.
4. Cancellations: only for orders that are pending or processing (not shipped, delivered or cancelled).
5. Address changes: the verified customer's own account only.
6. Before a refund, exchange, cancellation or address change, say what you will do and get an explicit yes.
7. Refuse what the policy forbids, politely (say sorry and why), and do not do it. Ask only for what you
   need, and never ask again for something the customer already told you."""


class PolicyViolation(Exception):
    """A call the policy forbids; the message says which rule and how to comply."""


class NotFound(Exception):
    """A call about an order, item or customer that does not exist."""


@dataclass
class Session:
    """What the backend knows about the conversation: who is verified, what the customer said."""

    verified: str | None = None  # customer_id
    stated_reason: str | None = None  # reason category the customer gave
    confirmed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def apply_refund(conn: sqlite3.Connection, item_id: str) -> float:
    """Mark the item refunded and record a refund payment with the order's method; returns the amount."""
    order_id, price = conn.execute("SELECT order_id, price FROM items WHERE item_id = ?", (item_id,)).fetchone()
    method = conn.execute("SELECT method FROM payments WHERE order_id = ? AND kind = 'charge'", (order_id,)).fetchone()
    conn.execute("UPDATE items SET status = 'refunded' WHERE item_id = ?", (item_id,))
    conn.execute("INSERT INTO payments (order_id, kind, method, amount) VALUES (?, 'refund', ?, ?)",
                 (order_id, method[0], -price))
    return float(price)


def apply_exchange(conn: sqlite3.Connection, item_id: str, variant: str) -> None:
    """Replace the item's variant (same product, same price)."""
    conn.execute("UPDATE items SET variant = ?, status = 'exchanged' WHERE item_id = ?", (variant, item_id))


def apply_cancel(conn: sqlite3.Connection, order_id: str) -> float:
    """Cancel the order and refund what was charged for its active items; returns the amount."""
    total = conn.execute("SELECT COALESCE(SUM(price), 0) FROM items WHERE order_id = ? AND status = 'active'",
                         (order_id,)).fetchone()[0]
    method = conn.execute("SELECT method FROM payments WHERE order_id = ? AND kind = 'charge'", (order_id,)).fetchone()
    conn.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (order_id,))
    conn.execute("INSERT INTO payments (order_id, kind, method, amount) VALUES (?, 'refund', ?, ?)",
                 (order_id, method[0], -total))
    return float(total)


def apply_address(conn: sqlite3.Connection, customer_id: str, address: str) -> None:
    """Set the customer's account address."""
    conn.execute("UPDATE customers SET address = ? WHERE customer_id = ?", (address, customer_id))


def _money(x: float) -> str:
    return f"{x:.2f}"


class Backend:
    """Policy-checked reads and writes on one episode's database."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.session = Session()

    # ----- checks -------------------------------------------------------------------------------
    def _require_verified(self) -> str:
        if self.session.verified is None:
            raise PolicyViolation("Refused: the customer is not verified. Ask for their email and zip code and "
                                  "call find_customer first (policy 1)")
        return self.session.verified

    def _own_order(self, order_id: str) -> tuple[str, str, str]:
        customer = self._require_verified()
        row = self.conn.execute("SELECT order_id, customer_id, status FROM orders WHERE order_id = ?",
                                (order_id,)).fetchone()
        if row is None:
            raise NotFound(f"No order {order_id!r}. Order ids look like O12345")
        if row[1] != customer:
            raise PolicyViolation(f"Refused: order {order_id} does not belong to the verified customer (policy 1)")
        return row

    def _item(self, order_id: str, item_id: str) -> tuple[str, str, float, str]:
        row = self.conn.execute("SELECT product, variant, price, status FROM items WHERE item_id = ? AND order_id = ?",
                                (item_id, order_id)).fetchone()
        if row is None:
            raise NotFound(f"No item {item_id!r} in order {order_id}. get_order lists its item ids")
        return row

    def _delivered_days(self, order_id: str) -> int | None:
        row = self.conn.execute("SELECT delivered FROM shipments WHERE order_id = ?", (order_id,)).fetchone()
        return None if row is None or row[0] is None else days_since(row[0])

    def _require_confirmed(self) -> None:
        if not self.session.confirmed:
            raise PolicyViolation("Refused: the customer has not confirmed. Say what you will do and get an "
                                  "explicit yes first (policy 6)")

    # ----- reads ----------------------------------------------------------------------------------
    def find_customer(self, email: str, zip_code: str) -> str:
        """Verify a customer by email and zip code (case and spaces ignored in the email)."""
        row = self.conn.execute("SELECT customer_id, name FROM customers WHERE lower(email) = ? AND zip = ?",
                                (email.strip().lower(), zip_code.strip())).fetchone()
        if row is None:
            raise NotFound("No customer with that email and zip code. Check both with the customer")
        self.session.verified = row[0]
        return f"Verified customer {row[0]} ({row[1]})."

    def list_orders(self, customer_id: str | None = None) -> str:
        """The verified customer's orders (``customer_id`` defaults to them), one line each, with their items."""
        verified = self._require_verified()
        customer_id = customer_id or verified
        if verified != customer_id:
            raise PolicyViolation(f"Refused: {customer_id!r} is not the verified customer (policy 1)")
        lines = []
        for order_id, placed, status in self.conn.execute(
            "SELECT order_id, placed, status FROM orders WHERE customer_id = ? ORDER BY placed DESC", (customer_id,)
        ):
            items = ", ".join(f"{p} ({v})" for p, v in self.conn.execute(
                "SELECT product, variant FROM items WHERE order_id = ? ORDER BY item_id", (order_id,)))
            lines.append(f"{order_id} placed {placed}, {status}: {items}")
        return "\n".join(lines) or "No orders."

    def get_order(self, order_id: str) -> str:
        """Status, dates, items (with other variants) and payment of one of the verified customer's orders."""
        _, _, status = self._own_order(order_id)
        placed = self.conn.execute("SELECT placed FROM orders WHERE order_id = ?", (order_id,)).fetchone()[0]
        lines = [f"Order {order_id}: {status}, placed {placed}."]
        days = self._delivered_days(order_id)
        if days is not None:
            lines[0] += f" Delivered {days} days ago."
        for item_id, product, variant, price, item_status in self.conn.execute(
            "SELECT item_id, product, variant, price, status FROM items WHERE order_id = ? ORDER BY item_id",
            (order_id,),
        ):
            others = [v for v in PRODUCTS[product][1] if v != variant]
            lines.append(f"- {item_id}: {product} ({variant}), {_money(price)}, {item_status}; "
                         f"other variants: {', '.join(others)}")
        paid = self.conn.execute("SELECT method, amount FROM payments WHERE order_id = ? AND kind = 'charge'",
                                 (order_id,)).fetchone()
        lines.append(f"Paid {_money(paid[1])} by {paid[0]}.")
        return "\n".join(lines)

    def track(self, order_id: str) -> str:
        """Carrier, tracking number and status of the order's shipment."""
        _, _, status = self._own_order(order_id)
        row = self.conn.execute("SELECT tracking, carrier, status, shipped, delivered FROM shipments "
                                "WHERE order_id = ?", (order_id,)).fetchone()
        if row is None:
            return f"Order {order_id} has not shipped yet ({status})."
        tracking, carrier, ship_status, shipped, delivered = row
        where = f"delivered on {delivered}" if delivered else "in transit"
        return f"Order {order_id}: {carrier} tracking {tracking}, shipped {shipped}, {where}."

    # ----- writes ---------------------------------------------------------------------------------
    def refund(self, order_id: str, item_id: str, reason: str) -> str:
        """Refund one item after the policy's checks (policy 2 and 6)."""
        _, _, status = self._own_order(order_id)
        product, variant, _, item_status = self._item(order_id, item_id)
        if status != "delivered":
            raise PolicyViolation(f"Refused: order {order_id} is {status}; only delivered orders can be refunded "
                                  "(policy 2; cancel pending or processing orders instead)")
        if item_status != "active":
            raise PolicyViolation(f"Refused: item {item_id} is already {item_status} (policy 2)")
        said = self.session.stated_reason
        if said is None:
            raise PolicyViolation("Refused: the customer has not said why they return the item; ask first (policy 2)")
        if reason != said:
            raise PolicyViolation(f"Refused: reason {reason!r} is not the reason the customer gave (policy 2)")
        if reason == "damaged":
            raise PolicyViolation("Refused: items the customer damaged cannot be refunded (policy 2)")
        days = self._delivered_days(order_id)
        if reason == "unwanted" and days is not None and days > RETURN_WINDOW_DAYS:
            raise PolicyViolation(f"Refused: delivered {days} days ago; unwanted items can be refunded within "
                                  f"{RETURN_WINDOW_DAYS} days only (policy 2)")
        self._require_confirmed()
        amount = apply_refund(self.conn, item_id)
        return f"Refunded {_money(amount)} for {item_id} ({product}, {variant}) of order {order_id}."

    def exchange(self, order_id: str, item_id: str, new_variant: str) -> str:
        """Exchange one item for another variant of the same product (policy 3 and 6)."""
        _, _, status = self._own_order(order_id)
        product, variant, _, item_status = self._item(order_id, item_id)
        if status != "delivered":
            raise PolicyViolation(f"Refused: order {order_id} is {status}; only delivered items can be exchanged "
                                  "(policy 3)")
        if item_status != "active":
            raise PolicyViolation(f"Refused: item {item_id} is already {item_status} (policy 3)")
        days = self._delivered_days(order_id)
        if days is not None and days > RETURN_WINDOW_DAYS:
            raise PolicyViolation(f"Refused: delivered {days} days ago; exchanges are within {RETURN_WINDOW_DAYS} "
                                  "days only (policy 3)")
        variants = PRODUCTS[product][1]
        canonical = {v.lower(): v for v in variants}.get(new_variant.strip().lower())
        if canonical is None:
            other = new_variant.strip().lower() in {p.lower() for p in PRODUCTS}
            if other:
                raise PolicyViolation(f"Refused: {new_variant!r} is another product, not a variant of {product} "
                                      f"({', '.join(variants)}); exchanges are for the same product only (policy 3)")
            raise NotFound(f"No variant {new_variant!r} of {product}; its variants are {', '.join(variants)}")
        new_variant = canonical
        if new_variant == variant:
            raise NotFound(f"Item {item_id} already is {variant}; pick another variant")
        self._require_confirmed()
        apply_exchange(self.conn, item_id, new_variant)
        return f"Exchanged {item_id} ({product}) from {variant} to {new_variant}."

    def cancel(self, order_id: str) -> str:
        """Cancel a pending or processing order (policy 4 and 6)."""
        _, _, status = self._own_order(order_id)
        if status not in ("pending", "processing"):
            raise PolicyViolation(f"Refused: order {order_id} is {status}; only pending or processing orders can be "
                                  "cancelled (policy 4)")
        self._require_confirmed()
        amount = apply_cancel(self.conn, order_id)
        return f"Cancelled order {order_id}; refunded {_money(amount)}."

    def update_address(self, customer_id: str | None, address: str) -> str:
        """Change the verified customer's address (``customer_id`` defaults to them; policy 5 and 6)."""
        verified = self._require_verified()
        customer_id = customer_id or verified
        if verified != customer_id:
            raise PolicyViolation(f"Refused: {customer_id!r} is not the verified customer (policy 5)")
        self._require_confirmed()
        apply_address(self.conn, customer_id, address)
        return f"Address of {customer_id} set to {address}."
