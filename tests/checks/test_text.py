"""Repetition loops and garbled text on literal texts; clean fixtures pin the thresholds."""

from __future__ import annotations

import json

import pytest

from dsv4bench.checks.text import check_degenerate_repetition, check_garbled_text, find_garbled, find_loop

from .turns import turn

PYTHON_FILE = '''"""Settings for the ingest service."""

import os

DEFAULT_HOST = os.environ.get("INGEST_HOST", "0.0.0.0")
DEFAULT_PORT = int(os.environ.get("INGEST_PORT", "8080"))
DEFAULT_WORKERS = int(os.environ.get("INGEST_WORKERS", "4"))
DEFAULT_TIMEOUT = int(os.environ.get("INGEST_TIMEOUT", "30"))
DEFAULT_RETRIES = int(os.environ.get("INGEST_RETRIES", "3"))
DEFAULT_BATCH = int(os.environ.get("INGEST_BATCH", "128"))


class Config:
    def __init__(self, host, port, workers, timeout, retries, batch):
        self.host = host
        self.port = port
        self.workers = workers
        self.timeout = timeout
        self.retries = retries
        self.batch = batch

    def __repr__(self):
        return f"Config({self.host!r}, {self.port}, {self.workers})"


def test_defaults():
    assert DEFAULT_PORT == 8080
    assert DEFAULT_WORKERS == 4
    assert DEFAULT_TIMEOUT == 30
    assert DEFAULT_RETRIES == 3
    assert DEFAULT_BATCH == 128
    assert Config("h", 1, 2, 3, 4, 5).port == 1
'''
ZERO_BUFFER = "BUF = [" + ", ".join(["0"] * 48) + "]\nMASK = [" + ", ".join(["0xff"] * 16) + "]\n"
NESTED_JS = "describe('api', () => {\n  it('works', () => {\n    run(() => {\n      check(() => {\n        done();\n      });\n    });\n  });\n});\n"
MARKDOWN_TABLE = "| service | status | p99 ms | errors |\n|---|---|---|---|\n" + "".join(
    f"| svc-{i:02d} | ok | {100 + 7 * i} | 0 |\n" for i in range(30)
)
JSON_ARRAY = json.dumps([{"id": i, "name": f"user{i}", "active": True, "roles": ["read"]} for i in range(40)], indent=2)
LOG_EXCERPT = (
    "".join(
        f"2024-05-01T12:00:{i:02d}.{(i * 37) % 1000:03d}Z INFO  worker-{i % 4} request done status=200 latency_ms={40 + i % 9}\n"
        for i in range(40)
    )
    + "2024-05-01T12:00:41.000Z WARN  worker-2 retrying upstream\n" * 3
)
RULERS = "Results\n" + "=" * 80 + "\nall green\n" + "-" * 80 + "\n" + "─" * 79
CSV = "date,region,sales\n" + "".join(f"2024-01-{d:02d},eu,{1000 + d * 13}\n" for d in range(1, 31))
ENGLISH = (
    "The failing test reads the configuration before the environment is patched, so the default port "
    "is used. I moved the patch into a fixture and re-ran the suite; all forty tests pass now. "
) * 1
CHINESE = "我们首先检查配置文件，然后运行测试。测试通过后，再提交代码。如果失败，就查看日志并修复问题。"
YAML = "services:\n" + "".join(f"  - name: svc{i}\n    replicas: 2\n    port: {8000 + i}\n" for i in range(15))

CLEAN_TEXTS = {
    "python file": PYTHON_FILE,
    "zero buffer literal": ZERO_BUFFER,
    "nested js closings": NESTED_JS,
    "markdown table": MARKDOWN_TABLE,
    "json array of similar objects": JSON_ARRAY,
    "log excerpt": LOG_EXCERPT,
    "rulers": RULERS,
    "csv": CSV,
    "english": ENGLISH,
    "chinese": CHINESE,
    "yaml": YAML,
    "short ha": "haha, nice one!",
    "ellipsis": "Wait... let me think... okay.",
}

