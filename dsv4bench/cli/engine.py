"""`dsv4bench engine`: serve the bundled DSV4-mini engine, list its planted faults, retrain it.

The serve flags read their defaults from the engine's configs (engine/config.py) and leave its
checks to them; a check stays here where the message must name the flag."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from ..config import ConfigError
from ..engine.config import TOOL_CALL_PARSERS, EngineConfig, ModelConfig
from ..engine.faults import FAULTS, FaultError, parse_faults
from ..engine.training.config import TRAIN_SEED_BASE, CorpusConfig, TrainConfig
from .common import app, err, fail, out

engine_app = typer.Typer(help="The bundled DSV4-mini engine.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


@engine_app.command("serve")
def engine_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback by default."),
    port: Optional[int] = typer.Option(None, help="Port to serve on: 30000; with --pd the router's port, 8000."),
    device: str = typer.Option(EngineConfig.device, help="cpu or cuda."),
    max_running_requests: int = typer.Option(EngineConfig.max_running_requests, help="Requests decoding at once."),
    num_pages: int = typer.Option(EngineConfig.num_pages, help="KV pages in the pool (each page holds --page-size tokens)."),
    page_size: int = typer.Option(EngineConfig.page_size, help="Tokens per page; a multiple of the HCA compression rate."),
    chunked_prefill_tokens: int = typer.Option(EngineConfig.chunked_prefill_tokens, help="Prefill tokens per step across requests."),
    index_k_dtype: str = typer.Option(EngineConfig.index_k_dtype, help="Index-K cache storage: fp8 (e4m3 + per-entry scale) or bf16."),
    no_prefix_cache: bool = typer.Option(not EngineConfig.enable_prefix_cache, "--no-prefix-cache", help="Disable the radix prefix cache."),
    model_name: str = typer.Option("dsv4-mini", help="Model name served by /v1/models."),
    api_key: Optional[str] = typer.Option(None, envvar="DSV4BENCH_ENGINE_API_KEY", help="Require this Bearer token on every endpoint of every port (router, prefill, decode); /health and /metrics stay open unless --auth-health-metrics."),
    auth_health_metrics: bool = typer.Option(False, "--auth-health-metrics", help="With --api-key, require it on /health and /metrics too (off by default: Kubernetes probes and Prometheus scrapers usually carry no key)."),
    weights: Optional[Path] = typer.Option(None, help="Weights file (safetensors); default: the shipped DSV4-mini weights."),
    random_weights: bool = typer.Option(False, "--random-weights", help="Serve an untrained, seeded random initialisation."),
    seed: int = typer.Option(0, help="Seed of the random weight initialisation (--random-weights)."),
    log_level: str = typer.Option("warning", help="debug, info, warning or error."),
    fault: list[str] = typer.Option(sorted(EngineConfig.faults), "--fault", metavar="NAME", help="Switch on a planted bug mechanism, repeatable; off by default. `dsv4bench engine faults` lists them."),
    hicache: bool = typer.Option(EngineConfig.hicache, "--hicache", help="HiCache host tier: evicted prefix pages are backed up to host memory and loaded back layer by layer, readers gated per layer."),
    hicache_host_pages: int = typer.Option(EngineConfig.hicache_host_pages, help="Host-tier capacity in pages (--hicache); 0 = twice --num-pages."),
    hicache_load_gbps: float = typer.Option(EngineConfig.hicache_load_gbps, help="Modelled host-to-device bandwidth of --hicache loads, GB/s: a layer of a load lands after its bytes would have crossed the link."),
    pd: bool = typer.Option(EngineConfig.pd, "--pd", help="Prefill/decode disaggregation: a router (OpenAI API, on --port), a prefill and a decode server, each with its own /health and /metrics, and a KV transfer between their pools."),
    prefill_port: Optional[int] = typer.Option(None, help="Port of the prefill server (--pd); 30000."),
    decode_port: Optional[int] = typer.Option(None, help="Port of the decode server (--pd); 30002."),
    pd_link_gbps: Optional[float] = typer.Option(None, help="Modelled bandwidth of the prefill-to-decode KV transfer (--pd, --pd-role), GB/s; 0.1; 0 = memory speed."),
    pd_role: Optional[str] = typer.Option(None, "--pd-role", metavar="prefill|decode", help="Serve one half of a PD deployment in this process (on --port: 30000 prefill, 30002 decode), for a PD router speaking SGLang's protocol in front, ours or SGLang's: `python -m sglang_router.launch_router --pd-disaggregation --prefill http://HOST:PORT BOOTSTRAP_PORT --decode http://HOST:PORT`."),
    bootstrap_port: Optional[int] = typer.Option(None, help="The prefill half's bootstrap port (--pd-role prefill), where decode halves fetch each request's KV; 8998, SGLang's default."),
    tool_call_parser: str = typer.Option(EngineConfig.tool_call_parser, help=f"Who parses tool calls out of the model's text: {' or '.join(TOOL_CALL_PARSERS)} (SGLang's own DeepSeek-V4 detector: a streamed call arrives whole at its closing tag, as from SGLang)."),
) -> None:
    """Serve DSV4-mini with SGLang's API, metrics and abort behaviour."""
    from ..engine.server import ServerConfig

    if index_k_dtype not in ("fp8", "bf16"):  # EngineConfig checks it too, but does not name the flag
        raise fail("--index-k-dtype must be fp8 or bf16")
    if log_level not in ("debug", "info", "warning", "error"):
        raise fail("--log-level must be debug, info, warning or error")
    if tool_call_parser not in TOOL_CALL_PARSERS:  # EngineConfig checks it too, but does not name the flag
        raise fail(f"--tool-call-parser must be {' or '.join(TOOL_CALL_PARSERS)}")
    if tool_call_parser == "sglang":
        from ..engine.sglang_tool_calls import sglang_missing

        if missing := sglang_missing():  # imports sglang: before the engine starts, not on a first request
            raise fail(f"--tool-call-parser sglang: {missing}; install sglang, or in a checkout "
                       "`pip install --no-deps -r requirements-sglang-parsers.txt`")
    if pd_role is not None and pd_role not in ("prefill", "decode"):
        raise fail(f"--pd-role must be prefill or decode, not {pd_role!r}")
    if pd_role is not None and (pd or prefill_port is not None or decode_port is not None):
        raise fail("--pd-role serves one half on --port: not with --pd, --prefill-port or --decode-port")
    if bootstrap_port is not None and pd_role != "prefill":
        raise fail("--bootstrap-port is the prefill half's: it needs --pd-role prefill")
    if bootstrap_port is not None and not 0 < bootstrap_port < 65536:
        raise fail(f"--bootstrap-port must be a port number (1-65535), got {bootstrap_port}")
    if not (pd or pd_role) and pd_link_gbps is not None:
        raise fail("--pd-link-gbps needs --pd or --pd-role")
    if not pd and (prefill_port, decode_port) != (None, None):
        raise fail("--prefill-port and --decode-port need --pd")
    pd_cfg = None
    if pd_role is not None:
        from ..engine.pd.halves import BOOTSTRAP_PORT
        from ..engine.pd.serve import PDConfig

        port = (PDConfig.prefill_port if pd_role == "prefill" else PDConfig.decode_port) if port is None else port
        bootstrap_port = BOOTSTRAP_PORT if bootstrap_port is None else bootstrap_port
        if pd_role == "prefill" and bootstrap_port == port:
            raise fail("--port and --bootstrap-port must differ")
    if pd:
        from ..engine.pd.serve import ROUTER_PORT, PDConfig

        port = ROUTER_PORT if port is None else port
        given = {"prefill_port": prefill_port, "decode_port": decode_port, "link_gbps": pd_link_gbps}
        try:  # PDConfig checks the prefill and decode ports
            pd_cfg = PDConfig(**{k: v for k, v in given.items() if v is not None})
        except ValueError as e:
            raise fail(f"bad PD settings: {e}")
        if port in (pd_cfg.prefill_port, pd_cfg.decode_port):
            raise fail("--port (the router's), --prefill-port and --decode-port must differ")
    port = ServerConfig.port if port is None else port
    if not 0 < port < 65536:
        raise fail(f"--port must be a port number (1-65535), got {port}")
    for name, x in (("--hicache-load-gbps", hicache_load_gbps), ("--pd-link-gbps", pd_link_gbps)):
        if x is not None and not math.isfinite(x):  # typer reads "nan" and "inf" as floats
            raise fail(f"{name} must be a finite number, got {x}")
    for name, v in (("--max-running-requests", max_running_requests), ("--num-pages", num_pages),
                    ("--page-size", page_size), ("--chunked-prefill-tokens", chunked_prefill_tokens)):
        if v < 1:
            raise fail(f"{name} must be at least 1")
    try:
        faults = check_faults(fault)
        cfg = EngineConfig(device=device, page_size=page_size, num_pages=num_pages,
                           max_running_requests=max_running_requests, chunked_prefill_tokens=chunked_prefill_tokens,
                           index_k_dtype=index_k_dtype, enable_prefix_cache=not no_prefix_cache,
                           hicache=hicache, hicache_host_pages=hicache_host_pages,
                           hicache_load_gbps=hicache_load_gbps, pd=pd or pd_role is not None, faults=frozenset(faults),
                           tool_call_parser=tool_call_parser)
    except ConfigError as e:
        raise fail(str(e))
    except ValueError as e:
        raise fail(f"bad engine settings: {e}")
    from ..engine.serve import EngineSetupError, ServeError, serve

    if auth_health_metrics and not api_key:
        raise fail("--auth-health-metrics needs --api-key")
    server_cfg = ServerConfig(host=host, port=port, api_key=api_key, model_name=model_name,
                              auth_health_metrics=auth_health_metrics)
    try:
        if pd_role is not None:
            from ..engine.pd.halves import serve_half
            from ..engine.pd.serve import PDConfig

            link = PDConfig.link_gbps if pd_link_gbps is None else pd_link_gbps
            serve_half(pd_role, cfg, server_cfg, bootstrap_port or 0, link, weights, random_weights, seed, log_level)
        elif pd_cfg is not None:
            from ..engine.pd import serve_pd

            serve_pd(cfg, server_cfg, pd_cfg, weights, random_weights, seed, log_level)
        else:
            serve(cfg, server_cfg, weights, random_weights, seed, log_level)
    except ServeError as e:  # a busy port, a host that does not resolve: already one line
        raise fail(str(e))
    except EngineSetupError as e:
        raise fail(str(e))
    except OSError as e:
        where = host if pd else f"{host}:{port} (or the bootstrap port {bootstrap_port})" if pd_role == "prefill" \
            else f"{host}:{port}"
        raise fail(f"cannot serve on {where}: {e.strerror or e}")


