"""The `dsv4bench` command line. Flags become one RunConfig here; errors become one line."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Optional

import anyio
import typer
from rich.console import Console

from . import __version__
from .config import ConfigError, RunConfig, check_http_url, check_out_dir, parse_fail_on
from .preflight import HostLimitError, ServerError, ensure_open_files, server_facts
from .redact import redact_argv, shell_line

app = typer.Typer(
    name="dsv4bench",
    help="Load-test and correctness audit for LLM servers under agentic load.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

BUNDLED_PLACEHOLDER_URL = "http://127.0.0.1/v1"  # replaced by the bundled engine's URL once it runs
VERDICT_STYLE = {"CLEAN": "bold green", "CORRUPTION": "bold red", "WEDGE": "bold magenta", "ERRORS": "bold yellow",
                 "INCOMPLETE": "bold red"}


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        out.print(f"dsv4bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Drive multi-turn tool-calling agents at an OpenAI-compatible server, check every tool
    call, record a history, and write an incident report."""


@app.command()
def agents(
    url: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1."),
    concurrency: int = typer.Option(8, help="Sessions in flight at once (closed pool; with --rate, the cap)."),
    rate: Optional[float] = typer.Option(None, help="Open model: new sessions per second, Poisson arrivals."),
    sessions: Optional[int] = typer.Option(None, help="Total sessions to run. With neither --sessions nor --duration: one whole session per --concurrency slot."),
    duration: Optional[float] = typer.Option(None, help="Seconds to keep starting turns; in-flight turns finish."),
    max_turns: int = typer.Option(12, help="Turns per session before it is cut off."),
    scenario: str = typer.Option("mixed", help="Scenario family: coding, data, ops, or mixed (round robin)."),
    seed: int = typer.Option(0, help="Run seed; the same seed replays the same tasks."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Ask for thinking mode (chat_template_kwargs)."),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Stream responses over SSE."),
    max_tokens: int = typer.Option(1024, help="max_tokens of each turn."),
    context_length: Optional[int] = typer.Option(None, help="The server's context in tokens; a session whose next turn would not fit ends there (context_full). Default: what /v1/models or /get_model_info reports."),
    temperature: float = typer.Option(0.0, help="Sampling temperature."),
    ttft_timeout: float = typer.Option(60.0, help="Seconds to the first token before a turn is timeout_ttft."),
    total_timeout: float = typer.Option(300.0, help="Seconds to the end of a turn before it is timeout_total."),
    on_corrupt: str = typer.Option("continue", help="After a corrupt turn: continue (feed back an error) or stop."),
    raw: bool = typer.Option(False, "--raw", help="Also ask /v1/completions with the deepseek-recipe prompt and compare parsers."),
    model: Optional[str] = typer.Option(None, help="Model name; default: the first id of /v1/models."),
    api_key: Optional[str] = typer.Option(None, envvar="DSV4BENCH_API_KEY", help="Bearer token for the server."),
    out_dir: Path = typer.Option(Path("runs"), "--out", help="Folder under which the run folder is created."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 on these verdicts: corruption,errors,wedge (and, with any of them, on INCOMPLETE: a history that lost records rules nothing out)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress; print the verdict line only."),
    metrics: list[str] = typer.Option([], "--metrics", help="Prometheus /metrics URL to scrape during the run (repeatable: router, prefill, decode). Default: the server's own /metrics when it serves SGLang's or vLLM's."),
    metrics_interval: float = typer.Option(1.0, help="Seconds between scrapes of each --metrics URL."),
    kill: list[str] = typer.Option([], "--kill", metavar="SPEC", help=(
        "Nemesis kill schedule, repeatable: all@30s (kill every session at t=30 s; the load stops), "
        "frac=0.25/every=10s, optionally /from=20s and /until=90s (a share of the sessions periodically); "
        "items who=all|ttft|toolcall (only sessions waiting for their first token / streaming a tool call), "
        "restart (relaunch killed sessions at once as <id>.r<N>), abort (also POST /abort_request). "
        "E.g. all@30s,restart or frac=0.5/every=10s,who=ttft. Grammar: dsv4bench/nemesis.py.")),
    drain_timeout: float = typer.Option(30.0, help="Seconds to keep scraping --metrics after the load stops, waiting for the queues to drain."),
    serve_metrics: Optional[int] = typer.Option(None, "--serve-metrics", metavar="PORT", help="Serve the harness's own Prometheus metrics on 127.0.0.1:PORT during the run (sessions, turns, verdicts by code, kills)."),
    canary_timeout: float = typer.Option(10.0, help="Deadline of the one short completion sent after the drain window."),
    recover_cmd: Optional[str] = typer.Option(None, help="Shell command to run when a wedge is found (e.g. restart the services); the time back to healthy is measured."),
    reference: Optional[Path] = typer.Option(None, "--reference", metavar="RUN", help=(
        "A run folder (or an --out folder holding one run) whose answers this run must repeat: run the same "
        "--seed and flags against a server without the suspect change (e.g. HiCache off), then again with it "
        "and --reference. A greedy turn whose request RUN also sent and that gets a different answer is "
        "reference_mismatch: wrong state the other checks cannot see (a cache or KV race). Needs --temperature 0 "
        "and a deterministic server (the bundled engine is; SGLang: --enable-deterministic-inference).")),
    engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra flag for the bundled engine (no --url), repeatable, e.g. --engine-arg=--num-pages=8192."),
    engine_fault: list[str] = typer.Option([], "--engine-fault", metavar="NAME", help="Switch on a planted fault in the bundled engine (no --url), repeatable; `dsv4bench engine faults` lists them."),
    engine_pd: bool = typer.Option(False, "--engine-pd", help="Run the bundled engine (no --url) prefill/decode disaggregated: router, prefill and decode servers, all three scraped (same as --engine-arg=--pd)."),
) -> None:
    """The main job: N multi-turn tool-calling agent sessions, every turn checked, a report written.

    With no --url, the bundled DSV4-mini engine is started on a free loopback port for the run."""
    try:
        config = RunConfig(
            url=url or BUNDLED_PLACEHOLDER_URL, concurrency=concurrency, rate=rate, sessions=sessions, duration=duration, max_turns=max_turns,
            scenario=scenario, seed=seed, thinking=thinking, stream=stream, max_tokens=max_tokens, context_length=context_length,
            temperature=temperature, ttft_timeout=ttft_timeout, total_timeout=total_timeout, on_corrupt=on_corrupt,
            raw=raw, model=model, api_key=api_key, out=out_dir, fail_on=parse_fail_on(fail_on), quiet=quiet,
            metrics=tuple(metrics), metrics_interval=metrics_interval, kill=tuple(kill), drain_timeout=drain_timeout,
            canary_timeout=canary_timeout, recover_cmd=recover_cmd, serve_metrics=serve_metrics, reference=reference,
        )
        _check_scenario(scenario)
        check_out_dir(out_dir)
        ensure_open_files(concurrency)
        if (engine_fault or engine_pd) and url is not None:
            raise ConfigError("--engine-fault and --engine-pd are for the bundled engine; not with --url")
        engine_arg = [*engine_arg, *(f"--fault={name}" for name in _check_faults(engine_fault))]
        if engine_pd and "--pd" not in engine_arg:
            engine_arg.append("--pd")
    except (ConfigError, HostLimitError) as e:
        raise fail(str(e))
    if sessions is None and duration is None and not quiet:
        err.print(f"no --sessions or --duration: one whole session per slot (--sessions {config.sessions})",
                  highlight=False)
    from .exporter import ExporterError
    from .reference import ReferenceAnswers, ReferenceError
    from .run import run_agents

    answers = None
    if reference is not None:  # read before anything starts: a bad folder fails at once
        try:
            answers = ReferenceAnswers.load(reference)
        except ReferenceError as e:
            raise fail(str(e))

    bundled = None
    if url is None:
        bundled = _start_bundled_engine(engine_arg, quiet)
        config = dataclasses.replace(config, url=bundled.url, metrics=(*config.metrics, *bundled.metrics_urls))
    try:
        try:
            facts = server_facts(config.base_url, config.api_key)
        except ServerError as e:
            raise fail(str(e))
        if bundled is not None:
            facts["bundled_engine"] = {"metrics": bundled.metrics_url, "log": str(bundled.log_path)}
        elif not config.metrics and facts.get("metrics_url"):
            config = dataclasses.replace(config, metrics=(facts["metrics_url"],))
            if not quiet and facts.get("role") == "router":
                err.print(f"found {facts['metrics_url']}, a router's: its workers' queues are not in it, so the "
                          "wedge is not checked; give --metrics for each prefill and decode server", highlight=False,
                          soft_wrap=True)
            elif not quiet:
                err.print(f"found {facts['metrics_url']}: its queues are watched for a wedge after the load "
                          "(--metrics URL to choose the endpoints: router, prefill, decode)", highlight=False, soft_wrap=True)
        try:
            summary, run_dir = run_agents(config, facts, command=_command_line(config), reference=answers)
        except ExporterError as e:
            raise fail(str(e))
    finally:
        if bundled is not None:
            bundled.stop()
    _print_verdict(summary, run_dir)
    raise typer.Exit(_exit_code(summary, config.fail_on))


def _start_bundled_engine(engine_args: list[str], quiet: bool):
    """No --url: start DSV4-mini on a free loopback port for this run."""
    from .engine.launcher import EngineStartError, start_engine

    if not quiet:
        err.print("no --url given: starting the bundled DSV4-mini engine on loopback ...", highlight=False)
    try:
        return start_engine(engine_args)
    except EngineStartError as e:
        raise fail(str(e))


@app.command()
def probe(
    urls: list[str] = typer.Argument(..., help="Server roots, e.g. http://127.0.0.1:8000 http://127.0.0.1:30000 http://127.0.0.1:30002 (router, prefill, decode)."),
    timeout: float = typer.Option(10.0, help="Seconds each check (metrics, health, canary) may take."),
    stuck_s: float = typer.Option(2.0, "--stuck-s", help="Seconds a queue holding requests is watched, when nothing hangs, for a counter to move."),
    api_key: Optional[str] = typer.Option(None, envvar="DSV4BENCH_API_KEY", help="Bearer token for the servers."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the findings as JSON here."),
) -> None:
    """One-shot wedge check of each endpoint by its role (read from the server): gauges,
    /health and /health_generate everywhere, a canary on a router or unified server.
    Exit 0 healthy, 1 wedged or unhealthy, 2 unreachable or not judged."""
    from .probe import probe_main

    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise fail(f"probe takes http(s) server roots; got {', '.join(bad)}")
    try:
        for u in urls:
            check_http_url("probe", u)
    except ConfigError as e:
        raise fail(str(e))
    if not math.isfinite(timeout) or timeout <= 0:
        raise fail("--timeout must be a positive number")
    if not math.isfinite(stuck_s) or stuck_s < 0:
        raise fail("--stuck-s must be a number of seconds, 0 or more")
    raise typer.Exit(probe_main([u.rstrip("/") for u in urls], timeout, json_out, stuck_s, api_key))


@app.command()
def watch(
    metrics_url: list[str] = typer.Argument(..., help="Prometheus /metrics URLs (router, prefill, decode)."),
    duration: float = typer.Option(60.0, help="Seconds to watch, then exit."),
    interval: float = typer.Option(1.0, help="Seconds between scrapes."),
    stuck_s: float = typer.Option(5.0, "--stuck-s", help="Seconds a queue must stay above 0 with no counter moving to be marked."),
    api_key: Optional[str] = typer.Option(None, envvar="DSV4BENCH_API_KEY", help="Bearer token for the servers."),
) -> None:
    """Live view per endpoint and role: its gauges with current values and sparklines, its
    state in words; marks a wedge as it forms. Exit 1 wedge, 0 healthy, 2 unreachable."""
    from .watch import watch_main

    bad = [u for u in metrics_url if not u.startswith(("http://", "https://"))]
    if bad:
        raise fail(f"watch takes http(s) /metrics URLs; got {', '.join(bad)}")
    try:
        for u in metrics_url:
            check_http_url("watch", u)
    except ConfigError as e:
        raise fail(str(e))
    if not all(math.isfinite(x) and x > 0 for x in (duration, interval, stuck_s)):
        raise fail("--duration, --interval and --stuck-s must be positive numbers")
    raise typer.Exit(anyio.run(watch_main, list(metrics_url), duration, interval, stuck_s, err, api_key))


engine_app = typer.Typer(help="The bundled DSV4-mini engine.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


@engine_app.command("serve")
def engine_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback by default."),
    port: Optional[int] = typer.Option(None, help="Port to serve on: 30000; with --pd the router's port, 8000."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    max_running_requests: int = typer.Option(128, help="Requests decoding at once."),
    num_pages: int = typer.Option(32768, help="KV pages in the pool (each page holds --page-size tokens)."),
    page_size: int = typer.Option(32, help="Tokens per page; a multiple of the HCA compression rate."),
    chunked_prefill_tokens: int = typer.Option(2048, help="Prefill tokens per step across requests."),
    index_k_dtype: str = typer.Option("fp8", help="Index-K cache storage: fp8 (e4m3 + per-entry scale) or bf16."),
    no_prefix_cache: bool = typer.Option(False, "--no-prefix-cache", help="Disable the radix prefix cache."),
    model_name: str = typer.Option("dsv4-mini", help="Model name served by /v1/models."),
    api_key: Optional[str] = typer.Option(None, envvar="DSV4BENCH_ENGINE_API_KEY", help="Require this Bearer token."),
    weights: Optional[Path] = typer.Option(None, help="Weights file (safetensors); default: the shipped DSV4-mini weights."),
    random_weights: bool = typer.Option(False, "--random-weights", help="Serve an untrained, seeded random initialisation."),
    seed: int = typer.Option(0, help="Seed of the random weight initialisation (--random-weights)."),
    log_level: str = typer.Option("warning", help="debug, info, warning or error."),
    fault: list[str] = typer.Option([], "--fault", metavar="NAME", help="Switch on a planted bug mechanism, repeatable; off by default. `dsv4bench engine faults` lists them."),
    hicache: bool = typer.Option(False, "--hicache", help="HiCache host tier: evicted prefix pages are backed up to host memory and loaded back layer by layer, readers gated per layer."),
    hicache_host_pages: int = typer.Option(0, help="Host-tier capacity in pages (--hicache); 0 = twice --num-pages."),
    hicache_load_gbps: float = typer.Option(0.25, help="Modelled host-to-device bandwidth of --hicache loads, GB/s: a layer of a load lands after its bytes would have crossed the link."),
    pd: bool = typer.Option(False, "--pd", help="Prefill/decode disaggregation: a router (OpenAI API, on --port), a prefill and a decode server, each with its own /health and /metrics, and a KV transfer between their pools."),
    prefill_port: Optional[int] = typer.Option(None, help="Port of the prefill server (--pd); 30000."),
    decode_port: Optional[int] = typer.Option(None, help="Port of the decode server (--pd); 30002."),
    pd_link_gbps: Optional[float] = typer.Option(None, help="Modelled bandwidth of the prefill-to-decode KV transfer (--pd), GB/s; 0.1; 0 = memory speed."),
) -> None:
    """Serve DSV4-mini with SGLang's API, metrics and abort behaviour."""
    from .engine.config import EngineConfig
    from .engine.server import ServerConfig

    if index_k_dtype not in ("fp8", "bf16"):
        raise fail("--index-k-dtype must be fp8 or bf16")
    if device != "cpu" and not device.startswith("cuda"):
        raise fail("--device must be cpu or cuda")
    if log_level not in ("debug", "info", "warning", "error"):
        raise fail("--log-level must be debug, info, warning or error")
    if not pd and (prefill_port, decode_port, pd_link_gbps) != (None, None, None):
        raise fail("--prefill-port, --decode-port and --pd-link-gbps need --pd")
    pd_cfg = None
    if pd:
        from .engine.pd.serve import ROUTER_PORT, PDConfig

        port = ROUTER_PORT if port is None else port
        try:
            defaults = PDConfig()
            pd_cfg = PDConfig(prefill_port=defaults.prefill_port if prefill_port is None else prefill_port,
                              decode_port=defaults.decode_port if decode_port is None else decode_port,
                              link_gbps=defaults.link_gbps if pd_link_gbps is None else pd_link_gbps)
        except ValueError as e:
            raise fail(f"bad PD settings: {e}")
        if port in (pd_cfg.prefill_port, pd_cfg.decode_port):
            raise fail("--port (the router's), --prefill-port and --decode-port must differ")
    port = 30000 if port is None else port
    ports = [("--port", port)] + ([("--prefill-port", pd_cfg.prefill_port), ("--decode-port", pd_cfg.decode_port)]
                                  if pd_cfg is not None else [])
    for name, v in ports:
        if not 0 < v < 65536:
            raise fail(f"{name} must be a port number (1-65535), got {v}")
    for name, x in (("--hicache-load-gbps", hicache_load_gbps), ("--pd-link-gbps", pd_link_gbps)):
        if x is not None and not math.isfinite(x):  # typer reads "nan" and "inf" as floats
            raise fail(f"{name} must be a finite number, got {x}")
    for name, v in (("--port", port), ("--max-running-requests", max_running_requests), ("--num-pages", num_pages),
                    ("--page-size", page_size), ("--chunked-prefill-tokens", chunked_prefill_tokens)):
        if v < 1:
            raise fail(f"{name} must be at least 1")
    try:
        faults = _check_faults(fault)
        cfg = EngineConfig(device=device, page_size=page_size, num_pages=num_pages,
                           max_running_requests=max_running_requests, chunked_prefill_tokens=chunked_prefill_tokens,
                           index_k_dtype=index_k_dtype, enable_prefix_cache=not no_prefix_cache,
                           hicache=hicache, hicache_host_pages=hicache_host_pages,
                           hicache_load_gbps=hicache_load_gbps, pd=pd, faults=frozenset(faults))
    except ConfigError as e:
        raise fail(str(e))
    except ValueError as e:
        raise fail(f"bad engine settings: {e}")
    from .engine.serve import EngineSetupError, serve

    server_cfg = ServerConfig(host=host, port=port, api_key=api_key, model_name=model_name)
    try:
        if pd_cfg is not None:
            from .engine.pd import serve_pd

            serve_pd(cfg, server_cfg, pd_cfg, weights, random_weights, seed, log_level)
        else:
            serve(cfg, server_cfg, weights, random_weights, seed, log_level)
    except EngineSetupError as e:
        raise fail(str(e))
    except OSError as e:
        raise fail(f"cannot serve on {host if pd else f'{host}:{port}'}: {e.strerror or e}")


@engine_app.command("faults")
def engine_faults() -> None:
    """List the planted faults (`engine serve --fault NAME`) and the bug class each mirrors."""
    from .engine.faults import FAULTS

    for f in FAULTS.values():
        needs = {"pd": " (needs --pd)", "hicache": " (needs the HiCache tier)"}.get(f.needs, "")
        out.print(f"[bold]{f.name}[/]{needs}: {f.mirrors}", highlight=False)


@engine_app.command("train")
def engine_train(
    out_path: Path = typer.Option(None, "--out", help="Weights file to write; default: the shipped weights' path."),
    corpus: Path = typer.Option(Path("runs/train/corpus.npz"), help="Corpus file; built from expert sessions if missing."),
    seeds: int = typer.Option(1000, help="Training seeds per family when the corpus is built."),
    first_seed: int = typer.Option(100_000, help="First training seed when the corpus is built (held-out seeds are below 100000)."),
    slip_share: float = typer.Option(0.6, help="Share of sessions with slipped turns the expert recovers from."),
    rename_share: float = typer.Option(0.5, help="Share of sessions whose world names are replaced by made-up ones."),
    minutes: float = typer.Option(8.0, help="Training time budget; the LR schedule is fitted to it."),
    max_len: int = typer.Option(8192, help="Longest session in tokens; longer ones lose their later turns."),
    batch_tokens: int = typer.Option(32768, help="Padded tokens per step."),
    lr: float = typer.Option(2e-3, help="Peak learning rate."),
    warmup: int = typer.Option(50, help="Warm-up steps of the learning rate."),
    csa_dense_share: float = typer.Option(0.0, help="Share of steps in which CSA attends every compressed entry (dense warm-up)."),
    hca_drop: float = typer.Option(0.0, help="Share of steps in which HCA layers read no compressed entry."),
    seed: int = typer.Option(0, help="Batch order and initialisation."),
    init: Optional[Path] = typer.Option(None, help="Continue from these weights instead of from scratch."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings",
                                           help="With --init: leave its token embedding as it is (keeps rare tokens writable)."),
    heldout_seeds: int = typer.Option(0, help="Held-out seeds per family (0..N-1) to report teacher-forced errors on; 0: none."),
    device: str = typer.Option("cuda", help="cuda or cpu (cpu only for tiny smoke runs)."),
) -> None:
    """Rebuild DSV4-mini's weights: expert-session corpus, then training (an H200 takes ~8 min).

    The shipped weights are a chain of such runs, each on from the last (bench-plan.md lists
    every run's arguments); the last two train on corpora of the model's own sessions relabelled
    by the expert (scripts/onpolicy_corpus.py)."""
    from .engine.config import ModelConfig
    from .engine.train import CorpusError, TrainConfig, heldout_errors, train
    from .engine.train_data import TRAIN_SEED_BASE, build_corpus
    from .engine.weights import DEFAULT_WEIGHTS, WeightsError, load_weights

    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise fail("--device cuda asked for, but torch sees no CUDA device (use --device cpu for a smoke run)")
    if first_seed < TRAIN_SEED_BASE or not 0 <= heldout_seeds <= TRAIN_SEED_BASE:
        raise fail(f"--first-seed must be at least {TRAIN_SEED_BASE} and --heldout-seeds at most that: "
                   "the seeds below it are held out for evaluation")
    for name, share in (("--slip-share", slip_share), ("--rename-share", rename_share),
                        ("--csa-dense-share", csa_dense_share), ("--hca-drop", hca_drop)):
        if not 0.0 <= share <= 1.0:
            raise fail(f"{name} must be between 0 and 1; got {share}")
    if freeze_embeddings and init is None:
        raise fail("--freeze-embeddings needs --init: a fresh model's embedding must be trained")
    families = ["coding", "data", "ops"]
    if not corpus.exists():
        err.print(f"building the corpus: {seeds} seeds x {len(families)} families -> {corpus}", highlight=False)
        info = build_corpus(families, range(first_seed, first_seed + seeds), corpus,
                            slip_share=slip_share, rename_share=rename_share)
        err.print(f"corpus: {info}", highlight=False)
    weights = out_path or DEFAULT_WEIGHTS
    try:
        cfg = TrainConfig(minutes=minutes, max_len=max_len, batch_tokens=batch_tokens, lr=lr, warmup=warmup,
                          csa_dense_share=csa_dense_share, hca_drop=hca_drop, seed=seed, device=device,
                          freeze_embeddings=freeze_embeddings)
        result = train(ModelConfig(), cfg, corpus, weights, log=lambda m: err.print(m, highlight=False), init=init)
    except (WeightsError, CorpusError) as e:
        raise fail(str(e))
    out.print(f"trained {result.steps} steps in {result.wall_s:.0f} s on {result.tokens_seen / 1e6:.1f}M tokens; "
              f"final loss {result.final_loss:.4f}; weights: {weights}", highlight=False)
    if heldout_seeds > 0:
        import torch

        heldout = corpus.with_name(f"heldout-{heldout_seeds}.npz")
        if not heldout.exists():
            build_corpus(families, range(heldout_seeds), heldout, slip_share=0.0)
        e = heldout_errors(load_weights(ModelConfig(), weights).to(device), heldout, torch.device(device))
        out.print(f"held-out: token error {e['token_error']:.2%}, turn error {e['turn_error']:.2%} "
                  f"({e['tokens']} tokens, {e['turns']} turns)", highlight=False)


def _check_faults(names: list[str]) -> list[str]:
    from .engine.faults import FaultError, parse_faults

    try:
        return sorted(parse_faults(names))
    except FaultError as e:
        raise ConfigError(str(e)) from None


def _check_scenario(scenario: str) -> None:
    from .agents import FAMILIES

    if scenario != "mixed" and scenario not in FAMILIES:
        raise ConfigError(f"--scenario must be one of {', '.join([*FAMILIES, 'mixed'])}; got {scenario!r}")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder (possibly partial, e.g. from a killed run).")) -> None:
    """Rebuild summary.json, report.md and the plots from a run's history."""
    from .history import HistoryError
    from .report import build_report

    try:
        summary = build_report(run_dir)
    except HistoryError as e:
        raise fail(str(e))
    _print_verdict(summary, run_dir)


@app.command()
def audit(
    file: Path = typer.Argument(..., help="JSONL of recorded request/response pairs or SSE transcripts."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write per-record verdicts as JSONL here."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 on these verdicts: corruption,errors."),
) -> None:
    """Run the checkers offline over traffic captured in production."""
    from .audit import AuditError, audit_file, render_audit, unreadable_summary, write_results

    codes = parse_fail_on(fail_on)
    bad = [c for c in codes if c not in ("corruption", "errors")]
    if bad:
        raise fail(f"audit --fail-on takes corruption,errors; got {', '.join(bad)}")
    try:
        results = audit_file(file)
    except AuditError as e:
        raise fail(str(e))
    render_audit(results, out)
    if out_file:
        try:
            write_results(results, out_file)
        except OSError as e:
            raise fail(f"--out {out_file}: cannot write ({e.strerror or e})")
    torn = unreadable_summary(results)
    if torn is not None:  # the verdicts above cover the readable lines only
        raise fail(torn)
    if ("corruption" in codes and any(r.corrupt for r in results)) or ("errors" in codes and any(r.errors for r in results)):
        raise typer.Exit(1)


def _command_line(config: RunConfig) -> str:
    """The reproduce line: this command with its secrets replaced by environment variables."""
    return config.redactor.text(shell_line(["dsv4bench", *redact_argv(sys.argv[1:])]))


def _print_verdict(summary: dict, run_dir: Path) -> None:
    v = summary.get("verdict", "?")
    t = summary.get("turns", {})
    unchecked = " (wedge not checked)" if summary.get("wedge_checked") is False and v in ("CLEAN", "ERRORS") else ""
    line = (f"[{VERDICT_STYLE.get(v, 'bold')}]{v}[/]{unchecked}  turns {t.get('total', 0)} "
            f"(good {t.get('good', 0)}, corrupt {t.get('corrupt', 0)}, error {t.get('error', 0)}, "
            f"killed {t.get('killed', 0)})  report: {Path(run_dir) / 'report.md'}")
    out.print(line, highlight=False, soft_wrap=True)


def _exit_code(summary: dict, fail_on: tuple[str, ...]) -> int:
    v = summary.get("verdict")
    t = summary.get("turns", {})
    if fail_on and v == "INCOMPLETE":  # lost records: no --fail-on condition can be ruled out
        return 1
    if "corruption" in fail_on and (v == "CORRUPTION" or t.get("corrupt", 0) > 0):
        return 1
    if "errors" in fail_on and (v == "ERRORS" or t.get("error", 0) > 0):
        return 1
    if "wedge" in fail_on and v == "WEDGE":
        return 1
    return 0


def main() -> None:
    """Console entry point: Ctrl-C and broken pipes end quietly, never with a traceback."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