LOOPS = {
    "word loop": "Sure, the answer is " + "the " * 60,
    "closing braces": '{"path": "a.py", "content": "' + "}" * 300,
    "same line 12 times": "Plan:\n" + "I will now read the file.\n" * 12,
    "sentence loop at tail": ENGLISH + "Wait, let me re-check the path. " * 6,
    "block loop at tail": ENGLISH + "Step:\n  read a.py\n  edit a.py\n  run tests\n" * 5,
    "loop in the middle": "Start. " + "abcabc" * 70 + " Then the normal text continues for a while longer here.",
    "chinese loop": "好的，" + "我们需要检查文件。" * 10,
    "mostly one unit": "ok ok ok ok ok ok ok ok ok ok ok ok",
    "newline-separated words": "yes\n" * 3 + "\n".join(["done"] * 30),
    "loop cut mid-unit": "Answer: " + "foo bar baz " * 20 + "foo ba",
}


@pytest.mark.parametrize("text", CLEAN_TEXTS.values(), ids=CLEAN_TEXTS.keys())
def test_clean_text_has_no_loop(text: str) -> None:
    assert find_loop(text) is None


@pytest.mark.parametrize("text", LOOPS.values(), ids=LOOPS.keys())
def test_loops_are_found(text: str) -> None:
    assert find_loop(text) is not None


@pytest.mark.parametrize(
    ("field", "ctx"),
    [
        ("content", turn("Here it is: " + "the " * 50)),
        ("reasoning", turn("Done.", reasoning=ENGLISH + "Let me reconsider. " * 8)),
        ("tool_calls[0].arguments", turn(calls=[("run_shell", '{"command": "echo ' + "}" * 200)], finish="length")),
        (
            "tool_calls[0].arguments",
            turn(calls=[("edit_file", {"path": "a.py", "edits": [{"old": "", "new": "x = 1\n" * 40}]})]),
        ),
    ],
)
def test_degenerate_repetition_names_the_field(field: str, ctx) -> None:
    [v] = check_degenerate_repetition(ctx)
    assert v.code == "degenerate_repetition" and v.where == field
    assert "repeated" in v.detail


@pytest.mark.parametrize("text", CLEAN_TEXTS.values(), ids=CLEAN_TEXTS.keys())
def test_clean_turns_pass_both_text_checks(text: str) -> None:
    ctx = turn(text, reasoning=text, calls=[("edit_file", {"path": "x", "edits": [{"old": "", "new": text}]})])
    assert check_degenerate_repetition(ctx) == []
    assert check_garbled_text(ctx) == []


def test_json_arguments_with_repeated_structure_pass() -> None:
    rows = [{"id": i, "old": f"line {i}", "new": f"line {i} fixed"} for i in range(60)]
    ctx = turn(calls=[("edit_file", {"path": "a.py", "edits": [{"old": r["old"], "new": r["new"]} for r in rows]})])
    assert check_degenerate_repetition(ctx) == []


def test_a_long_loop_is_judged_quickly() -> None:
    assert find_loop("Let me think. " + "ab" * 40_000) is not None
    assert find_loop(PYTHON_FILE * 50) is not None  # the same file pasted 50 times is a loop
    assert find_loop("Here it is:\n" + PYTHON_FILE * 3) is not None
    assert find_loop(PYTHON_FILE * 2) is None


GARBLED = {
    "replacement char": "The result is caf\ufffd and more",
    "nul": "abc\x00def",
    "bell": "done\x07",
    "escape": "\x1b[31mred\x1b[0m",
    "lone surrogate": "abc\ud800def",
    "noncharacter": "text \uffff here",
    "bpe spaces": "ĠĠĊĠtheĠfile",
    "bpe words": "HelloĠworldĠhowĠareĠyou",
    "bpe utf8 bytes": "ItâĢĻs fine, donâĢĻt worry",
    "double-encoded": "CafÃ© rÃ©sumÃ© naÃ¯ve",
    "double-encoded quotes": "donâ€™t say â€œhelloâ€",
    "zalgo": "Z\u0334\u0321\u031b\u0348a\u0337\u0316\u0317\u0318lgo",
    "mixed scripts": "ꙮ걸ҹ拉ॐ and ثبتшу λαשׁ",
    "script soup": "Пр你ивет שלוםмир καλημέρα日本",
}