@engine_app.command("faults")
def engine_faults() -> None:
    """List the planted faults (`engine serve --fault NAME`) and the bug class each mirrors."""
    for f in FAULTS.values():
        needs = {"pd": " (needs --pd)", "hicache": " (needs the HiCache tier)"}.get(f.needs, "")
        out.print(f"[bold]{f.name}[/]{needs}: {f.mirrors}", highlight=False)


@engine_app.command("train")
def engine_train(
    out_path: Path = typer.Option(None, "--out", help="Weights file to write; default: the shipped weights' path."),
    corpus: Path = typer.Option(Path("runs/train/corpus.npz"), help="Corpus file; built from expert sessions if missing."),
    seeds: int = typer.Option(CorpusConfig.seeds, help="Training seeds per family when the corpus is built."),
    first_seed: int = typer.Option(CorpusConfig.first_seed, help="First training seed when the corpus is built (held-out seeds are below 100000)."),
    slip_share: float = typer.Option(CorpusConfig.slip_share, help="Share of sessions with slipped turns the expert recovers from."),
    rename_share: float = typer.Option(CorpusConfig.rename_share, help="Share of sessions whose world names are replaced by made-up ones."),
    minutes: float = typer.Option(TrainConfig.minutes, help="Training time budget; the LR schedule is fitted to it."),
    max_steps: int = typer.Option(TrainConfig.max_steps, help="Stop after this many steps even within the time budget."),
    max_len: int = typer.Option(TrainConfig.max_len, help="Longest session in tokens; longer ones lose their later turns."),
    batch_tokens: int = typer.Option(TrainConfig.batch_tokens, help="Padded tokens per step."),
    lr: float = typer.Option(TrainConfig.lr, help="Peak learning rate."),
    warmup: int = typer.Option(TrainConfig.warmup, help="Warm-up steps of the learning rate."),
    csa_dense_share: float = typer.Option(TrainConfig.csa_dense_share, help="Share of steps in which CSA attends every compressed entry (dense warm-up)."),
    hca_drop: float = typer.Option(TrainConfig.hca_drop, help="Share of steps in which HCA layers read no compressed entry."),
    window: int = typer.Option(ModelConfig.window, help="Sliding window of the model."),
    hca_rate: int = typer.Option(ModelConfig.hca_rate, help="HCA compression rate; --init weights of a rate that divides it are stretched to it."),
    seed: int = typer.Option(TrainConfig.seed, help="Batch order and initialisation."),
    init: Optional[Path] = typer.Option(None, help="Continue from these weights instead of from scratch."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings",
                                           help="With --init: leave its token embedding as it is (keeps rare tokens writable)."),
    heldout_seeds: int = typer.Option(0, help="Held-out seeds per family (0..N-1) to report teacher-forced errors on; 0: none."),
    heldout: Optional[Path] = typer.Option(None, help="Held-out corpus file to report teacher-forced errors on (instead of --heldout-seeds)."),
    device: str = typer.Option(TrainConfig.device, help="cuda or cpu (cpu only for tiny smoke runs)."),
) -> None:
    """Rebuild DSV4-mini's weights: expert-session corpus, then training (an H200 takes ~8 min).

    The shipped weights are a chain of such runs, each on from the last (bench-plan.md lists
    every run's arguments); the last two train on corpora of the model's own sessions relabelled
    by the expert (scripts/onpolicy_corpus.py). With an existing --corpus (and no
    --heldout-seeds) no corpus is built: only torch runs (engine/training/trainer.py)."""
    import dataclasses

    from ..engine.training.trainer import CorpusError, heldout_errors, train
    from ..engine.weights import DEFAULT_WEIGHTS, WeightsError, load_weights

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
    families = list(CorpusConfig.families)
    if not corpus.exists():
        from ..engine.training.corpus import build_corpus

        err.print(f"building the corpus: {seeds} seeds x {len(families)} families -> {corpus}", highlight=False)
        info = build_corpus(families, range(first_seed, first_seed + seeds), corpus,
                            slip_share=slip_share, rename_share=rename_share)
        err.print(f"corpus: {info}", highlight=False)
    weights = out_path or DEFAULT_WEIGHTS
    model_cfg = dataclasses.replace(ModelConfig(), window=window, hca_rate=hca_rate)
    try:
        cfg = TrainConfig(minutes=minutes, max_steps=max_steps, max_len=max_len, batch_tokens=batch_tokens, lr=lr,
                          warmup=warmup, csa_dense_share=csa_dense_share, hca_drop=hca_drop, seed=seed, device=device,
                          freeze_embeddings=freeze_embeddings)
        result = train(model_cfg, cfg, corpus, weights, log=lambda m: err.print(m, highlight=False, markup=False), init=init)
    except (WeightsError, CorpusError) as e:
        raise fail(str(e))
    out.print(f"trained {result.steps} steps in {result.wall_s:.0f} s on {result.tokens_seen / 1e6:.1f}M tokens; "
              f"final loss {result.final_loss:.4f}; weights: {weights}", highlight=False)
    if heldout_seeds > 0 and heldout is None:
        from ..engine.training.corpus import build_corpus

        heldout = corpus.with_name(f"heldout-{heldout_seeds}.npz")
        if not heldout.exists():
            build_corpus(families, range(heldout_seeds), heldout, slip_share=0.0)
    if heldout is not None:
        import torch

        e = heldout_errors(load_weights(model_cfg, weights).to(device), heldout, torch.device(device))
        out.print(f"held-out: token error {e['token_error']:.2%}, turn error {e['turn_error']:.2%} "
                  f"({e['tokens']} tokens, {e['turns']} turns)", highlight=False)


def check_faults(names: list[str]) -> list[str]:
    """The fault names of a repeatable flag, checked and sorted, or a ConfigError."""
    try:
        return sorted(parse_faults(names))
    except FaultError as e:
        raise ConfigError(str(e)) from None
