"""The data family: answer a business question from virtual sales tables and file a report."""

from __future__ import annotations

import random
import re
from math import fsum
from typing import Any

from .base import Observation, ScenarioFamily, Step, Steps, Task, ToolAction, ToolError, ToolSpec, World
from .data_world import (
    MONTHS,
    REGIONS,
    SEGMENTS,
    TEXT,
    Table,
    aggregate,
    build_tables,
    build_tables_in_steps,
    describe_conditions,
    fmt,
    select,
)
from .toolkit import ToolWorld, call, first_match, follow_plan, obj, successes
from .toolkit import table as md_table

_COND = obj(
    {
        "column": {"type": "string", "minLength": 1},
        "op": {"type": "string", "enum": ["=", "!=", "<", "<=", ">", ">="]},
        "value": {"type": ["string", "number"], "description": "Strings for text columns, numbers otherwise."},
    },
    ["column", "op", "value"],
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "list_tables",
        "List the tables of the database with row counts.",
        obj(
            {
                "include_columns": {"type": "boolean", "description": "Also list each table's column names."},
            }
        ),
    ),
    ToolSpec(
        "describe_table",
        "Show a table's columns, types, value ranges and optionally sample rows.",
        obj(
            {
                "table": {"type": "string", "minLength": 1},
                "include_samples": {"type": "boolean"},
                "sample_rows": {"type": "integer", "minimum": 1, "maximum": 20},
            },
            ["table"],
        ),
    ),
    ToolSpec(
        "run_query",
        "Select rows of one table; conditions are ANDed. Returns a table of rows.",
        obj(
            {
                "table": {"type": "string", "minLength": 1},
                "columns": {
                    "type": "array",
                    "minItems": 1,
                    "uniqueItems": True,
                    "items": {"type": "string"},
                    "description": "Columns to show; all when omitted.",
                },
                "where": {"type": "array", "maxItems": 8, "items": _COND},
                "order_by": obj({"column": {"type": "string"}, "descending": {"type": "boolean"}}, ["column"]),
                "limit": {"type": "integer", "minimum": 1, "maximum": 200},
            },
            ["table"],
        ),
    ),
    ToolSpec(
        "compute_aggregate",
        "Aggregate one column over the rows meeting a filter, optionally per group.",
        obj(
            {
                "table": {"type": "string", "minLength": 1},
                "column": {"type": "string", "minLength": 1},
                "function": {"type": "string", "enum": ["sum", "avg", "min", "max", "count"]},
                "filter": {"type": "array", "maxItems": 8, "items": _COND},
                "group_by": {"type": "string", "description": "A text column to break the result down by."},
            },
            ["table", "column", "function"],
        ),
    ),
    ToolSpec(
        "write_report",
        "File the analysis as a report with numeric findings.",
        obj(
            {
                "title": {"type": "string", "minLength": 3},
                "findings": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10,
                    "items": obj(
                        {
                            "metric": {"type": "string", "minLength": 1},
                            "value": {"type": "number"},
                            "unit": {"type": "string"},
                        },
                        ["metric", "value"],
                    ),
                },
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "notes": {"type": "string"},
            },
            ["title", "findings", "confidence"],
        ),
    ),
)