CLEAN_GARBLE = {
    "english": ENGLISH,
    "chinese": CHINESE,
    "japanese mixed": "Pythonでサーバーを起動し、ログを確認します。テストは全部通りました。",
    "korean": "API를 호출하고 결과를 확인합니다. 韓國語한국어",
    "russian": "Проверьте файл config.yaml и перезапустите сервис.",
    "ukrainian apostrophe": "пʼять хвилин, мʼята",
    "arabic": "يرجى التحقق من ملف الإعدادات ثم إعادة التشغيل.",
    "hindi": "कृपया फ़ाइल की जाँच करें और सेवा को फिर से शुरू करें।",
    "thai": "กรุณาตรวจสอบไฟล์การตั้งค่า",
    "polish": "Zażółć gęślą jaźń, ćma łąka",
    "esperanto": "Ĉiuj riĉaj manĝaĵoj ĉe la ĉambro",
    "maltese": "Ġermanja u Ċipru huma pajjiżi. Ġenn Ġdid",
    "vietnamese": "Tiếng Việt có dấu, người dùng thấy ổn.",
    "french": "Le café est prêt; à bientôt, naïve Zoë.",
    "greek and units": "latency 10μs (10µs), Δx/Δt, α=0.5, ℝⁿ, 5 Ω",
    "emoji": "Deployed 🚀✅ 👨‍👩‍👧 👍🏽 🇫🇷 ✨✨✨",
    "code": PYTHON_FILE,
    "json": JSON_ARRAY,
    "url": "https://example.com/api/v1/items?id=42&sort=desc#frag",
    "base64 id": "request id dXNlcjoxMjM0NTY3ODkwYWJjZGVmZ2hpams= and sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "tabs and crlf": "a\tb\r\nc\td\r\n",
    "box drawing": "┌────┬────┐\n│ a  │ b  │\n└────┴────┘",
}


@pytest.mark.parametrize("text", GARBLED.values(), ids=GARBLED.keys())
def test_garbled_text_is_found(text: str) -> None:
    assert find_garbled(text) is not None


@pytest.mark.parametrize("text", CLEAN_GARBLE.values(), ids=CLEAN_GARBLE.keys())
def test_language_is_not_garbled(text: str) -> None:
    assert find_garbled(text) is None


@pytest.mark.parametrize(
    ("ctx", "where", "says"),
    [
        (turn("Hello w\ufffdrld"), "content@7", "U+FFFD"),
        (turn("ok", reasoning="ĠĠĊĠthe"), "reasoning@0", "BPE"),
        (turn(calls=[("run_shell", {"command": "echo w\ufffdrld"})]), "tool_calls[0].arguments", "U+FFFD"),
        (
            turn(calls=[("run_shell", '{"command": "echo \u0007"')]),
            "tool_calls[0].arguments",
            "invalid character U+0007",
        ),
        (turn(calls=[("read_file", {"path": "CafÃ©/rÃ©sumÃ©.txt"})]), "tool_calls[0].arguments", "mojibake"),
    ],
)
def test_garbled_text_verdicts(ctx, where: str, says: str) -> None:
    [v] = check_garbled_text(ctx)
    assert v.code == "garbled_text" and v.where == where and says in v.detail


def test_a_lone_surrogate_the_assembler_replaced_is_named() -> None:
    ctx = turn("a\ufffdb", calls=[("read_file", {"path": "x\ufffd"})])
    ctx.response.tool_calls[0].index = 4  # the server's index, not the position
    ctx.response.surrogates_replaced = ["content", "tool_calls[4].arguments"]
    content, args = check_garbled_text(ctx)
    assert content.where == "content@1" and content.detail.startswith("lone UTF-16 surrogate")
    assert args.where == "tool_calls[0].arguments" and "lone UTF-16 surrogate" in args.detail
    # The same U+FFFD without the note is invalid UTF-8 that arrived as U+FFFD.
    [v] = check_garbled_text(turn("a\ufffdb"))
    assert "U+FFFD replacement character" in v.detail
    # A surrogate the text bound clipped away is still garbled.
    clipped = turn("ab")
    clipped.response.surrogates_replaced = ["content"]
    [v] = check_garbled_text(clipped)
    assert v.where == "content" and "lone UTF-16 surrogate" in v.detail


@pytest.mark.parametrize("value", ["printf '\u001b[1mbold\u001b[0m'", "a\u0000b", "tab\there\u007f", "\u0008"])
def test_control_characters_json_carries_escaped_in_arguments_are_clean(value: str) -> None:
    """A terminal colour or a NUL in a tool's input travels as a JSON escape: what a correct server
    sends. The same character raw in content is still garbled."""
    ctx = turn("Running it.", calls=[("run_shell", {"command": value})])
    assert "\\" in ctx.response.tool_calls[0].arguments  # sent escaped
    assert check_garbled_text(ctx) == []
    assert [v.code for v in check_garbled_text(turn(value.replace("\t", "")))] == ["garbled_text"]
