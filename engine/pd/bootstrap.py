"""The bootstrap handshake between the prefill and the decode server, and the worker that runs it.

Each request gets a `Room` (SGLang's bootstrap room), opened by the router before either server
sees the request. The decode server reserves pages and sends their `KVTransfer` to the room
(`prealloc`); the room is then BOOTSTRAPPED and the prefill server may compute the prompt. Until
the KV has arrived, the room decides the transfer's fate: an ABORT from either server aborts
the room and its transfer, which is how each side learns of the other's aborts. Once the
decode server runs the request the room is DECODING, and the decode server closes the room
when the request leaves it.

One thread, the `BootstrapWorker`, owns every room's state and applies messages in order:
OPEN, PREALLOC, DECODING, ABORT, CLOSE. The servers only read room states, so when this
thread stops, every request waiting on a room (in the prefill bootstrap queue, or for its KV
in the decode transfer queue) waits for ever, aborted or not.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any

from .transfer import KVTransfer

log = logging.getLogger("dsv4bench.engine.pd")


class RoomState(enum.Enum):
    BOOTSTRAPPING = "bootstrapping"  # waiting for the decode server's page reservation
    BOOTSTRAPPED = "bootstrapped"  # the decode's KVTransfer is attached: the prefill may compute
    DECODING = "decoding"  # the KV arrived; the request lives on the decode server alone
    ABORTED = "aborted"


@dataclass(eq=False)
class Room:
    """One request's handshake. Written only by the bootstrap worker, read by anyone."""

    rid: str
    state: RoomState = RoomState.BOOTSTRAPPING
    transfer: KVTransfer | None = None


class UnexpectedAbort(RuntimeError):
    """An ABORT for a room already DECODING, under the planted `bootstrap-stall` fault."""


class BootstrapWorker:
    """Applies handshake messages to rooms on its own thread (or on the caller's, via `drain`).

    `stall_on_unexpected_abort` is the planted `bootstrap-stall` fault: ABORT handling written
    for requests whose KV has not moved yet raises on a room already DECODING (a client that
    leaves while its answer streams, as every client of a killed agent does), and the thread
    dies with it.
    """

    def __init__(self, stall_on_unexpected_abort: bool = False) -> None:
        self.stall_on_unexpected_abort = stall_on_unexpected_abort
        self.rooms: dict[str, Room] = {}  # open rooms; the worker thread's own
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pd-bootstrap", daemon=True)

    # ---- any thread ---------------------------------------------------------------------

    def open(self, room: Room) -> None:
        """The router: a new request's room, before the servers see the request."""
        self.inbox.put(("open", room))

    def prealloc(self, rid: str, transfer: KVTransfer) -> None:
        """The decode server: pages for `rid` are reserved; here is where its KV goes."""
        self.inbox.put(("prealloc", (rid, transfer)))

    def decoding(self, rid: str) -> None:
        """The decode server: the KV of `rid` arrived and it decodes."""
        self.inbox.put(("decoding", rid))

    def abort(self, rid: str) -> None:
        """Either server: `rid` is aborted there; its room and transfer with it, unless it decodes."""
        self.inbox.put(("abort", rid))

    def close(self, rid: str) -> None:
        """The decode server: `rid` left it (finished or aborted); the room is done."""
        self.inbox.put(("close", rid))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.inbox.put(("stop", None))
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ---- the worker thread ----------------------------------------------------------------

    def _main(self) -> None:
        try:
            while (item := self.inbox.get())[0] != "stop":
                self.handle(*item)
        except BaseException as e:  # the thread is gone: the rooms it owns are frozen
            self.error = e
            log.exception("bootstrap worker died")

    def drain(self) -> None:
        """Apply every pending message on the calling thread (tests drive the worker so)."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] != "stop":
                self.handle(*item)

    def handle(self, kind: str, payload: Any) -> None:
        if kind == "open":
            room: Room = payload
            assert room.rid not in self.rooms, f"room {room.rid} opened twice"
            self.rooms[room.rid] = room
        elif kind == "prealloc":
            rid, transfer = payload
            self._on_prealloc(rid, transfer)
        elif kind == "decoding":
            room = self.rooms.get(payload)
            if room is not None and room.state is RoomState.BOOTSTRAPPED:
                room.state = RoomState.DECODING
        elif kind == "abort":
            self._on_abort(payload)
        elif kind == "close":
            self.rooms.pop(payload, None)
        else:
            raise ValueError(f"unknown bootstrap message {kind!r}")

    def _on_prealloc(self, rid: str, transfer: KVTransfer) -> None:
        room = self.rooms.get(rid)
        if room is None or room.state is not RoomState.BOOTSTRAPPING:
            # The prefill side already gave up on it: no KV will come, let the decode free pages.
            transfer.abort()
            return
        room.transfer = transfer
        room.state = RoomState.BOOTSTRAPPED

    def _on_abort(self, rid: str) -> None:
        room = self.rooms.get(rid)
        if room is None or room.state is RoomState.ABORTED:
            return  # closed, or aborted already by the other server
        if room.state is RoomState.DECODING:
            if self.stall_on_unexpected_abort:
                raise UnexpectedAbort(f"ABORT for room {rid} in state {room.state.name}")
            return  # the KV has moved: nothing of it is left here to cancel
        room.state = RoomState.ABORTED
        if room.transfer is not None:
            room.transfer.abort()
