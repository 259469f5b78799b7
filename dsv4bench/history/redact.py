"""Secrets never reach a file a run writes: the API key, Authorization headers, and secret-named
environment assignments in a `--recover-cmd` are replaced before anything is written; and the key
goes only to the servers the user named (`KeyScope`).

Three layers: the command line is rewritten by flag (`--api-key VALUE` becomes
`--api-key "$DSV4BENCH_API_KEY"`, so the reproduce line still runs where that variable is set);
text the user wrote for the run (`--recover-cmd`, its output) loses anything shaped like a
credential (`Bearer ...`, `Authorization: ...`, `TOKEN=...`); and every record written to the run
folder is masked by structure before it is serialized (`Redactor`): the fields and headers that
carry credentials, the credentials of URLs, and the known secret values inside strings (a server
that echoes the Authorization header in an error, say) where they are long enough to be told from
ordinary text. Masking never touches serialized text, so a record is the same valid JSON whatever
a secret's value.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

MASK = "***"
API_KEY_ENV = "DSV4BENCH_API_KEY"  # agents --api-key's environment variable
ENGINE_API_KEY_ENV = "DSV4BENCH_ENGINE_API_KEY"  # engine serve --api-key's

# Flags whose value is a secret, and the environment variable a reproduce line names instead.
_SECRET_FLAGS = {"--api-key": API_KEY_ENV}
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "auth")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|x-api-key|api-key)(\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|\S+)")
_SECRET_ASSIGN = re.compile(
    r"(?i)\b([A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S+)"
)


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


# Field and header names whose value is a credential, compared lower-cased with `-` as `_`: masked
# wherever they are a key of a record, whatever the value. Kept to names that carry nothing
# else: `token` alone is a logprobs entry's text and `tokens` a count, so neither is here.
_SECRET_FIELDS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "api_key",
        "apikey",
        "x_api_key",
        "api_token",
        "access_token",
        "auth_token",
        "x_auth_token",
        "refresh_token",
        "id_token",
        "client_secret",
        "password",
        "passwd",
        "cookie",
        "set_cookie",
        "hf_token",
        "engine_api_key",
    }
)
# A URL's credentials: its user:password, and query parameters that carry a key.
_URL = re.compile(r"(?i)^[a-z][a-z0-9+.-]*://\S*$")
_URL_KEY_PARAM = re.compile(r"(?i)([?&](?:api[_-]?key|key|access[_-]?token|token|auth|sig|signature|password)=)[^&#]*")
_URL_ANY_USERINFO = re.compile(r"(?i)^([a-z][a-z0-9+.-]*://)[^/@?#]*@")
# A secret is masked inside free text (a server's answer that echoes it) only when it cannot be
# mistaken for ordinary text: a key such as `true`, `ok` or `null` would otherwise rewrite every
# answer that holds the word. Such short or common keys are still masked wherever they are carried
# by structure (headers, --api-key, the config's api_key, URLs); only an echo inside free text
# keeps them.
MIN_TEXT_SECRET_LEN = 8
_COMMON_WORDS = frozenset(
    {
        "password",
        "passwords",
        "secret",
        "secrets",
        "changeme",
        "username",
        "function",
        "assistant",
        "continue",
        "response",
        "complete",
        "question",
        "thinking",
        "reasoning",
        "toolcall",
        "undefined",
        "anything",
        "nothing",
        "something",
        "everything",
        "localhost",
        "default",
        "example",
        "content",
        "message",
        "messages",
        "authorization",
        "bearertoken",
        "12345678",
        "123456789",
        "1234567890",
        "qwertyuiop",
    }
)


def is_secret_field(name: object) -> bool:
    """Whether a record key or header named `name` carries a credential."""
    return isinstance(name, str) and name.strip().lower().replace("-", "_") in _SECRET_FIELDS


def text_maskable(secret: str) -> bool:
    """Whether `secret` is masked where it appears inside free text (see MIN_TEXT_SECRET_LEN): its
    credential proper (`Bearer KEY`: the KEY) long enough and no common word."""
    word = secret.split()[-1] if secret.split() else ""
    return len(word) >= MIN_TEXT_SECRET_LEN and word.lower() not in _COMMON_WORDS


def redact_url(url: str) -> str:
    """A URL with its user:password and key-carrying query parameters masked; anything else as it is."""
    if not _URL.match(url):
        return url
    url = _URL_ANY_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", url)
    return _URL_KEY_PARAM.sub(lambda m: f"{m.group(1)}{MASK}", url)


_JSON_SCALARS = (int, float, bool, type(None))


class Redactor:
    """Masks secrets on a record before it is serialized, by structure: the value of every field
    or header that carries a credential (`is_secret_field`), the credentials of every string that
    is a URL, and the run's known secret values inside any string (values and keys) where they
    are long enough to be told from text (`text_maskable`). Never over serialized text: whatever a
    secret's value (`true`, `"`, `{`), the record stays the same JSON with only those strings masked.
    The history writer applies it to every record (`value`)."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        values = {s for s in secrets if s}
        self.secrets = sorted(values, key=len, reverse=True)  # every known secret, longest first

    def __bool__(self) -> bool:
        return bool(self.secrets)

    @property
    def in_text(self) -> list[str]:
        """The secrets masked inside free text, longest first (no partial leftovers)."""
        return [s for s in self.secrets if text_maskable(s)]

    def text(self, s: str) -> str:
        """A string with the known secrets masked (`in_text`), and a URL's credentials."""
        for secret in self.in_text:
            if secret in s:
                s = s.replace(secret, MASK)
        return redact_url(s)

    def value(self, obj: Any) -> Any:
        """A copy of `obj` with its secrets masked (see the class); objects JSON cannot hold become
        their str(), as `json.dumps(default=str)` would write them, and are masked as text.
        Raises RecursionError for a circular or too deep object, as json.dumps would."""
        secrets = self.in_text
        return _masked(obj, secrets)


