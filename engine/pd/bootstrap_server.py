"""The prefill process's bootstrap port: where decode processes reach its rooms over TCP (the
`bootstrap_port` SGLang's router hands both servers), one connection per room.

It is the network face of the `BootstrapWorker` (bootstrap.py), which still owns every room and
applies messages in order: a decode's `prealloc` becomes the worker's PREALLOC with a
`RemoteKVTransfer` standing for the pages the decode reserved, its `decoding`, `abort` and
`close` the worker's own. The room is keyed by the router's `bootstrap_room` (`room_rid`).

Order: the router sends a request to both servers at once, so a decode's `prealloc` may come
before the prefill server has opened the room: it waits here until `open`. A room the prefill
side has already released (its request ended before any decode came) answers a late `prealloc`
with `aborted`, and a decode connection that drops without `close` (its process died) aborts
its room, so no room is left behind either way.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import OrderedDict

from .bootstrap import BootstrapWorker, Room
from .kv_wire import WireError, recv, send
from .transfer import KVTransfer, TransferStatus

log = logging.getLogger("dsv4bench.engine.pd")

RELEASED_MEMORY = 4096  # released rooms remembered, so a late prealloc is answered at once


def room_rid(room: int) -> str:
    """The engine rid of a bootstrap room's request on the prefill server."""
    return f"room-{room}"


class RemoteKVTransfer(KVTransfer):
    """A transfer whose destination pages live in a decode process: the transfer worker sends
    the pages down `conn` (send_pages), and the decode hears how it ended (done, failed or
    aborted) as soon as it is settled, whichever thread settles it."""

    def __init__(self, rid: str, num_pages: int, conn: socket.socket) -> None:
        super().__init__(rid, list(range(num_pages)))  # the decode's page ids are its own business
        self.conn = conn
        self._send_lock = threading.Lock()
        self._told = False

    def send_pages(self, offset: int, data: bytes) -> None:
        with self._send_lock:
            send(self.conn, {"op": "kv", "offset": offset}, data)

    def abort(self) -> None:
        super().abort()
        self._tell()

    def keep_going(self) -> bool:
        going = super().keep_going()
        self._tell()
        return going

    def conclude(self, ok: bool) -> None:
        super().conclude(ok)
        self._tell()

    def _tell(self) -> None:
        """Send the decode the transfer's end, once, when it is settled."""
        status = self.status
        if not status.done:
            return
        with self._send_lock:
            if self._told:
                return
            self._told = True
            if status is TransferStatus.SUCCESS:
                header = {"op": "done", "first_token": self.first_token, "cached_tokens": self.cached_tokens}
            else:
                header = {"op": "failed" if status is TransferStatus.FAILED else "aborted", "error": self.error}
            try:
                send(self.conn, header)
            except WireError:
                pass  # the decode is gone: its connection's reader aborts the room


class BootstrapServer:
    """Accepts decode connections on `port` and relays their room messages to `worker`."""

    def __init__(self, worker: BootstrapWorker, host: str = "127.0.0.1", port: int = 0) -> None:
        self.worker = worker
        self._sock = socket.create_server((host, port))
        self.port = int(self._sock.getsockname()[1])
        self._lock = threading.Lock()
        self._opened: set[str] = set()
        self._pending: dict[str, RemoteKVTransfer] = {}  # prealloc'd before the room was opened
        self._connected: set[str] = set()
        self._released: OrderedDict[str, None] = OrderedDict()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="pd-bootstrap-server", daemon=True)

    # ---- the prefill server's side ------------------------------------------------------

    def open(self, room: Room) -> bool:
        """The prefill server took the room's request: open it (and attach an early prealloc).
        False when a request of the same room is already here (a room is one request's)."""
        with self._lock:
            if room.rid in self._opened:
                return False
            self._opened.add(room.rid)
            self.worker.open(room)
            early = self._pending.pop(room.rid, None)
            if early is not None:
                self.worker.prealloc(room.rid, early)
            return True

    def release(self, rid: str) -> None:
        """The prefill server is done with the room's request. A room no decode reached is
        closed here (a decode that did will close it)."""
        with self._lock:
            if rid in self._connected or rid not in self._opened:
                return
            self._opened.discard(rid)
            self._remember(rid)
            self.worker.abort(rid)
            self.worker.close(rid)

    # ---- the thread -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._sock.close()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), name="pd-bootstrap-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """One decode connection: its prealloc (or, from a decode that refused the request
        before reserving anything, its abort), then its room messages until close."""
        rid = None
        closed = False
        try:
            header, _ = recv(conn)
            if header["op"] not in ("prealloc", "abort") or not isinstance(header.get("room"), int):
                raise WireError(f"a connection must open with a prealloc or an abort, not {header['op']!r}")
            rid = room_rid(header["room"])
            if header["op"] == "abort":
                with self._lock:
                    self._connected.add(rid)
                self._abort(rid)
                return  # and the room is closed: nothing of it is left on either side
            if not isinstance(header.get("num_pages"), int) or header["num_pages"] < 0:
                raise WireError("a prealloc without its page count")
            self._prealloc(rid, RemoteKVTransfer(rid, header["num_pages"], conn))
            while True:
                header, _ = recv(conn)
                op = header["op"]
                if op == "decoding":
                    self.worker.decoding(rid)
                elif op == "abort":
                    self._abort(rid)
                elif op == "close":
                    closed = True
                    return
                else:
                    raise WireError(f"unknown room message {op!r}")
        except WireError as e:
            if rid is not None:
                log.info("bootstrap connection of %s: %s", rid, e)
        finally:
            if rid is not None:
                self._closed(rid, aborted=not closed)
            conn.close()

    def _prealloc(self, rid: str, transfer: RemoteKVTransfer) -> None:
        with self._lock:
            self._connected.add(rid)
            if rid in self._opened:
                self.worker.prealloc(rid, transfer)
            elif rid in self._released:
                transfer.abort()  # the prefill side already gave up: the decode frees its pages now
            else:
                self._pending[rid] = transfer

    def _abort(self, rid: str) -> None:
        with self._lock:
            early = self._pending.pop(rid, None)
        if early is not None:
            early.abort()
        else:
            self.worker.abort(rid)

    def _closed(self, rid: str, aborted: bool) -> None:
        """The decode left the room (a dropped connection first aborts it)."""
        with self._lock:
            self._connected.discard(rid)
            early = self._pending.pop(rid, None)
            if rid in self._opened:
                self._opened.discard(rid)
                self._remember(rid)
                if aborted:
                    self.worker.abort(rid)
                self.worker.close(rid)
        if early is not None:
            early.abort()

    def _remember(self, rid: str) -> None:
        self._released[rid] = None
        while len(self._released) > RELEASED_MEMORY:
            self._released.popitem(last=False)