class DataWorld(ToolWorld):
    """A virtual sales database plus the reports filed against it."""

    tools = TOOLS

    def __init__(self, tables: dict[str, Table]) -> None:
        self.tables = tables
        self.reports: list[dict[str, Any]] = []

    def state(self) -> Any:
        return {"tables": {n: t.rows for n, t in self.tables.items()}, "reports": self.reports}

    def table(self, name: str) -> Table:
        if name not in self.tables:
            raise ToolError(f"no such table: {name!r}; tables: {', '.join(self.tables)}")
        return self.tables[name]

    def tool_list_tables(self, include_columns: bool = True) -> str:
        out = [f"{len(self.tables)} tables in database sales_2024:"]
        for t in self.tables.values():
            out.append(f"- {t.name} ({len(t.rows)} rows): {t.description}")
            if include_columns:
                out.append("    columns: " + ", ".join(f"{c.name} {c.type}" for c in t.columns))
        return "\n".join(out)

    def tool_describe_table(self, table: str, include_samples: bool = False, sample_rows: int = 5) -> str:
        t = self.table(table)
        rows = []
        for c in t.columns:
            values = [r[c.name] for r in t.rows]
            distinct = sorted(set(values))
            if c.type != TEXT:
                summary = f"min {fmt(min(values))}, max {fmt(max(values))}, mean {fsum(values) / len(values):.2f}"
            elif len(distinct) <= 12:
                summary = "values: " + ", ".join(distinct)
            else:
                summary = f"{len(distinct)} distinct, e.g. " + ", ".join(distinct[:3])
            rows.append((c.name, c.type, c.description, summary))
        out = [
            f"Table {t.name}: {t.description}",
            f"Rows: {len(t.rows)}",
            "",
            md_table(("column", "type", "description", "values"), rows),
        ]
        if include_samples:
            names = [c.name for c in t.columns]
            out += [
                "",
                f"Sample rows (first {sample_rows}):",
                md_table(names, [[r[n] for n in names] for r in t.rows[:sample_rows]]),
            ]
        return "\n".join(out)

    def tool_run_query(
        self,
        table: str,
        columns: list[str] | None = None,
        where: list[dict[str, Any]] | None = None,
        order_by: dict[str, Any] | None = None,
        limit: int = 50,
    ) -> str:
        t = self.table(table)
        names = columns or [c.name for c in t.columns]
        for n in names:
            t.column(n)
        rows = select(t, where)
        order = ""
        if order_by:
            key = t.column(order_by["column"]).name
            rows = sorted(rows, key=lambda r: r[key], reverse=bool(order_by.get("descending")))
            order = f", ordered by {key}{' desc' if order_by.get('descending') else ''}"
        shown = rows[:limit]
        head = f"{t.name}{describe_conditions(where)}: {len(rows)} rows match, showing {len(shown)}{order}"
        if not shown:
            return head + "\n(no rows)"
        return head + "\n" + md_table(names, [[fmt(r[n]) for n in names] for r in shown])

    def tool_compute_aggregate(
        self,
        table: str,
        column: str,
        function: str,
        filter: list[dict[str, Any]] | None = None,
        group_by: str | None = None,
    ) -> str:
        t = self.table(table)
        col = t.column(column)
        if function != "count" and col.type == TEXT:
            raise ToolError(f"{function} needs a numeric column; {column!r} is text (use count)")
        rows = select(t, filter)
        head = f"{function}({column}) on {t.name}{describe_conditions(filter)}"
        out = [head, f"result: {fmt(aggregate(rows, column, function))}", f"rows considered: {len(rows)}"]
        if group_by is not None:
            g = t.column(group_by)
            if g.type != TEXT:
                raise ToolError(f"group_by needs a text column; {group_by!r} is {g.type}")
            groups = sorted({r[g.name] for r in rows})
            out += [
                "",
                f"by {g.name}:",
                md_table(
                    (g.name, f"{function}({column})", "rows"),
                    [
                        (
                            k,
                            fmt(aggregate([r for r in rows if r[g.name] == k], column, function)),
                            sum(1 for r in rows if r[g.name] == k),
                        )
                        for k in groups
                    ],
                ),
            ]
        return "\n".join(out)

    def tool_write_report(self, title: str, findings: list[dict[str, Any]], confidence: float, notes: str = "") -> str:
        report = {"title": title, "findings": findings, "confidence": confidence, "notes": notes}
        self.reports.append(report)
        lines = [f"Report #{len(self.reports)} filed: {title!r} (confidence {confidence:.2f})"]
        lines += [f"- {f['metric']}: {f['value']}{' ' + f['unit'] if f.get('unit') else ''}" for f in findings]
        return "\n".join(lines)


# --- tasks -------------------------------------------------------------------------

MONTH_NAMES = {m: n for m, n in zip(MONTHS, ("January", "February", "March", "April", "May", "June"))}
QUARTERS = {"Q1": ("2024-01", "2024-03"), "Q2": ("2024-04", "2024-06")}

PROMPTS: dict[str, tuple[str, ...]] = {
    "revenue": (
        "What was the total revenue from completed orders in the {region} region in {month_name} 2024? Write a "
        "short report with the number.",
        "Finance needs the {month_name} 2024 revenue for {region} (completed orders only). Compute it from the "
        "orders data and file a report.",
        "How much did customers in {region} spend in {month_name} 2024, counting only completed orders? Put the "
        "figure in a report.",
    ),
    "average": (
        "What is the average value of a completed order in the {category} category? Report it.",
        "Compute the mean order amount for completed {category} orders across all months and write it up in a report.",
    ),
    "refunds": (
        "How many orders were refunded in the {region} region so far this year? Write a report with the count.",
        "Support says refunds are piling up in {region}. Count the refunded orders there and report the number.",
    ),
    "largest": (
        "What was the largest single completed order placed by {segment} customers in {quarter} 2024? Report "
        "the amount.",
        "Find the biggest completed {segment} order of {quarter} 2024 (by amount) and write a report with its value.",
    ),
    "units": (
        "How many units of {product} were sold in completed orders? Write a report with the total.",
        "Inventory planning needs the total quantity of {product} shipped in completed orders this year. "
        "Compute it and file a report.",
    ),
}


