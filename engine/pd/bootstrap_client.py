"""The decode process's side of the bootstrap handshake: one TCP connection per request to the
room on the prefill server named by the request's `bootstrap_host`, `bootstrap_port` and
`bootstrap_room` (bootstrap_server.py speaks the other end, kv_wire.py the frames).

It offers the DecodeEngine what a `BootstrapWorker` does (`prealloc`, `decoding`, `abort`,
`close`), so the decode engine is the one the in-process test rig drives too. The request's local
`KVTransfer` (its reserved pages) is concluded here: a reader thread per connection writes
the arriving pages into the decode pools and settles the transfer when the prefill says the
KV is all there, failed or was aborted. A dropped connection fails it, so the decode queue
lets go and the client hears why.

A health probe has no prefill behind it (`open_probe`): its KV is taken as arrived when its
pages are reserved, as SGLang's fake bootstrap receiver does, so the probe goes through the
decode engine's queues and one decode step and nothing else.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field

from ..model.kv_pools import KVPools
from ..prepared_request import Bootstrap
from .kv_wire import PageCodec, WireError, recv, send
from .transfer import KVTransfer, TransferStatus

log = logging.getLogger("dsv4bench.engine.pd")

CONNECT_TIMEOUT_S = 5.0


@dataclass(eq=False)
class _Channel:
    address: Bootstrap | None  # None: a health probe's, with no room anywhere
    sock: socket.socket | None = None
    transfer: KVTransfer | None = None
    outbox: list[dict] = field(default_factory=list)  # room messages sent before the connection is up
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    probe_token: int = 0  # a probe's first token (its last prompt token stands in)


class BootstrapClient:
    """Rooms of the decode server's requests, by engine rid."""

    def __init__(self, pools: KVPools) -> None:
        self.codec = PageCodec(pools)
        self._channels: dict[str, _Channel] = {}
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return True  # no thread of its own outlives a request: nothing here can die for all

    def start(self) -> None:
        pass  # a connection starts with its request

    def stop(self) -> None:
        """Close every request's connection (the decode server is going away)."""
        with self._lock:
            rids = list(self._channels)
        for rid in rids:
            self.close(rid)

    # ---- the decode server: before its request enters the engine ----------------------------

    def open(self, rid: str, address: Bootstrap) -> None:
        with self._lock:
            self._channels[rid] = _Channel(address)

    def open_probe(self, rid: str, first_token: int) -> None:
        """A health probe's channel: no connection; its KV counts as arrived once reserved."""
        with self._lock:
            self._channels[rid] = _Channel(None, probe_token=first_token)

    # ---- the DecodeEngine (its thread) ----------------------------------------------------

    def prealloc(self, rid: str, transfer: KVTransfer) -> None:
        """Pages for `rid` are reserved: connect to its room (on a thread of its own, so a slow
        prefill never holds the engine) and wait there for the KV."""
        channel = self._channels.get(rid)
        if channel is None:  # no room was opened for it: no KV will ever come
            transfer.abort()
            return
        channel.transfer = transfer
        if channel.address is None:  # a health probe: the pages hold what they hold
            if transfer.begin([], channel.probe_token, 0):
                transfer.conclude(ok=True)
            return
        threading.Thread(target=self._run, args=(rid, channel), name="pd-kv-recv", daemon=True).start()

    def decoding(self, rid: str) -> None:
        self._tell(rid, {"op": "decoding"})

    def abort(self, rid: str) -> None:
        """`rid` is aborted here: its room hears it (in every state), and a transfer still
        waiting or arriving is aborted; pages being written are let go only once the reader
        has stopped (the transfer settles ABORTED at its next frame)."""
        channel = self._channels.get(rid)
        if channel is None:
            return
        if channel.address is None:  # a health probe: no room to tell
            if channel.transfer is not None:
                channel.transfer.abort()
            return
        if channel.transfer is None:  # refused before any reservation: tell the room on its own
            threading.Thread(
                target=self._abort_room, args=(channel.address,), name="pd-room-abort", daemon=True
            ).start()
            return
        channel.transfer.abort()
        self._tell(rid, {"op": "abort"})

    def close(self, rid: str) -> None:
        with self._lock:
            channel = self._channels.pop(rid, None)
        if channel is None:
            return
        self._tell_channel(channel, {"op": "close"})
        with channel.lock:
            channel.closed = True
            if channel.sock is not None:
                channel.sock.close()

    # ---- the connection ---------------------------------------------------------------------

    def _tell(self, rid: str, header: dict) -> None:
        channel = self._channels.get(rid)
        if channel is not None:
            self._tell_channel(channel, header)

    @staticmethod
    def _tell_channel(channel: _Channel, header: dict) -> None:
        with channel.lock:
            if channel.closed:
                return
            if channel.sock is None:
                channel.outbox.append(header)
                return
            try:
                send(channel.sock, header)
            except WireError:
                pass  # the reader sees the same broken connection and fails the transfer

    @staticmethod
    def _abort_room(a: Bootstrap) -> None:
        try:
            with socket.create_connection((a.host, a.port), timeout=CONNECT_TIMEOUT_S) as sock:
                send(sock, {"op": "abort", "room": a.room})
        except (OSError, WireError) as e:
            log.info("could not tell room %s of its abort: %s", a.room, e)

    def _run(self, rid: str, channel: _Channel) -> None:
        transfer = channel.transfer
        assert transfer is not None
        a = channel.address
        try:
            sock = socket.create_connection((a.host, a.port), timeout=CONNECT_TIMEOUT_S)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            self._fail(transfer, f"cannot reach the prefill server's bootstrap port {a.host}:{a.port}: {e}")
            return
        with channel.lock:
            if channel.closed:
                sock.close()
                return
            channel.sock = sock
            try:
                send(
                    sock,
                    {
                        "op": "prealloc",
                        "room": a.room,
                        "num_pages": len(transfer.dst_pages),
                        "bytes_per_page": self.codec.bytes_per_page,
                    },
                )
                for header in channel.outbox:
                    send(sock, header)
            except WireError as e:
                self._fail(transfer, f"the KV connection broke: {e}")
                return
            channel.outbox.clear()
        self._receive(sock, transfer, channel)

    def _receive(self, sock: socket.socket, transfer: KVTransfer, channel: _Channel) -> None:
        try:
            while not transfer.status.done:
                header, payload = recv(sock)
                op = header["op"]
                if op == "kv":
                    self._pages(transfer, header, payload)
                elif op == "done":
                    if transfer.status is TransferStatus.WAITING_FOR_INPUT:  # a prompt of no pages
                        transfer.begin([], -1, 0)
                    transfer.first_token, transfer.cached_tokens = (
                        header.get("first_token"),
                        header.get("cached_tokens", 0),
                    )
                    if not isinstance(transfer.first_token, int):
                        raise WireError("a done without its first token")
                    if transfer.keep_going():
                        transfer.conclude(ok=True)
                elif op in ("failed", "aborted"):
                    transfer.error = header.get("error") if isinstance(header.get("error"), str) else None
                    self._fail(transfer, transfer.error, aborted=op == "aborted")
                else:
                    raise WireError(f"unknown KV message {op!r}")
        except WireError as e:
            if not channel.closed:
                self._fail(transfer, f"the KV connection broke: {e}")

    def _pages(self, transfer: KVTransfer, header: dict, payload: bytes) -> None:
        if transfer.status is TransferStatus.WAITING_FOR_INPUT and not transfer.begin([], -1, 0):
            return  # aborted before the first page: nothing written, nothing to wait for
        if not transfer.keep_going():
            return  # aborted meanwhile: the transfer is ABORTED now and its pages may go
        offset = header.get("offset")
        n = len(payload) // max(1, self.codec.bytes_per_page)
        if not isinstance(offset, int) or offset < 0 or offset + n > len(transfer.dst_pages):
            raise WireError(f"pages at offset {offset!r} past the {len(transfer.dst_pages)} reserved")
        self.codec.unpack(transfer.dst_pages[offset : offset + n], payload)

    @staticmethod
    def _fail(transfer: KVTransfer, error: str | None, aborted: bool = False) -> None:
        """Settle the local transfer without success: ABORTED or FAILED, with why."""
        if error is not None and transfer.error is None:
            transfer.error = error
        if transfer.status is TransferStatus.WAITING_FOR_INPUT:
            if not aborted:
                transfer.begin([], -1, 0)
                transfer.conclude(ok=False)
            else:
                transfer.abort()
        elif transfer.status is TransferStatus.TRANSFERRING:
            if aborted:
                transfer.abort()
                transfer.keep_going()
            else:
                transfer.conclude(ok=False)
