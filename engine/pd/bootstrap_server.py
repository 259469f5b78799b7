"""The prefill process's bootstrap port: where decode processes reach its rooms over TCP (the
`bootstrap_port` SGLang's router hands both servers), one connection per room.

It is the network face of the `BootstrapWorker` (bootstrap.py), which still owns every room and
applies messages in order: a decode's `prealloc` becomes the worker's PREALLOC with a
`RemoteKVTransfer` standing for the pages the decode reserved, its `decoding`, `abort` and
`close` the worker's own. Connections name the router's `bootstrap_room` number; the worker
knows the room by its prefill request's rid (`room_rid`).

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
from collections.abc import Callable

from ..request import HEALTH_PROBE_PREFIX
from .bootstrap import BootstrapWorker, Room
from .kv_wire import WireError, recv, send
from .transfer import KVTransfer, TransferStatus

log = logging.getLogger("dsv4bench.engine.pd")

RELEASED_MEMORY = 4096  # released rooms remembered, so a late prealloc is answered at once


def room_rid(room: int, health_probe: bool = False) -> str:
    """The engine rid of a bootstrap room's request on the prefill server (a health probe's
    carries the probe prefix, so the gauges and counters leave it out)."""
    return f"{HEALTH_PROBE_PREFIX if health_probe else ''}room-{room}"


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
        """A connection that cannot take the pages is a decode that left (its process died, or
        its reader closed the socket a moment before): the transfer is aborted, as the decode's
        own drop aborts the room, not failed. The worker stops at its next `keep_going`."""
        with self._send_lock:
            try:
                send(self.conn, {"op": "kv", "offset": offset}, data)
            except WireError as e:
                log.info("room %s: the decode left mid-transfer (%s)", self.rid, e)
                super().abort()  # not self.abort: telling the decode takes the send lock held here

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
        self._opened: dict[int, str] = {}  # room number -> the room's rid at the worker
        self._pending: dict[int, RemoteKVTransfer] = {}  # prealloc'd before the room was opened
        self._connected: set[int] = set()
        self._released: OrderedDict[int, None] = OrderedDict()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="pd-bootstrap-server", daemon=True)

    # ---- the prefill server's side ------------------------------------------------------

    def open(self, number: int, room: Room) -> bool:
        """The prefill server took the request of room `number`: open it (and attach an early
        prealloc). False when a request of the same room is already here (one room, one request)."""
        with self._lock:
            if number in self._opened:
                return False
            self._opened[number] = room.rid
            self.worker.open(room)
            if number in self._released:  # its decode came and went first: nothing will take the KV
                self.worker.abort(room.rid)
                return True
            early = self._pending.pop(number, None)
            if early is not None:
                early.rid = room.rid
                self.worker.prealloc(room.rid, early)
            return True

    def release(self, number: int) -> None:
        """The prefill server is done with room `number`'s request. A room no decode reached
        is closed here (a decode that did will close it)."""
        with self._lock:
            if number in self._connected or number not in self._opened:
                return
            rid = self._opened.pop(number)
            self._remember(number)
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
        number = None
        closed = False
        try:
            header, _ = recv(conn)
            if header["op"] not in ("prealloc", "abort") or not isinstance(header.get("room"), int):
                raise WireError(f"a connection must open with a prealloc or an abort, not {header['op']!r}")
            number = header["room"]
            if header["op"] == "abort":
                with self._lock:
                    self._connected.add(number)
                self._abort(number)
                return  # and the room is closed: nothing of it is left on either side
            if not isinstance(header.get("num_pages"), int) or header["num_pages"] < 0:
                raise WireError("a prealloc without its page count")
            self._prealloc(number, RemoteKVTransfer(room_rid(number), header["num_pages"], conn))
            while True:
                header, _ = recv(conn)
                op = header["op"]
                if op == "decoding":
                    self._to_worker(number, self.worker.decoding)
                elif op == "abort":
                    self._abort(number)
                elif op == "close":
                    closed = True
                    return
                else:
                    raise WireError(f"unknown room message {op!r}")
        except WireError as e:
            if number is not None:
                log.info("bootstrap connection of room %s: %s", number, e)
        finally:
            if number is not None:
                self._closed(number, aborted=not closed)
            conn.close()

    def _prealloc(self, number: int, transfer: RemoteKVTransfer) -> None:
        with self._lock:
            self._connected.add(number)
            if number in self._opened:
                transfer.rid = self._opened[number]
                self.worker.prealloc(transfer.rid, transfer)
            elif number in self._released:
                transfer.abort()  # the prefill side already gave up: the decode frees its pages now
            else:
                self._pending[number] = transfer

    def _to_worker(self, number: int, message: Callable[[str], None]) -> None:
        with self._lock:
            rid = self._opened.get(number)
        if rid is not None:
            message(rid)

    def _abort(self, number: int) -> None:
        with self._lock:
            early = self._pending.pop(number, None)
            if early is not None:
                self._remember(number)  # a prefill arriving later opens the room aborted
        if early is not None:
            early.abort()
        else:
            self._to_worker(number, self.worker.abort)

    def _closed(self, number: int, aborted: bool) -> None:
        """The decode left the room (a dropped connection first aborts it)."""
        with self._lock:
            self._connected.discard(number)
            early = self._pending.pop(number, None)
            rid = self._opened.pop(number, None)
            self._remember(number)  # also when the prefill has not come yet: it will find it gone
            if rid is not None:
                if aborted:
                    self.worker.abort(rid)
                self.worker.close(rid)
        if early is not None:
            early.abort()

    def _remember(self, number: int) -> None:
        self._released[number] = None
        while len(self._released) > RELEASED_MEMORY:
            self._released.popitem(last=False)
