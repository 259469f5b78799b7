"""Secrets never reach a file a run writes: the API key, Authorization headers, and secret-named
environment assignments in a `--recover-cmd` are replaced before anything is written.

Three layers: the command line is rewritten by flag (`--api-key VALUE` becomes
`--api-key "$DSV4BENCH_API_KEY"`, so the reproduce line still runs where that variable is set);
text the user wrote for the run (`--recover-cmd`, its output) loses anything shaped like a
credential (`Bearer ...`, `Authorization: ...`, `TOKEN=...`); and every string written to the
run folder is scrubbed of the known secret values, whatever carried them there (a server that
echoes the Authorization header in an error, say).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence

MASK = "***"
API_KEY_ENV = "DSV4BENCH_API_KEY"  # agents --api-key's environment variable
ENGINE_API_KEY_ENV = "DSV4BENCH_ENGINE_API_KEY"  # engine serve --api-key's

# Flags whose value is a secret, and the environment variable a reproduce line names instead.
_SECRET_FLAGS = {"--api-key": API_KEY_ENV}
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "auth")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|x-api-key|api-key)(\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|\S+)")
_SECRET_ASSIGN = re.compile(
    r"(?i)\b([A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S+)")
_MIN_SECRET_LEN = 4  # shorter "secrets" would mask ordinary text everywhere


def _is_secret_flag(flag: str) -> bool:
    name = flag.lstrip("-").lower()
    return flag in _SECRET_FLAGS or any(word in name for word in _SECRET_WORDS)


def _env_ref(flag: str, top_level: bool) -> str:
    env = _SECRET_FLAGS.get(flag) if top_level else None
    return f"${env}" if env else MASK


_URL_USERINFO = re.compile(r"(?i)\b(https?://)[^/@\s:]+:[^/@\s]+@")


def _plain(arg: str) -> str:
    return _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", redact_credentials(arg))


def redact_argv(argv: Sequence[str], top_level: bool = True) -> list[str]:
    """The command line with every secret flag's value replaced: `--api-key X`, `--api-key=X`,
    flags passed through to the bundled engine (`--engine-arg=--api-key=X`), a password in a
    URL, credentials inside a `--recover-cmd`. Top-level `--api-key` values become the
    environment variable the CLI also reads them from, so the line still runs."""
    out: list[str] = []
    hide_next: str | None = None
    for arg in argv:
        if hide_next is not None:
            out.append(_env_ref(hide_next, top_level))
            hide_next = None
            continue
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            if _is_secret_flag(flag):
                out.append(f"{flag}={_env_ref(flag, top_level)}")
            elif value.startswith("--"):  # a pass-through flag such as --engine-arg=--api-key=X
                out.append(f"{flag}={redact_argv([value], top_level=False)[0]}")
            else:
                out.append(f"{flag}={redact_command(value)}")
            continue
        if arg.startswith("--") and _is_secret_flag(arg):
            hide_next = arg
            out.append(arg)
        else:
            out.append(redact_command(arg) if " " in arg else _plain(arg))
    return out


def redact_command(cmd: str) -> str:
    """A shell command (a --recover-cmd) with its secret flags and credentials masked."""
    cmd = _plain(cmd)
    try:
        words = shlex.split(cmd)
    except ValueError:  # unbalanced quotes: masked by pattern only
        return cmd
    if len(words) <= 1 or not any(w.startswith("--") and _is_secret_flag(w.split("=", 1)[0]) for w in words):
        return cmd
    return shlex.join(redact_argv(words, top_level=False))


def shell_line(argv: Sequence[str]) -> str:
    """A shell command line of `argv` (already redacted) in which `$VAR` references stay
    unquoted variable expansions, so the line can be pasted as it is."""
    parts = []
    for arg in argv:
        head, sep, tail = arg.partition("=")
        if arg.startswith("$") and arg[1:].isidentifier():
            parts.append(f'"{arg}"')
        elif sep and tail.startswith("$") and tail[1:].isidentifier():
            parts.append(f'{shlex.quote(head + "=")}"{tail}"')
        else:
            parts.append(shlex.quote(arg))
    return " ".join(parts)


def redact_credentials(s: str) -> str:
    """`s` with credential-shaped text masked: `Bearer X`, `Authorization: X`, `API_TOKEN=X`.
    For text a user wrote (a --recover-cmd, its output), not for the server's answers, where
    such patterns are ordinary prose and must be recorded as they came."""
    s = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", s)
    s = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", s)
    return _SECRET_ASSIGN.sub(lambda m: f"{m.group(1)}={MASK}", s)


class Redactor:
    """Scrubs the run's known secret values out of JSON text, keys included (the history writer
    applies it to every record, so nothing a run writes holds them)."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}
        self.secrets = sorted(values, key=len, reverse=True)  # longest first: no partial leftovers

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def json_text(self, s: str) -> str:
        """JSON text `s` with each secret masked as it is spelled inside a JSON string, in
        either escaping (`ensure_ascii` or not)."""
        for secret in self.secrets:
            for spelled in {json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}:
                if spelled in s:
                    s = s.replace(spelled, MASK)
        return s
