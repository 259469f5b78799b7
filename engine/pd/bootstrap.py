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


# ---- the worker's messages, in the order a request's room sees them ------------------------------


@dataclass(frozen=True)
class OpenRoom:
    room: Room


@dataclass(frozen=True)
class Prealloc:
    rid: str
    transfer: KVTransfer


@dataclass(frozen=True)
class Decoding:
    rid: str


@dataclass(frozen=True)
class AbortRoom:
    rid: str


@dataclass(frozen=True)
class CloseRoom:
    rid: str


@dataclass(frozen=True)
class StopWorker:
    pass


BootstrapMessage = OpenRoom | Prealloc | Decoding | AbortRoom | CloseRoom | StopWorker


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
        self.inbox: queue.Queue[BootstrapMessage] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pd-bootstrap", daemon=True)

    # ---- any thread ---------------------------------------------------------------------

    def open(self, room: Room) -> None:
        """The router: a new request's room, before the servers see the request."""
        self.inbox.put(OpenRoom(room))

    def prealloc(self, rid: str, transfer: KVTransfer) -> None:
        """The decode server: pages for `rid` are reserved; here is where its KV goes."""
        self.inbox.put(Prealloc(rid, transfer))

    def decoding(self, rid: str) -> None:
        """The decode server: the KV of `rid` arrived and it decodes."""
        self.inbox.put(Decoding(rid))

    def abort(self, rid: str) -> None:
        """Either server: `rid` is aborted there; its room and transfer with it, unless it decodes."""
        self.inbox.put(AbortRoom(rid))

    def close(self, rid: str) -> None:
        """The decode server: `rid` left it (finished or aborted); the room is done."""
        self.inbox.put(CloseRoom(rid))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.inbox.put(StopWorker())
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ---- the worker thread ----------------------------------------------------------------

    def _main(self) -> None:
        try:
            while not isinstance(msg := self.inbox.get(), StopWorker):
                self.handle(msg)
        except BaseException as e:  # the thread is gone: the rooms it owns are frozen
            self.error = e
            log.exception("bootstrap worker died")

    def drain(self) -> None:
        """Apply every pending message on the calling thread (tests drive the worker so)."""
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if not isinstance(msg, StopWorker):
                self.handle(msg)

    def handle(self, msg: BootstrapMessage) -> None:
        if isinstance(msg, OpenRoom):
            assert msg.room.rid not in self.rooms, f"room {msg.room.rid} opened twice"
            self.rooms[msg.room.rid] = msg.room
        elif isinstance(msg, Prealloc):
            self._on_prealloc(msg.rid, msg.transfer)
        elif isinstance(msg, Decoding):
            room = self.rooms.get(msg.rid)
            if room is not None and room.state is RoomState.BOOTSTRAPPED:
                room.state = RoomState.DECODING
        elif isinstance(msg, AbortRoom):
            self._on_abort(msg.rid)
        elif isinstance(msg, CloseRoom):
            room = self.rooms.pop(msg.rid, None)
            if room is not None and room.state in (RoomState.BOOTSTRAPPING, RoomState.BOOTSTRAPPED):
                # Closed before its KV moved: no one will send or take it now, so a prefill
                # request still waiting on the room must hear that it ended.
                room.state = RoomState.ABORTED
                if room.transfer is not None:
                    room.transfer.abort()

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
