"""The wire between a prefill and a decode process: framed messages over one TCP connection per
bootstrap room, and the codec that turns pool pages into bytes and back.

A frame is a JSON header (4-byte big-endian length, then UTF-8 JSON object) and a payload
(8-byte length, then raw bytes; empty for control messages). The peer is another process of
ours on loopback, but a frame is still checked: a header that is no JSON object, or a length
past the limits, is a `WireError` and closes the connection, never a crash of the thread that
reads it.

The messages of a room, in the order they flow (bootstrap_server.py, bootstrap_client.py):
    decode -> prefill  prealloc {room, num_pages, bytes_per_page}   pages reserved
    prefill -> decode  kv {offset} + pages' bytes                   repeated, chunk by chunk
    prefill -> decode  done {first_token, cached_tokens}            the KV is all there
                     | failed {error} | aborted {error}
    decode -> prefill  decoding | abort                             then the decode closes
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

import torch

from ..model.kv_pools import KVPools

MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 1 << 30  # one chunk of pages; far above what a chunk of this engine carries

_HEADER = struct.Struct(">I")
_PAYLOAD = struct.Struct(">Q")


class WireError(Exception):
    """The connection broke or carried a frame we refuse; the room it served is over."""


def send(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    head = json.dumps(header, separators=(",", ":")).encode()
    try:
        sock.sendall(_HEADER.pack(len(head)) + head + _PAYLOAD.pack(len(payload)) + payload)
    except OSError as e:
        raise WireError(f"send failed: {e}") from None


def _read_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except OSError as e:
            raise WireError(f"receive failed: {e}") from None
        if not chunk:
            raise WireError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """The next frame: (header, payload). WireError on EOF or a frame past the limits."""
    (n,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if n > MAX_HEADER_BYTES:
        raise WireError(f"a {n}-byte header is over the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = json.loads(_read_exact(sock, n))
    except ValueError:
        raise WireError("a header that is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise WireError("a header that is no JSON object with an 'op'")
    (m,) = _PAYLOAD.unpack(_read_exact(sock, _PAYLOAD.size))
    if m > MAX_PAYLOAD_BYTES:
        raise WireError(f"a {m}-byte payload is over the {MAX_PAYLOAD_BYTES}-byte limit")
    return header, _read_exact(sock, m) if m else b""


class PageCodec:
    """Pages of every pooled tensor (KVPools.page_tensors order) as one byte string: window KV,
    compressed KV, index keys and their scales, so the decode side continues exactly where a
    unified engine would. Bytes, not values: exact for fp8 and on any device."""

    def __init__(self, pools: KVPools) -> None:
        self.tensors = pools.page_tensors()
        self.bytes_per_page = pools.bytes_per_page()

    def pack(self, pages: Sequence[int]) -> bytes:
        idx = torch.tensor(list(pages), dtype=torch.long, device=self.tensors[0].device)
        parts = [t.view(torch.uint8).index_select(0, idx).reshape(-1).cpu() for t in self.tensors]
        return torch.cat(parts).numpy().tobytes()

    def unpack(self, pages: Sequence[int], data: bytes) -> None:
        """Write `data` (pack's output for as many pages) onto `pages`."""
        if len(data) != len(pages) * self.bytes_per_page:
            raise WireError(f"{len(data)} bytes for {len(pages)} pages of {self.bytes_per_page}")
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        idx = torch.tensor(list(pages), dtype=torch.long, device=self.tensors[0].device)
        at = 0
        for t in self.tensors:
            raw = t.view(torch.uint8)
            size = len(pages) * raw[0].numel()
            raw.index_copy_(0, idx, flat[at : at + size].view(len(pages), *raw.shape[1:]).to(raw.device))
            at += size
