"""Authenticated store connections between hosts. TCPStore has none, and any client may list its keys, so with
--nnodes > 1 node 0's store listens on loopback only; a gateway on --master-addr:--master-port admits a connection
only once it has proved it holds the job's secret, and relays its bytes to the store. Every other node's launcher
runs a relay on its own loopback, which its ranks use as their store; the relay makes that proof for each
connection. The proof is mutual (each side signs the other's fresh random challenge with HMAC-SHA256 of the
secret), so the secret never crosses the network and a rank never talks to a store that does not know it.

Threads, all daemons that end with the launcher: one accept loop per listener, two copy threads per connection.
A handshake has HANDSHAKE_S; a relayed connection lives as long as both of its ends.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading

HANDSHAKE_S = 10.0
_NONCE = 32
_LOOPBACK = "127.0.0.1"


class Refused(Exception):
    """The other end does not hold this job's secret (or is not a pypto-launch gateway)."""


def _proof(secret: str, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret.encode(), role + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise Refused("the other end closed the connection during the handshake")
        data += chunk
    return data


def _admit(conn: socket.socket, secret: str) -> None:
    """Gateway side: the client proves the secret first, then the gateway does. Refused on a bad proof."""
    mine = os.urandom(_NONCE)
    conn.sendall(mine)
    theirs = _recv_exact(conn, _NONCE)
    if not hmac.compare_digest(_recv_exact(conn, 32), _proof(secret, b"client", mine)):
        raise Refused("a client without the job's secret")
    conn.sendall(_proof(secret, b"gateway", theirs))


def handshake(conn: socket.socket, secret: str) -> None:
    """Client side of `_admit`; Refused when the gateway does not know the secret."""
    theirs = _recv_exact(conn, _NONCE)
    mine = os.urandom(_NONCE)
    conn.sendall(mine + _proof(secret, b"client", theirs))
    if not hmac.compare_digest(_recv_exact(conn, 32), _proof(secret, b"gateway", mine)):
        raise Refused("the gateway does not know the job's secret")


class Listener:
    """A listening socket whose accept loop hands each connection to `serve(conn)` on its own thread."""

    def __init__(self, sock: socket.socket, serve):
        self.sock, self._serve = sock, serve
        self.port = sock.getsockname()[1]
        threading.Thread(target=self._accept, name=f"pypto-launch listener :{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the job ended
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def gateway(addr: str, port: int, store_port: int, secret: str) -> Listener:
    """Listen on `addr:port` (0: a free port); relay admitted connections to the store on loopback:store_port."""
    from pypto_rt.collective.store_rendezvous import listen

    def serve(conn: socket.socket) -> None:
        try:
            conn.settimeout(HANDSHAKE_S)
            _admit(conn, secret)
            upstream = socket.create_connection((_LOOPBACK, store_port), timeout=HANDSHAKE_S)
        except (OSError, Refused):
            conn.close()
            return
        _pipe(conn, upstream)
    return Listener(listen(addr, port), serve)


def relay(remote: tuple[str, int], secret: str) -> Listener:
    """Listen on a free loopback port; relay each connection to the gateway at `remote` after the handshake."""
    from pypto_rt.collective.store_rendezvous import listen

    def serve(conn: socket.socket) -> None:
        try:
            upstream = connect(remote, secret)
        except (OSError, Refused):
            conn.close()
            return
        _pipe(conn, upstream)
    return Listener(listen(_LOOPBACK, 0), serve)


def connect(remote: tuple[str, int], secret: str) -> socket.socket:
    """An admitted connection to the gateway at `remote`; OSError if unreachable, Refused if the secret differs."""
    upstream = socket.create_connection(remote, timeout=HANDSHAKE_S)
    try:
        handshake(upstream, secret)
    except BaseException:
        upstream.close()
        raise
    return upstream


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions end; then close both."""
    for s in (a, b):
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    done = threading.Barrier(2, action=lambda: (a.close(), b.close()))
    threading.Thread(target=_copy, args=(b, a, done), daemon=True).start()
    _copy(a, b, done)


def _copy(src: socket.socket, dst: socket.socket, done: threading.Barrier) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    try:
        done.wait()
    except threading.BrokenBarrierError:
        pass
