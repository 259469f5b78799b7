"""`dsv4bench engine`: serve the bundled DSV4-mini engine, list its planted faults, retrain it.

The serve flags read their defaults from the engine's configs (engine/config.py) and leave its
checks to them; a check stays here where the message must name the flag."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from dsv4bench.harness.config import ConfigError
from dsv4bench.engine.config import ROUTER_PORT, ROUTERS, TOOL_CALL_PARSERS, DeploymentConfig, EngineConfig, ModelConfig
from dsv4bench.engine.faults import FAULTS, FaultError, parse_faults
from dsv4bench.engine.training.config import TRAIN_SEED_BASE, CorpusConfig, TrainConfig
from dsv4bench.cli.common import app, err, fail, out

engine_app = typer.Typer(help="The bundled DSV4-mini engine.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


@engine_app.command("serve")
def engine_serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback by default."),
    port: Optional[int] = typer.Option(None, help="Port to serve on: 30000; with --pd the router's port, 8000."),
    device: str = typer.Option(EngineConfig.device, help="cpu or cuda."),
    max_running_requests: int = typer.Option(EngineConfig.max_running_requests, help="Requests decoding at once."),
    num_pages: int = typer.Option(
        EngineConfig.num_pages, help="KV pages in the pool (each page holds --page-size tokens)."
    ),
    page_size: int = typer.Option(
        EngineConfig.page_size, help="Tokens per page; a multiple of the HCA compression rate."
    ),
    chunked_prefill_tokens: int = typer.Option(
        EngineConfig.chunked_prefill_tokens, help="Prefill tokens per step across requests."
    ),
    index_k_dtype: str = typer.Option(
        EngineConfig.index_k_dtype, help="Index-K cache storage: fp8 (e4m3 + per-entry scale) or bf16."
    ),
    no_prefix_cache: bool = typer.Option(
        not EngineConfig.enable_prefix_cache, "--no-prefix-cache", help="Disable the radix prefix cache."
    ),
    model_name: str = typer.Option("dsv4-mini", help="Model name served by /v1/models."),
    api_key: Optional[str] = typer.Option(
        None,
        envvar="DSV4BENCH_ENGINE_API_KEY",
        help="Require this Bearer token on every endpoint of every port (router, prefill, decode); /health and /metrics stay open unless --auth-health-metrics.",
    ),
    auth_health_metrics: bool = typer.Option(
        False,
        "--auth-health-metrics",
        help="With --api-key, require it on /health and /metrics too (off by default: Kubernetes probes and Prometheus scrapers usually carry no key).",
    ),
    weights: Optional[Path] = typer.Option(
        None, help="Weights file (safetensors); default: the shipped DSV4-mini weights."
    ),
    random_weights: bool = typer.Option(
        False, "--random-weights", help="Serve an untrained, seeded random initialisation."
    ),
    seed: int = typer.Option(0, help="Seed of the random weight initialisation (--random-weights)."),
    log_level: str = typer.Option("warning", help="debug, info, warning or error."),
    fault: list[str] = typer.Option(
        sorted(EngineConfig.faults),
        "--fault",
        metavar="NAME",
        help="Switch on a planted bug mechanism, repeatable; off by default. `dsv4bench engine faults` lists them.",
    ),
    hicache: bool = typer.Option(
        EngineConfig.hicache,
        "--hicache",
        help="HiCache host tier: evicted prefix pages are backed up to host memory and loaded back layer by layer, readers gated per layer.",
    ),
    hicache_host_pages: int = typer.Option(
        EngineConfig.hicache_host_pages, help="Host-tier capacity in pages (--hicache); 0 = twice --num-pages."
    ),
    hicache_load_gbps: float = typer.Option(
        EngineConfig.hicache_load_gbps,
        help="Modelled host-to-device bandwidth of --hicache loads, GB/s: a layer of a load lands after its bytes would have crossed the link.",
    ),
    pd: bool = typer.Option(
        EngineConfig.pd,
        "--pd",
        help=f"Prefill/decode disaggregation as SGLang deploys it: a prefill and a decode server, each its own process with its own /health and /metrics, the KV between them over the prefill's bootstrap port, and a PD router in front on --port ({ROUTER_PORT}).",
    ),
    router: str = typer.Option(
        DeploymentConfig.router,
        metavar="|".join(ROUTERS),
        help="The router in front: ours (in this process; with --pd only), or SGLang's (`sglang-router`, pip install 'dsv4bench\\[sglang]'), started on --port in front of the two halves (--pd) or of one engine process (on --worker-port).",
    ),
    prefill_port: Optional[int] = typer.Option(
        None, help=f"Port of the prefill server (--pd); {DeploymentConfig.prefill_port}."
    ),
    decode_port: Optional[int] = typer.Option(
        None, help=f"Port of the decode server (--pd); {DeploymentConfig.decode_port}."
    ),
    worker_port: Optional[int] = typer.Option(
        None, help=f"Port of the engine behind --router sglang without --pd; {DeploymentConfig.worker_port}."
    ),
    router_metrics_port: Optional[int] = typer.Option(
        None,
        help=f"Prometheus port of SGLang's router (--router sglang), bound to --host; {DeploymentConfig.router_metrics_port}.",
    ),
    pd_link_gbps: Optional[float] = typer.Option(
        None,
        help=f"Modelled bandwidth of the prefill-to-decode KV transfer (--pd, --pd-role), GB/s; {DeploymentConfig.link_gbps}; 0 = memory speed.",
    ),
    pd_role: Optional[str] = typer.Option(
        None,
        "--pd-role",
        metavar="prefill|decode",
        help=f"Serve one half of a PD deployment in this process (on --port: {DeploymentConfig.prefill_port} prefill, {DeploymentConfig.decode_port} decode), for a PD router speaking SGLang's protocol in front, ours or SGLang's: `python -m sglang_router.launch_router --pd-disaggregation --prefill http://HOST:PORT BOOTSTRAP_PORT --decode http://HOST:PORT`.",
    ),
    bootstrap_port: Optional[int] = typer.Option(
        None,
        help=f"The prefill server's bootstrap port (--pd, --pd-role prefill), where decode servers fetch each request's KV; {DeploymentConfig.bootstrap_port}, SGLang's default.",
    ),
    tool_call_parser: str = typer.Option(
        EngineConfig.tool_call_parser,
        help=f"Who parses tool calls out of the model's text: {' or '.join(TOOL_CALL_PARSERS)} (SGLang's own DeepSeek-V4 detector: a streamed call arrives whole at its closing tag, as from SGLang).",
    ),
) -> None:
    """Serve DSV4-mini with SGLang's API, metrics and abort behaviour."""
    from dsv4bench.engine.server import ServerConfig

    if index_k_dtype not in ("fp8", "bf16"):  # EngineConfig checks it too, but does not name the flag
        raise fail("--index-k-dtype must be fp8 or bf16")
    if log_level not in ("debug", "info", "warning", "error"):
        raise fail("--log-level must be debug, info, warning or error")
    if tool_call_parser not in TOOL_CALL_PARSERS:  # EngineConfig checks it too, but does not name the flag
        raise fail(f"--tool-call-parser must be {' or '.join(TOOL_CALL_PARSERS)}")
    if tool_call_parser == "sglang":
        from dsv4bench.engine.sglang_tool_calls import sglang_missing

        if missing := sglang_missing():  # imports sglang: before the engine starts, not on a first request
            raise fail(
                f"--tool-call-parser sglang: {missing}; install sglang, or in a checkout "
                "`pip install --no-deps -r requirements-sglang-parsers.txt`"
            )
    if pd_role is not None and pd_role not in ("prefill", "decode"):
        raise fail(f"--pd-role must be prefill or decode, not {pd_role!r}")
    if router not in ROUTERS:
        raise fail(f"--router must be {' or '.join(ROUTERS)}, not {router!r}")
    deployment = pd or router == "sglang"  # several processes, this one supervising them
    if pd_role is not None and deployment:
        raise fail("--pd-role serves one half on --port: not with --pd or --router")
    if not pd and (prefill_port, decode_port) != (None, None):
        raise fail("--prefill-port and --decode-port need --pd")
    if (pd or router != "sglang") and worker_port is not None:
        raise fail("--worker-port is the engine's behind --router sglang without --pd")
    if router != "sglang" and router_metrics_port is not None:
        raise fail("--router-metrics-port is SGLang's router's: it needs --router sglang")
    if bootstrap_port is not None and not (pd or pd_role == "prefill"):
        raise fail("--bootstrap-port is the prefill server's: it needs --pd or --pd-role prefill")
    if not (pd or pd_role) and pd_link_gbps is not None:
        raise fail("--pd-link-gbps needs --pd or --pd-role")
    for name, x in (("--hicache-load-gbps", hicache_load_gbps), ("--pd-link-gbps", pd_link_gbps)):
        if x is not None and not math.isfinite(x):  # typer reads "nan" and "inf" as floats
            raise fail(f"{name} must be a finite number, got {x}")
    for name, v in (
        ("--bootstrap-port", bootstrap_port),
        ("--prefill-port", prefill_port),
        ("--decode-port", decode_port),
        ("--worker-port", worker_port),
        ("--router-metrics-port", router_metrics_port),
    ):
        if v is not None and not 0 < v < 65536:
            raise fail(f"{name} must be a port number (1-65535), got {v}")
    dcfg = None
    if pd_role is not None:
        port = (
            (DeploymentConfig.prefill_port if pd_role == "prefill" else DeploymentConfig.decode_port)
            if port is None
            else port
        )
        bootstrap_port = DeploymentConfig.bootstrap_port if bootstrap_port is None else bootstrap_port
        if pd_role == "prefill" and bootstrap_port == port:
            raise fail("--port and --bootstrap-port must differ")
    if deployment:
        port = ROUTER_PORT if port is None else port
        given = {
            "router": router,
            "prefill_port": prefill_port,
            "decode_port": decode_port,
            "worker_port": worker_port,
            "bootstrap_port": bootstrap_port,
            "router_metrics_port": router_metrics_port,
            "link_gbps": pd_link_gbps,
        }
        try:
            dcfg = DeploymentConfig(**{k: v for k, v in given.items() if v is not None})
        except ValueError as e:
            raise fail(f"bad deployment settings: {e}")
    port = ServerConfig.port if port is None else port
    if not 0 < port < 65536:
        raise fail(f"--port must be a port number (1-65535), got {port}")
    for name, v in (
        ("--max-running-requests", max_running_requests),
        ("--num-pages", num_pages),
        ("--page-size", page_size),
        ("--chunked-prefill-tokens", chunked_prefill_tokens),
    ):
        if v < 1:
            raise fail(f"{name} must be at least 1")
    try:
        faults = check_faults(fault)
        cfg = EngineConfig(
            device=device,
            page_size=page_size,
            num_pages=num_pages,
            max_running_requests=max_running_requests,
            chunked_prefill_tokens=chunked_prefill_tokens,
            index_k_dtype=index_k_dtype,
            enable_prefix_cache=not no_prefix_cache,
            hicache=hicache,
            hicache_host_pages=hicache_host_pages,
            hicache_load_gbps=hicache_load_gbps,
            pd=pd or pd_role is not None,
            faults=frozenset(faults),
            tool_call_parser=tool_call_parser,
        )
    except ConfigError as e:
        raise fail(str(e))
    except ValueError as e:
        raise fail(f"bad engine settings: {e}")
    from dsv4bench.engine.cpu_threads import set_openmp_spin

    set_openmp_spin(2 if dcfg is not None else 1)  # before torch loads (engine/cpu_threads.py); PD: two halves
    from dsv4bench.engine.serve import EngineSetupError, ServeError, serve

    if auth_health_metrics and not api_key:
        raise fail("--auth-health-metrics needs --api-key")
    server_cfg = ServerConfig(
        host=host, port=port, api_key=api_key, model_name=model_name, auth_health_metrics=auth_health_metrics
    )
    try:
        if pd_role is not None:
            from dsv4bench.engine.pd.halves import serve_half

            link = DeploymentConfig.link_gbps if pd_link_gbps is None else pd_link_gbps
            serve_half(pd_role, cfg, server_cfg, bootstrap_port or 0, link, weights, random_weights, seed, log_level)
        elif dcfg is not None:
            import os

            from dsv4bench.engine.deployment import serve_deployment

            if api_key:  # to the workers through their environment, not their command lines
                os.environ["DSV4BENCH_ENGINE_API_KEY"] = api_key
            serve_deployment(cfg, server_cfg, dcfg, worker_flags(ctx), log_level)
        else:
            serve(cfg, server_cfg, weights, random_weights, seed, log_level)
    except ServeError as e:  # a busy port, a host that does not resolve: already one line
        raise fail(str(e))
    except EngineSetupError as e:
        raise fail(str(e))
    except OSError as e:
        where = f"{host}:{port} (or the bootstrap port {bootstrap_port})" if pd_role == "prefill" else f"{host}:{port}"
        raise fail(f"cannot serve on {where}: {e.strerror or e}")


