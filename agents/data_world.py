"""The data family's virtual database: seeded tables and the tiny query engine over them.

Queries are structured (a table, conditions, an ordering, a limit), never SQL text, so
nothing is parsed or executed on the host.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from math import fsum
from typing import Any

from .base import Steps, ToolError, run_steps

REGIONS = ("North", "South", "East", "West", "Central")
SEGMENTS = ("consumer", "smb", "enterprise")
MONTHS = ("2024-01", "2024-02", "2024-03", "2024-04", "2024-05", "2024-06")
STATUSES = ("completed", "refunded", "cancelled")
CHANNELS = ("web", "partner", "direct")
PRODUCTS = {
    "hardware": ("Edge Router X2", "Rack Switch 24", "Mesh Access Point", "NVMe Cache Card", "Fanless Mini PC"),
    "software": ("Backup Suite", "Ledger Pro License", "Endpoint Guard", "Fleet Monitor", "Report Studio"),
    "services": ("Onsite Setup", "Network Audit", "Migration Package", "Priority Support Plan"),
    "accessories": ("Patch Cable Kit", "Rack Rail Set", "USB-C Dock", "Surge Protector Pro"),
    "training": ("Admin Bootcamp", "Security Workshop", "Analyst Course"),
}
_ADJ = (
    "Blue",
    "Granite",
    "Silver",
    "Northern",
    "Bright",
    "Quiet",
    "Rapid",
    "Golden",
    "Cedar",
    "Harbor",
    "Summit",
    "Prairie",
    "Coastal",
    "Iron",
    "Maple",
    "Orchid",
)
_NOUN = (
    "Harbor",
    "Peak",
    "Field",
    "River",
    "Forge",
    "Lantern",
    "Meadow",
    "Anchor",
    "Falcon",
    "Willow",
    "Stone",
    "Beacon",
)
_SUFFIX = ("Foods", "Logistics", "Labs", "Clinic", "Studios", "Partners", "Outfitters", "Energy", "Hotels", "Media")
_MANAGERS = ("Avery", "Jordan", "Priya", "Mateo", "Lena", "Kofi", "Sofia", "Hiro")

TEXT, INTEGER, NUMBER = "text", "integer", "number"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    description: str


@dataclass
class Table:
    """A named table: its columns (with types) and rows as dicts."""

    name: str
    description: str
    columns: tuple[Column, ...]
    rows: list[dict[str, Any]]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise ToolError(
            f"table {self.name!r} has no column {name!r}; columns: " + ", ".join(c.name for c in self.columns)
        )


# Orders drawn in one step of build_tables_in_steps: ~0.2 ms of the ~1.2 ms a build costs.
ORDERS_PER_STEP = 50


def build_tables(rng: random.Random) -> dict[str, Table]:
    """customers, products, orders (denormalized for filtering) and region_targets."""
    return run_steps(build_tables_in_steps(rng))


def build_tables_in_steps(rng: random.Random) -> Steps[dict[str, Table]]:
    """build_tables' tables, built in steps: customers and products, then the orders ORDERS_PER_STEP
    at a time. A pause draws nothing, so the draws run in one order whether the build pauses or not."""
    names: list[str] = []
    size = rng.randint(30, 40)
    while len(names) < size:
        n = f"{rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_SUFFIX)}"
        if n not in names:
            names.append(n)
    customers = [
        {
            "customer_id": f"C-{1001 + i}",
            "name": n,
            "region": rng.choice(REGIONS),
            "segment": rng.choices(SEGMENTS, (5, 3, 2))[0],
            "signup_month": f"{rng.choice((2022, 2023))}-{rng.randint(1, 12):02d}",
            "account_manager": rng.choice(_MANAGERS),
        }
        for i, n in enumerate(names)
    ]
    products = []
    for cat in sorted(PRODUCTS):
        for pname in rng.sample(PRODUCTS[cat], rng.randint(2, len(PRODUCTS[cat]))):
            products.append(
                {
                    "product_id": f"P-{201 + len(products)}",
                    "name": pname,
                    "category": cat,
                    "unit_price": round(rng.uniform(15, 900) / 5) * 5 - 0.01,
                }
            )
    yield
    orders = []
    for i in range(rng.randint(220, 300)):
        if i and i % ORDERS_PER_STEP == 0:
            yield
        c, p = rng.choice(customers), rng.choice(products)
        qty = rng.choices((1, 2, 3, 4, 5, 8), (6, 4, 3, 2, 1, 1))[0]
        discount = rng.choice((0.0, 0.0, 0.05, 0.1, 0.15))
        orders.append(
            {
                "order_id": f"O-{50001 + i}",
                "month": rng.choice(MONTHS),
                "customer_id": c["customer_id"],
                "region": c["region"],
                "segment": c["segment"],
                "product_id": p["product_id"],
                "category": p["category"],
                "quantity": qty,
                "unit_price": p["unit_price"],
                "discount": discount,
                "amount": round(qty * p["unit_price"] * (1 - discount), 2),
                "status": rng.choices(STATUSES, (80, 12, 8))[0],
                "channel": rng.choice(CHANNELS),
            }
        )
    targets = [
        {"region": r, "quarter": q, "revenue_target": float(rng.randint(40, 120) * 500)}
        for r in REGIONS
        for q in ("2024-Q1", "2024-Q2")
    ]
    t = Column
    return {
        "customers": Table(
            "customers",
            "One row per customer account.",
            (
                t("customer_id", TEXT, "primary key, e.g. C-1001"),
                t("name", TEXT, "company name"),
                t("region", TEXT, "sales region"),
                t("segment", TEXT, "customer segment"),
                t("signup_month", TEXT, "YYYY-MM of the first contract"),
                t("account_manager", TEXT, "first name of the owner"),
            ),
            customers,
        ),
        "products": Table(
            "products",
            "Catalog of products and services with list prices.",
            (
                t("product_id", TEXT, "primary key, e.g. P-201"),
                t("name", TEXT, "product name"),
                t("category", TEXT, "product category"),
                t("unit_price", NUMBER, "list price in USD"),
            ),
            products,
        ),
        "orders": Table(
            "orders",
            "One row per order line in 2024, with customer and product attributes copied in.",
            (
                t("order_id", TEXT, "primary key"),
                t("month", TEXT, "YYYY-MM the order was placed"),
                t("customer_id", TEXT, "references customers"),
                t("region", TEXT, "customer's region"),
                t("segment", TEXT, "customer's segment"),
                t("product_id", TEXT, "references products"),
                t("category", TEXT, "product's category"),
                t("quantity", INTEGER, "units ordered"),
                t("unit_price", NUMBER, "price per unit in USD"),
                t("discount", NUMBER, "fraction off the list price"),
                t("amount", NUMBER, "quantity * unit_price * (1 - discount), USD; the order's revenue"),
                t("status", TEXT, "completed, refunded or cancelled; revenue counts completed orders only"),
                t("channel", TEXT, "sales channel"),
            ),
            orders,
        ),
        "region_targets": Table(
            "region_targets",
            "Quarterly revenue targets per region.",
            (t("region", TEXT, "sales region"), t("quarter", TEXT, "YYYY-Qn"), t("revenue_target", NUMBER, "USD")),
            targets,
        ),
    }


_OPS = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def select(table: Table, conditions: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Rows meeting every condition ({column, op, value}); values must fit the column's type."""
    checks = []
    for n, cond in enumerate(conditions or []):
        col = table.column(cond["column"])
        value = cond["value"]
        if col.type == TEXT and not isinstance(value, str):
            raise ToolError(f"condition {n}: column {col.name!r} is text; compare it with a string")
        if col.type != TEXT and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ToolError(f"condition {n}: column {col.name!r} is numeric, got {value!r}") from None
        checks.append((col.name, _OPS[cond["op"]], value))
    return [r for r in table.rows if all(op(r[c], v) for c, op, v in checks)]


def aggregate(rows: list[dict[str, Any]], column: str, function: str) -> float | int | None:
    """count / sum / avg / min / max over a column; None when there is nothing to aggregate."""
    if function == "count":
        return len(rows)
    values = [r[column] for r in rows]
    if not values:
        return None
    if function == "sum":
        return round(fsum(values), 2)
    if function == "avg":
        return round(fsum(values) / len(values), 2)
    return min(values) if function == "min" else max(values)


def fmt(value: Any) -> str:
    """A cell or result as the tools print it: floats with two decimals."""
    if value is None:
        return "NULL"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def describe_conditions(conditions: list[dict[str, Any]] | None) -> str:
    """`where ...` in SQL-ish words, for result headers."""
    if not conditions:
        return ""
    return " where " + " AND ".join(f"{c['column']} {c['op']} {c['value']!r}" for c in conditions)
