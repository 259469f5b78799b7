"""A hostile server's text in every place report.md quotes it, read the way a reader sees it:
rendered to HTML by markdown-it with raw HTML on (the most permissive renderer). No tag, link or
image of the server's may be live, no table may gain or lose a column, and the text still shows."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from markdown_it import MarkdownIt

from dsv4bench.history.records import ToolCall, Verdict
from dsv4bench.report import build_report
from dsv4bench.report.markdown import cell, code_span, fence, inline, table

# Each breaks out of its place in one way: a cell (`|`), HTML (tags, handlers, comments, entities),
# markdown links, images and autolinks, code spans and fences (backticks), rich-looking markup.
TAG = '<img src=x onerror="alert(1)">'
PAYLOADS = [
    f"a | {TAG} | b",
    "[click](http://evil.example/a)",
    "![pix](http://evil.example/p.png)",
    "<http://evil.example/auto>",
    "` <script>alert(2)</script> `",
    '<a href="http://evil.example/x">x</a>',
    "```\n<img src=y onerror=alert(3)>\n```",
    "&lt;b&gt; &#60;img src=z onerror=alert(4)&#62;",
    "[ref]: http://evil.example/ref",
    "x\\| <svg onload=alert(5)>",
]
HOSTILE = " ".join(PAYLOADS)


class _Tags(HTMLParser):
    """Every start tag of the rendered page with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _render(md: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(md)


def _live(html: str) -> list[tuple[str, dict[str, str | None]]]:
    """Tags a server could have put there: anything but markdown's own, any handler attribute,
    any link, any image but the report's own plots."""
    own = {
        "h1",
        "h2",
        "h3",
        "p",
        "strong",
        "em",
        "code",
        "pre",
        "ul",
        "li",
        "blockquote",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "br",
        "hr",
    }
    parser = _Tags()
    parser.feed(html)
    bad = []
    for tag, attrs in parser.tags:
        ours = tag in own or (tag == "img" and str(attrs.get("src", "")).startswith("plots/"))
        if not ours or any(a.startswith("on") for a in attrs) or tag == "a":
            bad.append((tag, attrs))
    return bad


def _row_cells(line: str) -> int:
    """Cells of a table row as GFM splits it: at each `|` not right after a backslash."""
    return len(re.findall(r"(?<!\\)\|", line.strip())) - 1


def _tables(md: str) -> list[list[str]]:
    """The report's tables, each as its lines (header, delimiter row, rows)."""
    found, current = [], []
    for line in md.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found + ([current] if current else [])


def _hostile_run(run_folder, make_turn):
    turn = make_turn(HOSTILE[:60], 0, scenario=HOSTILE, verdicts=[("unknown_tool", "tool_calls[0]")], content=HOSTILE)
    turn.response.response_id = HOSTILE
    turn.response.tool_calls[0] = ToolCall(index=0, id=HOSTILE, name=HOSTILE, arguments='{"p": 1}')
    turn.verdicts[0] = Verdict("unknown_tool", f"unknown tool {HOSTILE}", HOSTILE)
    # What a proxied agent asked: its reasoning_effort and tool choice are the client's text.
    turn.request = {"terms": {"tool_choice": "auto", "thinking": True, "reasoning_effort": PAYLOADS[0]}}
    other = make_turn(
        "s2", 0, verdicts=[("garbled_text", "content")], content=HOSTILE, raw_sse=[f"data: {p}" for p in PAYLOADS]
    )
    other.request = {"terms": {"tool_choice": "auto", "thinking": True, "reasoning_effort": PAYLOADS[1]}}
    err = make_turn("s3", 0, status="error", verdicts=[("http_error", "")], error=f"HTTP 500: {HOSTILE}")
    gauge = f'sglang:num_queue_reqs{{model_name="{PAYLOADS[0]}",x="{PAYLOADS[1]}"}}'
    endpoint = {
        "root": f"http://10.0.0.1:1/{PAYLOADS[0]}",
        "role": "decode",
        "answered": True,
        "listed_as": PAYLOADS[2],
        "problems": PAYLOADS[:2],
        "settings": {"version": PAYLOADS[0], "tp_size": PAYLOADS[3], "model_path": PAYLOADS[4]},
    }
    run = {
        "run": "r",
        "command": f"dsv4bench agents --model '{PAYLOADS[6]}'",
        "config": {"model": HOSTILE, "concurrency": 8},
        "server": {
            "models": {"data": [{"id": p} for p in PAYLOADS]},
            "server_info": {"version": HOSTILE, "model_path": PAYLOADS[0], "served_model_name": PAYLOADS[1]},
            "metrics_dialect": {"name": PAYLOADS[0], "generation": PAYLOADS[5]},
            "deployment": {"given": [], "endpoints": [endpoint], "found_via": [PAYLOADS[0]]},
        },
        "wedge": {
            f"http://d:1/{PAYLOADS[0]}": {
                "codes": ["queue_stuck"],
                "gauges": {gauge: 3},
                "details": PAYLOADS,
                "drain_s": None,
            }
        },
    }
    return run_folder([turn, other, err], run=run)


def test_a_hostile_servers_text_is_inert_in_the_rendered_report(run_folder, make_turn):
    run_dir = _hostile_run(run_folder, make_turn)
    build_report(run_dir)
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    html = _render(md)
    assert _live(html) == []
    assert not re.search(r'<(?!img src="plots/)(img|script|svg|a|iframe)\b', html)
    # Every table keeps its column count on every row; the variant, wedge, server and deployment
    # tables are among them (they quote the reasoning_effort, gauge labels and /get_server_info).
    tables = _tables(md)
    assert len(tables) >= 6
    for t in tables:
        assert {_row_cells(line) for line in t} == {_row_cells(t[0])}, t
    # The text is shown, not dropped: the tag as text, in a cell and in running text alike.
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert "[click](http://evil.example/a)" in html and "![pix](http://evil.example/p.png)" in html
    assert "&lt;http://evil.example/auto&gt;" in html and "&amp;lt;b&amp;gt;" in html


def test_each_helper_keeps_its_place():
    rendered = _render(
        table(["value", "code", "n"], [[cell(p), code_span(p), "1"] for p in PAYLOADS]) + "\n\n" + inline(HOSTILE)
    )
    assert _live(rendered) == []
    assert rendered.count("<tr>") == len(PAYLOADS) + 1 and rendered.count("<td>") == 3 * len(PAYLOADS)
    # A fence holds the server's fences inside it.
    assert _render(fence(HOSTILE)).count("<pre>") == 1
    # At the start of a list item, text opens no heading, quote or list of its own.
    for start in ("# h", "> q", "- l", "1. n", "==="):
        assert "<h1>" not in (html := _render(f"- {inline(start)}")) and "<blockquote>" not in html
        assert html.count("<li>") == 1, html


def test_the_models_own_answers_read_as_written():
    text = "数据库 ✅ 🚀 **bold** _it_ snake_case a*b 1 < 2 & 3 > 2"
    html = _render(inline(text))
    assert "数据库 ✅ 🚀 **bold** _it_ snake_case a*b 1 &lt; 2 &amp; 3 &gt; 2" in html
    assert "<strong>" not in html and "<em>" not in html
