"""Both PD engines in one process, their pools joined directly (a transfer copies decode's
pages in place, the bootstrap worker is shared): the rig the step-by-step tests drive with
`Pump`, every step chosen by the test. Served deployments are processes (engine/deployment.py)
or, in tests, the halves joined by loopback TCP (helpers.ServedPD)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.faults import Fault
from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.pd.bootstrap import BootstrapWorker, Room
from dsv4bench.engine.pd.decode import DecodeEngine
from dsv4bench.engine.pd.prefill import PrefillEngine
from dsv4bench.engine.pd.transfer import TransferWorker
from dsv4bench.engine.request import Request, SamplingParams
from dsv4bench.engine.serve import load_model
from dsv4bench.engine.server_loop import EventSink


@dataclass
class PDEngine:
    """The two engines and the workers between them."""

    cfg: EngineConfig
    bootstrap: BootstrapWorker
    transfers: TransferWorker
    prefill: PrefillEngine
    decode: DecodeEngine
    eos_token_id: int

    def start(self) -> None:
        for part in (self.bootstrap, self.transfers, self.prefill, self.decode):
            part.start()

    def stop(self) -> None:
        for part in (self.prefill, self.decode, self.transfers, self.bootstrap):
            part.stop()

    def dispatch(self, rid: str, prompt_ids: list[int], params: SamplingParams, sink: EventSink) -> None:
        """What a PD router does: the request to both engines, its room opened first (both
        engines' handshake messages refer to it), the prefill's copy one token long (its token
        travels with the KV), EOS a stop token; the decode's TokenEvents come to `sink`."""
        stop_ids = params.stop_token_ids + (() if self.eos_token_id in params.stop_token_ids else (self.eos_token_id,))
        params = dataclasses.replace(params, stop_token_ids=stop_ids)
        room = Room(rid)
        self.bootstrap.open(room)
        self.decode.submit(Request(rid, list(prompt_ids), params), sink)
        self.prefill.submit(Request(rid, list(prompt_ids), dataclasses.replace(params, max_tokens=1)), room)


def build_pd_engine(
    cfg: EngineConfig, link_gbps: float = 0.0, random_weights: bool = True, init_seed: int = 0, start: bool = False
) -> PDEngine:
    """The two engines over one model (each with its own pools), started unless `start` is False."""
    tok, model = load_model(cfg, random_weights=random_weights, init_seed=init_seed)
    prefill_runner, decode_runner = ModelRunner(cfg, model), ModelRunner(cfg, model)
    bootstrap = BootstrapWorker(stall_on_unexpected_abort=Fault.BOOTSTRAP_STALL in cfg.faults)
    transfers = TransferWorker(prefill_runner.pools, decode_runner.pools, link_gbps * 1e9)
    prefill = PrefillEngine(cfg, prefill_runner, bootstrap, transfers, tok.eos_token_id)
    decode = DecodeEngine(cfg, decode_runner, bootstrap, tok.eos_token_id)
    built = PDEngine(cfg, bootstrap, transfers, prefill, decode, tok.eos_token_id)
    if start:
        built.start()
    return built
