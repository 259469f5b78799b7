"""What a run watches of the servers, apart from the agents' own turns: Prometheus samples and
/health polls during the load, the drain window after it, and the final checks (each server
by its role: /health, /health_generate, a canary). run.py hands what it saw to the wedge
detector; nothing here judges.

Also the --raw oracle's second request of a turn: the same conversation as a raw completion.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio
import anyio.abc
import httpx

from dsv4bench.servers.canary import CanaryResult, HealthResult, check_canary, check_health
from dsv4bench.harness.config import RunConfig
from dsv4bench.servers.dialect import is_queue_gauge
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.servers.monitor import MetricSample, monitor, scrape_once
from dsv4bench.servers.preflight import root_of
from dsv4bench.servers.roles import WORKERS, Role, discover_role
from dsv4bench.terminal import visible
from dsv4bench.checks.oracle import NOT_OFFERED_EVENT

# The event that records which hosts the API key went to (redact.KeyScope.as_dict), for the report.
KEY_HOSTS_EVENT = "api_key_hosts"


class ServerWatch:
    """The run's view of its servers: every metrics sample, /health answer and canary, and
    when the load stopped (the drain window's start). Each is written to the history, as its
    record (`as_dict()`), as it comes."""

    def __init__(self, config: RunConfig, model: str, history: HistoryWriter) -> None:
        self.config = config
        self.model = model
        self.history = history
        self.samples: list[MetricSample] = []  # every metrics sample of the run, for the wedge check
        self._latest: dict[str, MetricSample] = {}  # endpoint -> its latest sample
        self.load_stopped_ns: int | None = None  # monotonic ns when the load stopped (drain start)
        self.health: list[HealthResult] = []  # /health during the run and after the drain window
        self.canaries: list[CanaryResult] = []
        self._roles: dict[str, Role] = {}  # server root -> its role, as it stated it
        # Where the key may go: `client` carries it, so a server found behind a router and not
        # named is asked through a client without it (redact.KeyScope).
        self.key_scope = config.key_scope()
        self.key_scope.allows(config.base_url)  # every turn goes there with it

    def latest(self) -> dict[str, MetricSample]:
        """Each endpoint's latest sample."""
        return dict(self._latest)

    def know_roles(self, roles: dict[str, Role]) -> None:
        """Roles already found (discovery.py: a worker the router lists keeps the role it is
        listed with even when it states none itself), so they are not asked again."""
        self._roles.update({root: role for root, role in roles.items() if role.known})

    def start(self, tg: anyio.abc.TaskGroup, client: httpx.AsyncClient) -> None:
        """With --metrics: scrape every endpoint and poll every server's /health, in `tg`,
        until it is cancelled."""
        c = self.config
        if c.metrics:
            tg.start_soon(
                monitor, list(c.metrics), self._write_sample, c.metrics_interval, None, c.api_key, self.key_scope
            )
            tg.start_soon(self._poll_health, client)

    async def drain(self) -> None:
        """The load has stopped: with --metrics, keep the monitors scraping up to drain_timeout,
        or until every queue is empty."""
        self.load_stopped_ns = time.monotonic_ns()
        if not self.config.metrics:
            self.history.event("load_stopped", t_ns=self.load_stopped_ns, drain_timeout_s=0)
            return
        self.history.event("load_stopped", t_ns=self.load_stopped_ns, drain_timeout_s=self.config.drain_timeout)
        deadline = anyio.current_time() + self.config.drain_timeout
        reason = "timeout"
        while (left := deadline - anyio.current_time()) > 0:
            await anyio.sleep(min(left, self.config.metrics_interval / 2))
            if self._queues_empty():
                reason = "queues_empty"
                break
        drain_s = (time.monotonic_ns() - self.load_stopped_ns) / 1e9
        self.history.event("drain_end", reason=reason, drain_s=round(drain_s, 3))

    async def final_checks(self, client: httpx.AsyncClient) -> None:
        """After the drain window, each server judged by its role: /health of every server,
        /health_generate of a prefill or decode server (they take no chat), and one canary
        against the target unless it is one of those, sent not streamed and streamed. A canary that hangs while /health says
        200 is the incident's `health_lies`; one answered with an error is an error of the
        check, recorded as such (canary.py), never a hang. Then one last sample of every
        endpoint."""
        async with httpx.AsyncClient(trust_env=False) as keyless:
            await self._final_checks(client, keyless)
        if self.config.api_key:
            self.history.event(KEY_HOSTS_EVENT, **self.key_scope.as_dict())

    def _client(self, keyed: httpx.AsyncClient, keyless: httpx.AsyncClient, url: str) -> httpx.AsyncClient:
        """The client a request to `url` goes through: the run's, with the key, only where it may go."""
        return keyed if self.key_scope.allows(url) else keyless

    async def _final_checks(self, client: httpx.AsyncClient, keyless: httpx.AsyncClient) -> None:
        roles: dict[str, Role] = {}

        async def ask(root: str) -> None:
            roles[root] = await self._role(self._client(client, keyless, root), root)

        async with anyio.create_task_group() as tg:  # a server that does not answer costs one timeout
            for root in self._server_roots():
                tg.start_soon(ask, root)
        for root in self._server_roots():
            role = roles[root]
            paths = ("/health", "/health_generate") if role.name in WORKERS else ("/health",)
            for path in paths:
                h = await check_health(self._client(client, keyless, root), root, path)
                self.health.append(h)
                self.history.event("health", **h.as_dict(), role=role.name)
        await self._canary(client, roles.get(root_of(self.config.base_url)) or Role())  # the target: named
        for ep in self.config.metrics:
            self._write_sample(await scrape_once(self._client(client, keyless, ep), ep, timeout=5.0))

    async def _canary(self, client: httpx.AsyncClient, target: Role) -> None:
        if target.name in WORKERS:
            self.history.event(
                "canary_skipped",
                endpoint=self.config.base_url,
                role=target.name,
                reason=f"the target is a {target.name} server ({target.source}): it takes no chat",
            )
            return
        # Not streamed and streamed, side by side: a server can hang in either path alone.
        done: list[CanaryResult] = []

        async def one(stream: bool) -> None:
            done.append(
                await check_canary(
                    client, self.config.base_url, self.model, timeout=self.config.canary_timeout, stream=stream
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, False)
            tg.start_soon(one, True)
        for c in sorted(done, key=lambda c: c.stream):
            self.canaries.append(c)
            self.history.event("canary", **c.as_dict(), role=target.name)

    def _write_sample(self, sample: MetricSample) -> None:
        self.history.metrics.write(sample.as_dict())
        self.samples.append(sample)
        self._latest[sample.endpoint] = sample

    def _queues_empty(self) -> bool:
        """Every endpoint's latest sample (taken after the load stopped) has all queue gauges at 0."""
        for ep in self.config.metrics:
            s = self._latest.get(ep)
            if s is None or not s.ok or s.t_ns < (self.load_stopped_ns or 0):
                return False
            if any(v != 0 for k, v in (s.values or {}).items() if is_queue_gauge(k)):
                return False
        return True

    def _server_roots(self) -> list[str]:
        """The root of every server the run touches: the target's and each /metrics endpoint's."""
        return sorted(
            {root_of(self.config.base_url)} | {root_of(m.rsplit("/metrics", 1)[0]) for m in self.config.metrics}
        )

    async def _role(self, client: httpx.AsyncClient, root: str) -> Role:
        """The server's role, asked once and kept; its latest scrape fills in where it states none."""
        role = self._roles.get(root)
        if role is None or not role.known:
            scraped = next(
                (s.values for m, s in self._latest.items() if root_of(m.rsplit("/metrics", 1)[0]) == root and s.ok),
                None,
            )
            role = await discover_role(client, root, timeout=5.0, metrics=scraped)
            self._roles[root] = role
        return role

    async def _poll_health(self, client: httpx.AsyncClient) -> None:
        """/health of every server on the metrics interval, as events: a slow or dead endpoint
        is a sample with status None, never an error of the run."""
        async with httpx.AsyncClient(trust_env=False) as keyless:
            while True:
                for root in self._server_roots():
                    h = await check_health(
                        self._client(client, keyless, root), root, timeout=max(1.0, self.config.metrics_interval)
                    )
                    self.health.append(h)
                    self.history.event("health", **h.as_dict())
                await anyio.sleep(self.config.metrics_interval)


# Servers that cannot render a conversation (no /tokenize with `messages`): asked once a process.
_NO_RENDERER: set[str] = set()


class RawNotOffered:
    """Says that the raw oracle is not offered for a family on a server, once per server and
    family: a line on stderr and, given the run's history, a NOT_OFFERED_EVENT event, which the
    report lists, so that a run's record says why its turns of that family have no raw reading."""

    def __init__(self, history: HistoryWriter | None = None) -> None:
        self.history = history
        self._said: set[tuple[str, str]] = set()

    def __call__(self, base_url: str, family: str) -> None:
        if (base_url, family) in self._said:
            return
        self._said.add((base_url, family))
        print(
            f"--raw: the raw oracle is not offered for {visible(family)} models on {visible(base_url)}: it renders "
            "DeepSeek-V4 prompts itself, and this server has no /tokenize to render others; "
            "the run goes on without it",
            file=sys.stderr,
        )
        if self.history is not None:
            self.history.event(NOT_OFFERED_EVENT, family=family, server=base_url, reason="no /tokenize")


# For callers that keep no history: said once a process.
_SAY_ONCE = RawNotOffered()


async def _server_prompt(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any], headers: dict[str, str], timeout: float
) -> list[int] | None:
    """The server's own rendering of the conversation, as token ids: vLLM's and SGLang's POST
    /tokenize with `messages` applies the server's chat template (what the chat request got);
    None where the server offers no such endpoint."""
    if base_url in _NO_RENDERER:
        return None
    asked = {
        k: body[k]
        for k in ("model", "messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort")
        if body.get(k) is not None
    }
    resp = await client.post(f"{root_of(base_url)}/tokenize", json=asked, headers=headers, timeout=timeout)
    try:
        tokens = resp.json().get("tokens") if resp.status_code < 400 else None
    except (ValueError, AttributeError):  # a 200 page that is no JSON object: no renderer either
        tokens = None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens):
        return tokens
    _NO_RENDERER.add(base_url)
    return None


