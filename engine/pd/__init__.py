"""Prefill/decode disaggregation (`engine serve --pd`), shaped like an SGLang PD deployment.

A request's way through it:
1. The router (`router.py`, served by engine/server.py's app) renders the OpenAI request,
   opens the request's bootstrap room and sends the request to both servers.
2. Decode (`decode.py`): prealloc queue -> pages for the prompt reserved as the destination of
   a KVTransfer, sent to the room -> transfer queue (waits for the KV).
3. Bootstrap (`bootstrap.py`): the worker attaches the transfer to the room: BOOTSTRAPPED.
4. Prefill (`prefill.py`): bootstrap queue -> prefill (chunked, prefix cache) -> the first token
   is sampled -> inflight queue while the transfer worker (`transfer.py`) copies KV, compressed
   and index-K pages into the reserved decode pages.
5. Decode: the request enters RUNNING with the prefill's first token; the router streams the
   decode server's tokens as OpenAI chunks.

An abort (client disconnect, /abort_request) reaches both servers and leaves every queue.
`serve.py` is the composition root; `http.py` the prefill and decode servers' endpoints.
"""

from .serve import PDConfig, PDEngine, build_pd_engine, serve_pd

__all__ = ["PDConfig", "PDEngine", "build_pd_engine", "serve_pd"]