def _eq(column: str, value: Any) -> dict[str, Any]:
    return {"column": column, "op": "=", "value": value}


def _spec(kind: str, rng: random.Random, tables: dict[str, Table]) -> dict[str, Any]:
    """The question's parameters and the exact aggregates that answer it."""
    done = _eq("status", "completed")
    if kind == "revenue":
        region, month = rng.choice(REGIONS), rng.choice(MONTHS)
        return {
            "region": region,
            "month_name": MONTH_NAMES[month],
            "column": "amount",
            "function": "sum",
            "filters": [_eq("region", region), _eq("month", month), done],
            "group_by": "region",
            "context": "customers",
            "metric": f"revenue {region} {month}",
            "unit": "USD",
        }
    if kind == "average":
        category = rng.choice(sorted({r["category"] for r in tables["orders"].rows}))
        return {
            "category": category,
            "column": "amount",
            "function": "avg",
            "filters": [_eq("category", category), done],
            "group_by": "category",
            "context": "products",
            "metric": f"average {category} order",
            "unit": "USD",
        }
    if kind == "refunds":
        region = rng.choice(REGIONS)
        return {
            "region": region,
            "column": "order_id",
            "function": "count",
            "group_by": "region",
            "filters": [_eq("region", region), _eq("status", "refunded")],
            "context": "customers",
            "metric": f"refunded orders {region}",
            "unit": "orders",
        }
    if kind == "largest":
        segment, quarter = rng.choice(SEGMENTS), rng.choice(sorted(QUARTERS))
        lo, hi = QUARTERS[quarter]
        span = [{"column": "month", "op": ">=", "value": lo}, {"column": "month", "op": "<=", "value": hi}]
        return {
            "segment": segment,
            "quarter": quarter,
            "column": "amount",
            "function": "max",
            "group_by": "segment",
            "filters": [_eq("segment", segment), *span, done],
            "context": "customers",
            "metric": f"largest {segment} order {quarter}",
            "unit": "USD",
        }
    product = rng.choice(tables["products"].rows)
    return {
        "product": product["name"],
        "product_id": product["product_id"],
        "category": product["category"],
        "column": "quantity",
        "function": "sum",
        "filters": [_eq("product_id", product["product_id"]), done],
        "group_by": "category",
        "context": "products",
        "metric": f"units sold {product['name']}",
        "unit": "units",
    }


SYSTEM_PROMPT = (
    "You are a data analyst with read access to a sales database through tools (no raw SQL: queries are "
    "structured). Before computing anything, look at the tables and their columns so you filter on the right "
    "values; check a sample of the matching rows; compute the answer with an aggregate; put it in context "
    "(how many rows, how it compares). Then file a report with write_report and answer with the number."
)


class DataFamily(ScenarioFamily):
    """Data/SQL agent on virtual tables: answer a question with aggregates, then write a report."""

    name = "data"
    description = "Answer a business question from sales tables with structured queries and file a report."
    system_prompt = SYSTEM_PROMPT
    tools = TOOLS

    def build_world(self, seed: int) -> DataWorld:
        return DataWorld(build_tables(random.Random(f"data-world:{seed}")))

    def build_world_steps(self, seed: int) -> Steps[DataWorld]:
        tables = yield from build_tables_in_steps(random.Random(f"data-world:{seed}"))
        return DataWorld(tables)

    def make_task(self, world: World, seed: int) -> Task:
        assert isinstance(world, DataWorld)
        rng = random.Random(f"data-task:{seed}")
        orders = world.tables["orders"]
        while True:  # NOTE: terminates: most draws match rows; each retry draws anew
            kind = rng.choice(sorted(PROMPTS))
            spec = _spec(kind, rng, world.tables)
            rows = select(orders, spec["filters"])
            if rows:
                break
        goal = {"kind": kind, **spec, "expected": aggregate(rows, spec["column"], spec["function"])}
        return Task(self.name, seed, rng.choice(PROMPTS[kind]).format(**spec), goal)

    def expert_step(self, task: Task, seen: list[Observation]) -> Step:
        return follow_plan(task, seen, _STAGES, _finish)

    def solved(self, task: Task, world: World) -> bool:
        """Whether a filed report's first finding is the expected answer (to the cent)."""
        assert isinstance(world, DataWorld)
        expected = task.goal["expected"]
        return any(abs(r["findings"][0]["value"] - expected) < 0.005 for r in world.reports)


# --- the expert ----------------------------------------------------------------------


