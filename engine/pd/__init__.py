"""Prefill/decode disaggregation (`engine serve --pd`), laid out as an SGLang PD deployment:
a prefill and a decode server, each its own process (`halves.py`), behind a PD router (ours,
`http_router.py`, or SGLang's), composed by engine/deployment.py.

A request's way through it:
1. The router sends the same request to both servers with a fresh `bootstrap_room` and the
   prefill's `bootstrap_host` and `bootstrap_port`.
2. Decode (`decode.py`): prealloc queue -> pages for the prompt reserved as the destination of
   a KVTransfer, announced to the prefill's bootstrap port (`bootstrap_client.py`) -> transfer
   queue (waits for the KV).
3. Bootstrap (`bootstrap_server.py` over `bootstrap.py`): the prefill's worker attaches the
   transfer to the room: BOOTSTRAPPED.
4. Prefill (`prefill.py`): bootstrap queue -> prefill (chunked, prefix cache) -> the first token
   is sampled -> inflight queue while the transfer worker (`transfer.py`) sends KV, compressed
   and index-K pages (`kv_wire.py`) into the reserved decode pages.
5. Decode: the request enters RUNNING with the prefill's first token; the decode server
   streams the answer, which the router passes on.

A client that leaves closes the router's connections to both servers, which aborts the request
on each in whatever queue it is. `worker.py` is what each server serves for its engine.
"""