async def raw_completion(
    client: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout: float,
    not_offered: RawNotOffered | None = None,
) -> str | None:
    """The --raw oracle: the conversation of chat request `body` as a raw prompt to /v1/completions,
    or None where the server gives no usable answer (the chat turn is still judged).

    The prompt: deepseek-recipe's for a DeepSeek-V4 model; else the server's own rendering
    (`_server_prompt`); else, for a model of no known family, deepseek-recipe's as before. A model
    of another family on a server that cannot render is not offered the oracle: said once by
    `not_offered` (a run's says it on stderr and in its history; without one, said once a
    process on stderr), and the run goes on without it."""
    from dsv4bench.checks.recipe_reader import render_prompt
    from dsv4bench.families import family_of_model

    try:
        family = family_of_model(body.get("model"))
        prompt: str | list[int] | None = render_prompt(body) if family == "deepseek-v4" else None
        if prompt is None:
            prompt = await _server_prompt(client, base_url, body, headers, timeout)
            if prompt is None and family is not None:
                (not_offered or _SAY_ONCE)(base_url, family)
                return None
            prompt = render_prompt(body) if prompt is None else prompt
        resp = await client.post(
            f"{base_url}/completions",
            # Special tokens must survive: the oracle parses </think> and each family's markers itself.
            json={
                "model": body["model"],
                "prompt": prompt,
                "max_tokens": body.get("max_tokens"),
                "temperature": 0.0,
                "stream": False,
                "skip_special_tokens": False,
            },
            headers=headers,
            timeout=timeout,
        )
        if resp.status_code >= 400:
            return None
        return str(resp.json()["choices"][0]["text"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