# The `engine serve` flags that say how the deployment is laid out, not how an engine serves:
# the supervising process reads them; each worker gets its own (deployment.parts_of).
DEPLOYMENT_PARAMS = frozenset(
    {
        "host",
        "port",
        "pd",
        "router",
        "prefill_port",
        "decode_port",
        "worker_port",
        "router_metrics_port",
        "bootstrap_port",
        "pd_link_gbps",
        "pd_role",
        "api_key",
    }
)


def worker_flags(ctx: typer.Context) -> list[str]:
    """The `engine serve` flags given on this command line that each worker process of a
    deployment needs too (every one but DEPLOYMENT_PARAMS), as flags again."""
    flags: list[str] = []
    for param in ctx.command.params:
        if getattr(param, "param_type_name", None) != "option" or param.name in DEPLOYMENT_PARAMS:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name == "DEFAULT":
            continue
        value, opt = ctx.params[param.name], max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            flags += [opt] if value else []
        elif param.multiple:
            flags += [f"{opt}={v}" for v in value]
        elif value is not None:
            flags.append(f"{opt}={value}")
    return flags


@engine_app.command("faults")
def engine_faults() -> None:
    """List the planted faults (`engine serve --fault NAME`) and the bug class each mirrors."""
    for f in FAULTS.values():
        needs = {"pd": " (needs --pd)", "hicache": " (needs the HiCache tier)"}.get(f.needs, "")
        out.print(f"[bold]{f.name}[/]{needs}: {f.mirrors}", highlight=False)


