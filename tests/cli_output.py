"""What a CLI test asserts of a command that must refuse its input: exit 2 with one line on
stderr, no traceback (the project's rule for bad input anywhere)."""

from __future__ import annotations

from typer.testing import CliRunner

from dsv4bench.cli import app


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=True)


def assert_one_line_exit_2(result, needle: str) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:") and needle in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr
