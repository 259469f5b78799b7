"""The server a load command drives, for `agents` and `locust` alike: the one at --url, or the
bundled engine started on loopback when none is given; its facts (models, context, the
deployment found from its root) and the /metrics endpoints whose queues the run watches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4bench.terminal import markup_safe

from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.servers.discovery import Deployment, discover_sync
from dsv4bench.servers.preflight import ServerError, root_of, server_facts
from dsv4bench.cli.common import err, fail
from dsv4bench.cli.engine import check_faults

if TYPE_CHECKING:  # the engine is an extra: imported where it starts
    from dsv4bench.engine.launcher import EngineProcess

ENGINE_ROUTERS = ("bundled", "sglang")  # what may front the bundled engine (--engine-router)

BUNDLED_PLACEHOLDER_URL = "http://127.0.0.1/v1"  # replaced by the bundled engine's URL once it runs


def engine_args(
    url_given: bool,
    engine_arg: list[str],
    engine_fault: list[str],
    engine_pd: bool,
    engine_router: str,
    url_flag: str = "--url",
) -> list[str]:
    """The bundled engine's flags from the --engine-* options; ConfigError when they cannot apply
    (`url_flag`: what the command calls its server's URL)."""
    if (engine_fault or engine_pd or engine_router != "bundled") and url_given:
        raise ConfigError(
            f"--engine-fault, --engine-pd and --engine-router are for the bundled engine; not with {url_flag}"
        )
    if engine_router not in ENGINE_ROUTERS:
        raise ConfigError(f"--engine-router must be one of {', '.join(ENGINE_ROUTERS)}, not {engine_router!r}")
    args = [*engine_arg, *(f"--fault={name}" for name in check_faults(engine_fault))]
    if engine_pd and "--pd" not in args:
        args.append("--pd")
    return args


@dataclass
class Target:
    """The run's server: its config (URL and metrics resolved), its facts, and the bundled
    engine when this command started one (stop() stops it)."""

    config: RunConfig
    facts: dict[str, Any]
    bundled: Any = None  # launcher.EngineProcess

    def stop(self) -> None:
        if self.bundled is not None:
            self.bundled.stop()


def open_target(config: RunConfig, url_given: bool, engine_args: list[str], engine_router: str, quiet: bool) -> Target:
    """Start the bundled engine when no --url was given, then read the server's facts and find
    its deployment. Exits with one line on any failure (the engine stopped first)."""
    bundled = None
    if not url_given:
        bundled = _start_bundled_engine(engine_args, engine_router, quiet)
        config = dataclasses.replace(config, url=bundled.url, metrics=(*config.metrics, *bundled.metrics_urls))
    try:
        try:
            facts = server_facts(config.base_url, config.api_key)
        except ServerError as e:
            raise fail(str(e))
        deployment = discover_sync([root_of(config.base_url)], config.api_key, scope=config.key_scope())
        facts["deployment"] = deployment.as_dict()
        if not quiet:
            for line in deployment.describe():
                err.print(markup_safe(line), highlight=False, soft_wrap=True)
        if bundled is not None:
            facts["bundled_engine"] = {"metrics": bundled.metrics_url, "log": str(bundled.log_path)}
            if engine_router == "sglang":  # the run's server is the router; the engine's processes behind it
                facts["bundled_engine"]["sglang_router"] = {"url": bundled.url, "metrics": bundled.metrics_url}
        elif not config.metrics:
            config = dataclasses.replace(config, metrics=_found_metrics(deployment, facts, quiet))
    except BaseException:
        if bundled is not None:
            bundled.stop()
        raise
    return Target(config, facts, bundled)


def _found_metrics(deployment: Deployment, facts: dict, quiet: bool) -> tuple[str, ...]:
    """No --metrics: the /metrics of every server found (the target, and the workers its router
    lists), said on stderr; a router's own alone cannot show a wedge, and is said so."""
    urls = tuple(deployment.metrics_urls) or ((facts["metrics_url"],) if facts.get("metrics_url") else ())
    target = deployment.endpoints[0] if deployment.endpoints else None
    workers = [e for e in deployment.found if e.metrics_url]
    if quiet:
        return urls
    if workers:
        listed = ", ".join(f"{e.role} {e.metrics_url}" for e in workers)
        err.print(
            markup_safe(
                f"found {len(workers)} server{'s' if len(workers) != 1 else ''} behind the router at "
                f"{target.root if target else '?'} (its /workers): {listed}: their queues are watched for a "
                "wedge after the load (--metrics URL to choose the endpoints)"
            ),
            highlight=False,
            soft_wrap=True,
        )
    elif target is not None and target.role == "router":
        what = f"found {urls[0]}, a router's" if urls else f"{target.root} is a router and serves no engine /metrics"
        err.print(
            markup_safe(
                f"{what}: its workers' queues are not in it, so the wedge is not checked; give "
                "--metrics for each prefill and decode server"
            ),
            highlight=False,
            soft_wrap=True,
        )
    elif urls:
        err.print(
            markup_safe(
                f"found {urls[0]}: its queues are watched for a wedge after the load "
                "(--metrics URL to choose the endpoints: router, prefill, decode)"
            ),
            highlight=False,
            soft_wrap=True,
        )
    return urls


def _start_bundled_engine(engine_args: list[str], router: str, quiet: bool) -> EngineProcess:
    """No --url: start DSV4-mini on a free loopback port for this run (behind SGLang's router
    with `router` "sglang")."""
    from dsv4bench.engine import sglang_router
    from dsv4bench.engine.launcher import EngineStartError, start_engine

    if router == "sglang" and not sglang_router.installed():  # before the engine's minute of loading
        raise fail(sglang_router.MISSING)
    if not quiet:
        behind = " behind SGLang's router" if router == "sglang" else ""
        err.print(f"no --url given: starting the bundled DSV4-mini engine{behind} on loopback ...", highlight=False)
    try:
        return start_engine([*engine_args, "--router", "sglang"] if router == "sglang" else engine_args)
    except EngineStartError as e:
        raise fail(str(e))
