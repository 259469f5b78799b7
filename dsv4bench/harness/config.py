"""The one config object of a run, built from CLI flags in one place and validated here.

Each default and each check is written once: the session's settings in session.SessionConfig,
the turn deadlines in client.Deadlines, the rest here; the `agents` flags read their defaults
from RunConfig."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dsv4bench.agents import FAMILIES
from dsv4bench.errors import UsageError
from dsv4bench.wire.turn_answer import Deadlines
from dsv4bench.history.redact import MASK, KeyScope, Redactor, redact_command
from dsv4bench.harness.context_profile import DEFAULT as CONTEXT_DEFAULT
from dsv4bench.harness.context_profile import ContextProfile, ContextProfileError, parse_context
from dsv4bench.harness.request_mix import RequestMix, RequestMixError
from dsv4bench.harness.session import SessionConfig, SessionConfigError
from dsv4bench.report.slo import SloError, SloTargets

FAIL_ON_CHOICES = ("corruption", "errors", "wedge")
MAX_TEMPERATURE = 2.0  # OpenAI's range, and what SGLang and the bundled engine accept
TRIAGE_AUTO_LIMIT = 12  # findings triaged by `--triage auto` (harness/triage.py)
TRIAGE_MAX = 1000  # the most `--triage N` takes


class ConfigError(UsageError, ValueError):
    """A flag value that cannot work; the CLI prints it as one line."""


def triage_limit(text: str) -> int:
    """`--triage`: `off` -> 0, `auto` -> TRIAGE_AUTO_LIMIT, `N` -> N (1..TRIAGE_MAX): how many findings to triage."""
    value = text.strip().lower()
    if value == "off":
        return 0
    if value == "auto":
        return TRIAGE_AUTO_LIMIT
    if value.isdigit() and 1 <= int(value) <= TRIAGE_MAX:
        return int(value)
    raise ConfigError(f"--triage takes off, auto or a number of findings from 1 to {TRIAGE_MAX}; got {text!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything `dsv4bench agents` needs to drive a run."""

    url: str  # OpenAI-compatible base URL, ending in /v1
    concurrency: int = 8
    rate: float | None = None  # sessions/s (open model); None = closed pool of `concurrency`
    sessions: int | None = None
    duration: float | None = None
    # Turns per session; None: the context profile's (context_profile.py), else SessionConfig's.
    max_turns: int | None = None
    context: str = CONTEXT_DEFAULT  # --context: a profile of context_profile.py, or P50[,P95]
    # --cache-pressure X: the run sized so that its sessions' working set is X times the server's
    # KV pool (cache_plan.py); the pool read from the server, or --kv-pool-tokens where it says none.
    cache_pressure: float | None = None
    kv_pool_tokens: int | None = None
    scenario: str = "mixed"
    seed: int = 0
    thinking: bool = SessionConfig.thinking
    request_mix: str | None = None  # a request_mix.py spec: each turn's tool_choice, thinking... drawn
    stream: bool = SessionConfig.stream
    max_tokens: int = SessionConfig.max_tokens
    # The server's context in tokens; None: what the server reports (/v1/models, /get_model_info).
    context_length: int | None = None
    temperature: float = SessionConfig.temperature
    ttft_timeout: float = Deadlines.ttft_s
    total_timeout: float = Deadlines.total_s
    on_corrupt: str = SessionConfig.on_corrupt
    raw: bool = False
    family: str = "auto"  # the model family whose markup is checked (dsv4bench.families.family_flag)
    model: str | None = None  # None: the first id of /v1/models
    api_key: str | None = None
    out: Path = Path("runs")
    fail_on: tuple[str, ...] = ()
    quiet: bool = False
    metrics: tuple[str, ...] = ()  # Prometheus /metrics URLs scraped during the run
    metrics_interval: float = 1.0
    kill: tuple[str, ...] = ()  # nemesis specs (dsv4bench.harness.nemesis), parsed here so bad ones fail early
    drain_timeout: float = 30.0  # seconds to watch the queues drain after the load stops
    canary_timeout: float = 10.0  # the post-drain canary's deadline
    serve_metrics: int | None = None  # port of the harness's own /metrics
    recover_cmd: str | None = None  # run when a wedge is found; time to healthy is measured
    # Fresh sessions replayed alone after the load when it found corruption (persistence.py); 0: off.
    persist_sessions: int = 3
    reference: Path | None = None  # a run whose answers this one's greedy turns must repeat (reference_run.py)
    triage: str = "auto"  # findings sent again alone after the load: off, auto or N (triage.py)
    recheck: float = 0.0  # share of greedy turns sent again alone after the load (recheck.py); 0: off
    recheck_keep_cache: bool = False  # --recheck over the cache the load left (no flush first: alone.py)
    # --recheck's screen: kept requests in flight at once (recheck.py says why; 1: each alone).
    # Why 8: a few sequences decode in about the time of one, and more would let the recheck's
    # own requests push prefixes out of a small device pool, where a cache race fires again.
    recheck_group: int = 8
    slo: str | None = None  # latency targets (report/slo.py): each turn judged, goodput reported
    # The servers the API key may go to: the URLs the user named (--url, --metrics as given), and
    # with key_to_workers the servers found behind a router too. Empty: the run's url and metrics.
    key_hosts: tuple[str, ...] = ()
    key_to_workers: bool = False

    def __post_init__(self) -> None:
        check_http_url("--url", self.url)
        for f in dataclasses.fields(self):  # typer reads "nan" and "inf" as floats
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{flag_of(f.name)} must be a finite number, got {value}")
        if self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError("--rate must be positive")
        if self.sessions is not None and self.sessions < 1:
            raise ConfigError("--sessions must be at least 1")
        if self.duration is not None and self.duration <= 0:
            raise ConfigError("--duration must be positive")
        if self.sessions is None and self.duration is None:
            # One whole session per slot: the run ends when each slot has played its session.
            object.__setattr__(self, "sessions", self.concurrency)
        try:  # the session's own settings: checked where they are defined
            self.session_config(model="")
        except SessionConfigError as e:
            raise ConfigError(f"{flag_of(e.field)} {e.problem}") from None
        except RequestMixError as e:
            raise ConfigError(f"--request-mix {self.request_mix!r} {e}") from None
        except ContextProfileError as e:
            raise ConfigError(str(e)) from None
        if self.cache_pressure is not None and self.cache_pressure <= 0:
            raise ConfigError(f"--cache-pressure must be a positive number, got {self.cache_pressure:g}")
        if self.kv_pool_tokens is not None and self.kv_pool_tokens < 1:
            raise ConfigError(f"--kv-pool-tokens must be at least 1, got {self.kv_pool_tokens}")
        if self.context_length is not None and self.context_length <= self.max_tokens:
            raise ConfigError(f"--context-length must be more than --max-tokens ({self.max_tokens})")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ConfigError(f"--temperature must be between 0 and {MAX_TEMPERATURE:g}, got {self.temperature:g}")
        if self.ttft_timeout <= 0 or self.total_timeout <= 0:
            raise ConfigError("timeouts must be positive")
        if self.metrics_interval <= 0:
            raise ConfigError("--metrics-interval must be positive")
        for m in self.metrics:
            check_http_url("--metrics", m)
        if self.serve_metrics is not None and not 0 <= self.serve_metrics <= 65535:
            raise ConfigError(f"--serve-metrics must be a port number (0-65535), got {self.serve_metrics}")
        if self.canary_timeout <= 0:
            raise ConfigError("--canary-timeout must be positive")
        if self.persist_sessions < 0:
            raise ConfigError("--persist-sessions must be zero (off) or more")
        if self.drain_timeout < 0:
            raise ConfigError("--drain-timeout must be zero or positive")
        from dsv4bench.harness.nemesis import parse_kill_spec

        for spec in self.kill:
            try:
                parse_kill_spec(spec)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        from dsv4bench.families import family_flag

        try:
            object.__setattr__(self, "family", family_flag(self.family))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.slo is not None:
            try:  # run.json records it written back whole: ttft=2s,itl=100ms
                object.__setattr__(self, "slo", SloTargets.parse(self.slo).spec)
            except SloError as e:
                raise ConfigError(str(e)) from None
        triage_limit(self.triage)
        if not 0.0 <= self.recheck <= 1.0:
            raise ConfigError(f"--recheck takes a share of the greedy turns, from 0 (off) to 1; got {self.recheck:g}")
        if not 1 <= self.recheck_group <= 64:
            raise ConfigError(
                f"--recheck-group takes the requests in flight at once, 1 to 64; got {self.recheck_group}"
            )
        if self.recheck > 0 and self.temperature != 0:
            raise ConfigError("--recheck compares greedy answers: it needs --temperature 0")
        if self.reference is not None and self.temperature != 0:
            raise ConfigError("--reference compares greedy answers: it needs --temperature 0")
        bad = [f for f in self.fail_on if f not in FAIL_ON_CHOICES]
        if bad:
            raise ConfigError(f"--fail-on takes {', '.join(FAIL_ON_CHOICES)}; got {', '.join(bad)}")
        if self.scenario != "mixed" and self.scenario not in FAMILIES:
            raise ConfigError(f"--scenario must be one of {', '.join([*FAMILIES, 'mixed'])}; got {self.scenario!r}")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def session_config(self, model: str, context_tokens: int | None = None, cache_tiers: bool = False) -> SessionConfig:
        """How this run's sessions talk to `model` in a context of `context_tokens` (None: unknown);
        `cache_tiers`: ask the server where each turn's cached tokens came from (SGLang's kinds)."""
        return SessionConfig(
            model=model,
            max_turns=self.turns_per_session,
            thinking=self.thinking,
            stream=self.stream,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            on_corrupt=self.on_corrupt,
            context_tokens=context_tokens,
            request_mix=RequestMix.parse(self.request_mix) if self.request_mix is not None else None,
            context_profile=self.context_profile,
            cache_tiers=cache_tiers,
        )

    @property
    def context_profile(self) -> ContextProfile:
        """--context, read."""
        return parse_context(self.context)

    @property
    def turns_per_session(self) -> int:
        """--max-turns, or the context profile's turns, or the session's default."""
        if self.max_turns is not None:
            return self.max_turns
        return self.context_profile.max_turns or SessionConfig.max_turns

    @property
    def slo_targets(self) -> SloTargets | None:
        """--slo's targets, read; None where none were given."""
        return SloTargets.parse(self.slo) if self.slo is not None else None

    @property
    def deadlines(self) -> Deadlines:
        return Deadlines(ttft_s=self.ttft_timeout, total_s=self.total_timeout)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["out"] = str(self.out)
        d["reference"] = str(self.reference) if self.reference is not None else None
        d["fail_on"] = list(self.fail_on)
        d["metrics"] = list(self.metrics)
        d["kill"] = list(self.kill)
        if d.get("api_key"):
            d["api_key"] = MASK
        if d.get("recover_cmd"):
            d["recover_cmd"] = redact_command(d["recover_cmd"])
        return d

    def key_scope(self) -> KeyScope:
        """A new record of where this run's key may go (redact.KeyScope)."""
        return KeyScope(self.api_key, self.key_hosts or (self.url, *self.metrics), self.key_to_workers)

    @property
    def redactor(self) -> Redactor:
        """Scrubs this run's secrets from every file it writes (the history writer applies it)."""
        return Redactor([self.api_key])


def flag_of(field: str) -> str:
    """The flag of a config field: max_turns -> --max-turns."""
    return f"--{field.replace('_', '-')}"


def check_http_url(flag: str, url: str) -> None:
    """An http(s) URL with a host that httpx can parse, or a ConfigError naming `flag`."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{flag} must be an http(s) URL (http://HOST:PORT/...), got {url!r}")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:
        raise ConfigError(f"{flag} {url!r} is not a valid URL: {e}") from None
    if not parsed.host:
        raise ConfigError(f"{flag} {url!r} names no host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ConfigError(f"{flag} {url!r}: port {parsed.port} is not a port number (1-65535)")


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """A folder the run can write in (created if missing), or a ConfigError naming `flag`:
    checked before anything starts, so a bad --out never costs a run."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dsv4bench-write-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None


def parse_fail_on(text: str | None) -> tuple[str, ...]:
    """`corruption,errors` -> ("corruption", "errors"). ConfigError for a --fail-on that names
    nothing (`--fail-on "$UNSET"` in a CI script): it would gate on nothing, silently."""
    if text is None:
        return ()
    codes = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    if not codes:
        raise ConfigError(f"--fail-on names no condition (got {text!r}); see --help for the ones it takes")
    return codes
