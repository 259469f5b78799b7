"""Drop a server's prefix cache, where its kind offers a way (servers/kinds.py `cache_flush`).

--recheck sends greedy requests again after the load to see whether the load changed their
answers. A race that wrote wrong KV into the prefix cache (HiCache's index-K read racing a
host-tier load) leaves that KV cached: sent again over the same cache, the request reads it and
gives the load's wrong answer again, so nothing differs. With the cache dropped first, the
request is computed afresh. The flush is asked once, after the load has drained; a server that
refuses because requests still run (SGLang answers 400) is asked again for a few seconds.
Nothing here judges the server: a flush refused or not offered is said, and the recheck goes on
over the cache as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from dsv4bench.servers.kinds import NOT_THERE, kind
from dsv4bench.terminal import visible

FLUSH_RETRY_S = 5.0  # how long a flush refused while requests run is asked again
FLUSH_TIMEOUT_S = 10.0  # one flush request


@dataclass(frozen=True)
class CacheFlush:
    """What became of one flush: `flushed` True when the server said it dropped its cache."""

    path: str | None
    flushed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "flushed": self.flushed, "detail": self.detail}


async def flush_prefix_cache(client: httpx.AsyncClient, root: str, kind_name: str | None) -> CacheFlush:
    """POST the kind's flush path at `root` (http://h:p); never raises for the server's answer."""
    path = kind(kind_name).cache_flush
    if path is None:
        return CacheFlush(None, False, f"not offered by a server of kind {kind(kind_name).title}")
    detail = ""
    with anyio.move_on_after(FLUSH_RETRY_S):
        while True:
            try:
                r = await client.post(f"{root}{path}", timeout=FLUSH_TIMEOUT_S)
            except httpx.HTTPError as e:
                return CacheFlush(path, False, f"{path}: {type(e).__name__}")
            if r.status_code == 200:
                return CacheFlush(path, True, f"{path}: HTTP 200")
            detail = f"{path}: HTTP {r.status_code} {visible(r.text[:120])}".rstrip()
            if r.status_code in NOT_THERE:
                return CacheFlush(path, False, f"{path} not offered (HTTP {r.status_code})")
            if r.status_code != 400:  # 400: requests still running; anything else will not change
                return CacheFlush(path, False, detail)
            await anyio.sleep(0.5)
    return CacheFlush(path, False, detail or f"{path}: no answer within {FLUSH_RETRY_S:g} s")