@engine_app.command("train")
def engine_train(
    out_path: Path = typer.Option(None, "--out", help="Weights file to write; default: the shipped weights' path."),
    corpus: Path = typer.Option(
        Path("runs/train/corpus.npz"), help="Corpus file; built from expert sessions if missing."
    ),
    seeds: int = typer.Option(CorpusConfig.seeds, help="Training seeds per family when the corpus is built."),
    first_seed: int = typer.Option(
        CorpusConfig.first_seed, help="First training seed when the corpus is built (held-out seeds are below 100000)."
    ),
    slip_share: float = typer.Option(
        CorpusConfig.slip_share, help="Share of sessions with slipped turns the expert recovers from."
    ),
    rename_share: float = typer.Option(
        CorpusConfig.rename_share, help="Share of sessions whose world names are replaced by made-up ones."
    ),
    minutes: float = typer.Option(TrainConfig.minutes, help="Training time budget; the LR schedule is fitted to it."),
    max_steps: int = typer.Option(
        TrainConfig.max_steps, help="Stop after this many steps even within the time budget."
    ),
    max_len: int = typer.Option(
        TrainConfig.max_len, help="Longest session in tokens; longer ones lose their later turns."
    ),
    batch_tokens: int = typer.Option(TrainConfig.batch_tokens, help="Padded tokens per step."),
    lr: float = typer.Option(TrainConfig.lr, help="Peak learning rate."),
    warmup: int = typer.Option(TrainConfig.warmup, help="Warm-up steps of the learning rate."),
    csa_dense_share: float = typer.Option(
        TrainConfig.csa_dense_share, help="Share of steps in which CSA attends every compressed entry (dense warm-up)."
    ),
    hca_drop: float = typer.Option(
        TrainConfig.hca_drop, help="Share of steps in which HCA layers read no compressed entry."
    ),
    window: int = typer.Option(ModelConfig.window, help="Sliding window of the model."),
    hca_rate: int = typer.Option(
        ModelConfig.hca_rate, help="HCA compression rate; --init weights of a rate that divides it are stretched to it."
    ),
    seed: int = typer.Option(TrainConfig.seed, help="Batch order and initialisation."),
    init: Optional[Path] = typer.Option(None, help="Continue from these weights instead of from scratch."),
    freeze_embeddings: bool = typer.Option(
        False,
        "--freeze-embeddings",
        help="With --init: leave its token embedding as it is (keeps rare tokens writable).",
    ),
    heldout_seeds: int = typer.Option(
        0, help="Held-out seeds per family (0..N-1) to report teacher-forced errors on; 0: none."
    ),
    heldout: Optional[Path] = typer.Option(
        None, help="Held-out corpus file to report teacher-forced errors on (instead of --heldout-seeds)."
    ),
    device: str = typer.Option(TrainConfig.device, help="cuda or cpu (cpu only for tiny smoke runs)."),
) -> None:
    """Rebuild DSV4-mini's weights: expert-session corpus, then training (an H200 takes ~8 min).

    The shipped weights are a chain of such runs, each on from the last (bench-plan.md lists
    every run's arguments); the last two train on corpora of the model's own sessions relabelled
    by the expert (scripts/onpolicy_corpus.py). With an existing --corpus (and no
    --heldout-seeds) no corpus is built: only torch runs (engine/training/trainer.py)."""
    import dataclasses

    from dsv4bench.engine.training.trainer import CorpusError, heldout_errors, train
    from dsv4bench.engine.weights import DEFAULT_WEIGHTS, WeightsError, load_weights

    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise fail("--device cuda asked for, but torch sees no CUDA device (use --device cpu for a smoke run)")
    if first_seed < TRAIN_SEED_BASE or not 0 <= heldout_seeds <= TRAIN_SEED_BASE:
        raise fail(
            f"--first-seed must be at least {TRAIN_SEED_BASE} and --heldout-seeds at most that: "
            "the seeds below it are held out for evaluation"
        )
    for name, share in (
        ("--slip-share", slip_share),
        ("--rename-share", rename_share),
        ("--csa-dense-share", csa_dense_share),
        ("--hca-drop", hca_drop),
    ):
        if not 0.0 <= share <= 1.0:
            raise fail(f"{name} must be between 0 and 1; got {share}")
    if freeze_embeddings and init is None:
        raise fail("--freeze-embeddings needs --init: a fresh model's embedding must be trained")
    families = list(CorpusConfig.families)
    if not corpus.exists():
        from dsv4bench.engine.training.corpus import build_corpus

        err.print(f"building the corpus: {seeds} seeds x {len(families)} families -> {corpus}", highlight=False)
        info = build_corpus(
            families, range(first_seed, first_seed + seeds), corpus, slip_share=slip_share, rename_share=rename_share
        )
        err.print(f"corpus: {info}", highlight=False)
    weights = out_path or DEFAULT_WEIGHTS
    model_cfg = dataclasses.replace(ModelConfig(), window=window, hca_rate=hca_rate)
    try:
        cfg = TrainConfig(
            minutes=minutes,
            max_steps=max_steps,
            max_len=max_len,
            batch_tokens=batch_tokens,
            lr=lr,
            warmup=warmup,
            csa_dense_share=csa_dense_share,
            hca_drop=hca_drop,
            seed=seed,
            device=device,
            freeze_embeddings=freeze_embeddings,
        )
        result = train(
            model_cfg, cfg, corpus, weights, log=lambda m: err.print(m, highlight=False, markup=False), init=init
        )
    except (WeightsError, CorpusError) as e:
        raise fail(str(e))
    out.print(
        f"trained {result.steps} steps in {result.wall_s:.0f} s on {result.tokens_seen / 1e6:.1f}M tokens; "
        f"final loss {result.final_loss:.4f}; weights: {weights}",
        highlight=False,
    )
    if heldout_seeds > 0 and heldout is None:
        from dsv4bench.engine.training.corpus import build_corpus

        heldout = corpus.with_name(f"heldout-{heldout_seeds}.npz")
        if not heldout.exists():
            build_corpus(families, range(heldout_seeds), heldout, slip_share=0.0)
    if heldout is not None:
        import torch

        errors = heldout_errors(load_weights(model_cfg, weights).to(device), heldout, torch.device(device))
        out.print(
            f"held-out: token error {errors['token_error']:.2%}, turn error {errors['turn_error']:.2%} "
            f"({errors['tokens']} tokens, {errors['turns']} turns)",
            highlight=False,
        )


def check_faults(names: list[str]) -> list[str]:
    """The fault names of a repeatable flag, checked and sorted, or a ConfigError."""
    try:
        return sorted(parse_faults(names))
    except FaultError as e:
        raise ConfigError(str(e)) from None
