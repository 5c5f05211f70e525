"""A TCP relay between an RPC client and a server that now and then breaks a
connection in the middle of a record, in either direction: a reply cut after part of
its bytes, as a server killed while sending it leaves it, or a call cut before the
server has all of it. Records are RPC record-marking fragments (RFC 5531 section 11);
which ones are cut, and where, follows a seeded random sequence."""

from __future__ import annotations

import random
import socket
import struct
import threading

LAST_FRAGMENT = 0x80000000


class ConnectionCutter:
    """Listens on a loopback port of its own and relays each connection to
    127.0.0.1:target_port. A reply of at least min_cut_reply bytes is cut with
    probability reply_cut, a call of at least min_cut_call bytes (a WRITE, not the small
    calls of a mount or a lookup) with probability call_cut. A cut sends the
    record's first bytes (anywhere from inside its record mark to its last byte but
    one), then closes both sides."""

    def __init__(self, target_port: int, seed: int, reply_cut: float = 0.05,
                 call_cut: float = 0.01, min_cut_reply: int = 65536, min_cut_call: int = 4096):
        self.target_port = target_port
        self.reply_cut, self.call_cut = reply_cut, call_cut
        self.min_cut_reply, self.min_cut_call = min_cut_reply, min_cut_call
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.connections = 0
        self.replies_cut = 0
        self.calls_cut = 0
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
                client.close()
                continue
            with self._lock:
                self.connections += 1
            pair = (client, server)
            threading.Thread(target=self._relay, args=(client, server, pair, False), daemon=True).start()
            threading.Thread(target=self._relay, args=(server, client, pair, True), daemon=True).start()

    def _cut_at(self, record_len: int, replies: bool) -> int | None:
        """Where to cut a record of record_len bytes (mark included), or None."""
        with self._lock:
            least, chance = ((self.min_cut_reply, self.reply_cut) if replies
                             else (self.min_cut_call, self.call_cut))
            if record_len - 4 < least or self._rng.random() >= chance:
                return None
            if replies:
                self.replies_cut += 1
            else:
                self.calls_cut += 1
            return self._rng.randrange(1, record_len)

    def _relay(self, src: socket.socket, dst: socket.socket, pair, replies: bool) -> None:
        pending = b""
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                pending += data
                while len(pending) >= 4:
                    length = struct.unpack(">I", pending[:4])[0] & ~LAST_FRAGMENT
                    if len(pending) < 4 + length:
                        break
                    cut = self._cut_at(4 + length, replies)
                    if cut is not None:
                        dst.sendall(pending[:cut])
                        return
                    dst.sendall(pending[:4 + length])
                    pending = pending[4 + length:]
        except OSError:
            pass
        finally:
            # Either direction ending ends the connection, as a dead peer's would.
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