def _filters(task: Task, seen: list[Observation]) -> list[dict[str, Any]]:
    """The goal's filters, with a product id read off the products query when there is one."""
    g = task.goal
    if g["kind"] != "units":
        return g["filters"]
    m = first_match(seen, "run_query", rf"^\| (P-\d+) \| {re.escape(g['product'])} \|", re.M)
    return [_eq("product_id", m.group(1) if m else g["product_id"]), *g["filters"][1:]]


def _main(t: Task, s: list[Observation]) -> ToolAction:
    return call(
        "compute_aggregate", table="orders", column=t.goal["column"], function=t.goal["function"], filter=_filters(t, s)
    )


def _support(t: Task, s: list[Observation]) -> ToolAction:
    if t.goal["function"] == "count":
        return call("compute_aggregate", table="orders", column="amount", function="sum", filter=_filters(t, s))
    return call("compute_aggregate", table="orders", column="order_id", function="count", filter=_filters(t, s))


def _baseline(t: Task, s: list[Observation]) -> ToolAction:
    g = t.goal
    keep = [f for f in _filters(t, s) if f["column"] not in (g["group_by"], "product_id")]
    if g["kind"] == "units":
        keep = [_eq("category", g["category"]), *keep]
    return call(
        "compute_aggregate",
        table="orders",
        column=g["column"],
        function=g["function"],
        filter=keep,
        group_by="product_id" if g["kind"] == "units" else g["group_by"],
    )


def _value(seen: list[Observation], action: ToolAction) -> float | int | None:
    for o in successes(seen, action.name):
        m = re.search(r"^result: (-?\d+(?:\.\d+)?)$", o.result, re.M)
        if o.action == action and m:
            return float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    return None


def _report(t: Task, s: list[Observation]) -> list[ToolAction] | None:
    g = t.goal
    main = _value(s, _main(t, s))
    if main is None:
        return None
    support = _value(s, _support(t, s))
    findings = [{"metric": g["metric"], "value": main, "unit": g["unit"]}]
    if support is not None:
        label = "refunded amount" if g["function"] == "count" else "orders counted"
        findings.append({"metric": label, "value": support, "unit": "USD" if g["function"] == "count" else "orders"})
    return [
        call(
            "write_report",
            title=_sentence(g["metric"]),
            findings=findings,
            confidence=0.9,
            notes=f"{g['function']}({g['column']}) over orders{describe_conditions(_filters(t, s))}.",
        )
    ]


def _overview(t: Task, s: list[Observation]) -> list[ToolAction] | None:
    """All columns of the wider slice the question sits in (its most specific condition dropped)."""
    g = t.goal
    wider = _filters(t, s)[1:]
    if g["kind"] == "units":
        wider = [_eq("category", g["category"]), *wider]
    return [call("run_query", table="orders", where=wider, order_by={"column": "month", "descending": False}, limit=80)]


_ORDER_COLUMNS = [
    "order_id",
    "month",
    "customer_id",
    "region",
    "segment",
    "product_id",
    "category",
    "quantity",
    "amount",
    "status",
]

_STAGES = (
    lambda t, s: [call("list_tables", include_columns=True)],
    lambda t, s: [call("describe_table", table="orders", include_samples=True, sample_rows=8)],
    lambda t, s: [call("describe_table", table=t.goal["context"], include_samples=True, sample_rows=10)],
    lambda t, s: (
        [
            call(
                "run_query",
                table="products",
                columns=["product_id", "name", "category", "unit_price"],
                where=[_eq("name", t.goal["product"])],
                limit=5,
            )
        ]
        if t.goal["kind"] == "units"
        else None
    ),
    _overview,
    lambda t, s: [
        call(
            "run_query",
            table="orders",
            columns=_ORDER_COLUMNS,
            where=_filters(t, s),
            order_by={"column": "amount", "descending": True},
            limit=60,
        )
    ],
    lambda t, s: [_main(t, s)],
    lambda t, s: [_support(t, s)],
    lambda t, s: [_baseline(t, s)],
    _report,
)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _finish(task: Task, seen: list[Observation]) -> str:
    g = task.goal
    main = _value(seen, _main(task, seen))
    if main is None:
        return f"I could not compute {g['metric']}: the aggregate query did not succeed."
    filed = first_match(seen, "write_report", r"^Report #(\d+) filed")
    note = f" Filed as report #{filed.group(1)}." if filed else " (The report could not be filed.)"
    return (
        f"{_sentence(g['metric'])}: {fmt(main)} {g['unit']}, computed as {g['function']}({g['column']}) over "
        f"orders{describe_conditions(_filters(task, seen))}.{note}"
    )