def _masked(obj: Any, secrets: list[str]) -> Any:
    if isinstance(obj, str):
        return _masked_text(obj, secrets)
    if isinstance(obj, _JSON_SCALARS):
        return obj
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if is_secret_field(k) and v not in (None, "", MASK) and not isinstance(v, bool):
                v = MASK  # a credential field: the whole value goes, whatever it is
            else:
                v = _masked(v, secrets)
            key = _masked_text(k, secrets) if isinstance(k, str) else k
            while key in out:  # two keys masked to the same text: both kept, told apart
                key = f"{key}#"
            out[key] = v
        return out
    if isinstance(obj, (list, tuple)):
        return [_masked(v, secrets) for v in obj]
    return _masked_text(str(obj), secrets)


def _masked_text(s: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in s:
            s = s.replace(secret, MASK)
    return redact_url(s) if "://" in s else s


class KeyScope:
    """Which servers the API key goes to: the origins (scheme, host, port) the user named
    (`--url`, `--metrics`, the roots given to `probe`), and every other server only with
    `--key-to-workers`. A router's /workers may list any host, and one the user never named must
    not receive the key for being listed."""

    def __init__(self, api_key: str | None, named: Iterable[str], to_workers: bool = False) -> None:
        self.api_key = api_key or None
        self.named = {o for o in (origin(u) for u in named) if o}
        self.to_workers = to_workers
        self.sent: set[str] = set()  # origins the key was handed out for
        self.withheld: set[str] = set()  # origins contacted without it, the key being held back

    def allows(self, url: str) -> bool:
        """Whether a request to `url` may carry the key (noted in `sent` / `withheld`)."""
        if not self.api_key:
            return False
        o = origin(url)
        ok = bool(o) and (o in self.named or self.to_workers)
        (self.sent if ok else self.withheld).add(o or url)
        return ok

    def headers(self, url: str) -> dict[str, str]:
        """The Authorization header for a request to `url`, or none where the key does not go."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.allows(url) else {}

    def as_dict(self) -> dict[str, Any]:
        """For run.json and probe's JSON: which hosts got the key and which were probed without."""
        return {
            "key_sent_to": sorted(self.sent),
            "key_withheld_from": sorted(self.withheld - self.sent),
            "key_to_workers": self.to_workers,
        }


def origin(url: str) -> str | None:
    """scheme://host:port of an http(s) URL (the port spelled out), None for one that is not."""
    m = re.match(r"(?i)^(https?)://(?:[^/@?#]*@)?(\[[^\]]*\]|[^/:?#]*)(?::(\d*))?", url.strip())
    if not m or not m.group(2):
        return None
    scheme = m.group(1).lower()
    port = m.group(3) or ("443" if scheme == "https" else "80")
    try:
        return f"{scheme}://{m.group(2).lower()}:{int(port)}"
    except ValueError:
        return None
