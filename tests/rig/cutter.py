"""A TCP relay between an RPC client and a server that now and then breaks a
connection in the middle of a record, in either direction: a reply cut after part of
its bytes, as a server killed while sending it leaves it, or a call cut before the
server has all of it. Records are RPC record-marking fragments (RFC 5531 section 11);
which ones are cut, and where, follows a seeded random sequence."""

from __future__ import annotations

import collections
import random
import socket
import struct
import threading
from typing import Callable

LAST_FRAGMENT = 0x80000000

# chance(is_reply, procedure, record_len) -> probability of cutting that record; the
# procedure is the call's (for a reply, that of the call with its XID), None if unknown.
Chance = Callable[[bool, "int | None", int], float]


def sized_chance(reply_cut: float = 0.05, call_cut: float = 0.01,
                 min_cut_reply: int = 65536, min_cut_call: int = 4096) -> Chance:
    """Replies of at least min_cut_reply bytes (READ data) and calls of at least
    min_cut_call bytes (WRITE data), not the small calls of a mount or a lookup."""
    def chance(is_reply: bool, procedure: int | None, record_len: int) -> float:
        least, p = (min_cut_reply, reply_cut) if is_reply else (min_cut_call, call_cut)
        return p if record_len - 4 >= least else 0.0
    return chance


class _Pair:
    """A relayed connection's two sockets, and whether its end has begun."""

    def __init__(self, client: socket.socket, server: socket.socket):
        self.client, self.server = client, server
        self._lock = threading.Lock()
        self._ending = False

    def end_first(self) -> bool:
        """Marks the connection as ending; true for the first caller only."""
        with self._lock:
            first, self._ending = not self._ending, True
            return first


class ConnectionCutter:
    """Listens on a loopback port of its own and relays each connection to
    127.0.0.1:target_port (made in the caller's network namespace, as are the
    relay's threads). Each whole record is cut with the probability `chance` gives
    it: the relay sends its first bytes (anywhere from inside the record mark to its
    last byte but one), then closes both sides. Counts what it cut, by procedure."""

    def __init__(self, target_port: int, seed: int, chance: Chance | None = None):
        self.target_port = target_port
        self.chance = chance or sized_chance()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.connections = 0
        # Connections the relay dropped because it could not reach the server, and
        # connections the server ended itself (not cut, not closed by the client first).
        self.upstream_refused = 0
        self.ended_by_server = 0
        self.replies_cut = 0
        self.calls_cut = 0
        self.replies_cut_by_procedure: collections.Counter[int | None] = collections.Counter()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> ConnectionCutter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                with self._lock:
                    self.upstream_refused += 1
                client.close()
                continue
            with self._lock:
                self.connections += 1
            pair = _Pair(client, server)
            procedures: dict[int, int] = {}   # XID -> procedure of the calls relayed
            threading.Thread(target=self._relay, args=(client, server, pair, False, procedures),
                             daemon=True).start()
            threading.Thread(target=self._relay, args=(server, client, pair, True, procedures),
                             daemon=True).start()

    def _cut_at(self, record: bytes, is_reply: bool, procedures: dict[int, int]) -> int | None:
        """Where to cut this whole record (mark included), or None."""
        procedure = None
        if len(record) >= 28:
            xid = struct.unpack(">I", record[4:8])[0]
            if is_reply:
                procedure = procedures.pop(xid, None)
            else:
                procedure = procedures[xid] = struct.unpack(">I", record[24:28])[0]
        p = self.chance(is_reply, procedure, len(record))
        with self._lock:
            if p <= 0 or self._rng.random() >= p:
                return None
            if is_reply:
                self.replies_cut += 1
                self.replies_cut_by_procedure[procedure] += 1
            else:
                self.calls_cut += 1
            return self._rng.randrange(1, len(record))

    def _relay(self, src: socket.socket, dst: socket.socket, pair: _Pair, is_reply: bool,
               procedures: dict[int, int]) -> None:
        pending = b""
        try:
            while True:
                try:
                    data = src.recv(1 << 20)
                except ConnectionResetError:
                    data = b""   # a reset ends the connection as an end of stream does
                if not data:
                    if is_reply and pair.end_first():
                        with self._lock:
                            self.ended_by_server += 1
                    break
                pending += data
                while len(pending) >= 4:
                    length = struct.unpack(">I", pending[:4])[0] & ~LAST_FRAGMENT
                    if len(pending) < 4 + length:
                        break
                    record, pending = pending[:4 + length], pending[4 + length:]
                    cut = self._cut_at(record, is_reply, procedures)
                    if cut is not None:
                        pair.end_first()
                        dst.sendall(record[:cut])
                        return
                    dst.sendall(record)
        except OSError:
            pass
        finally:
            # Either direction ending ends the connection, as a dead peer's would.
            pair.end_first()
            for s in (pair.client, pair.server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
