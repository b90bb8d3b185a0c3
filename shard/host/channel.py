"""A direct connection from the coordinator to a shard actor for its rounds.

Every Ray actor call costs ~0.5 ms of CPU in the caller and ~0.4 ms in the actor here; at a
few hundred rounds a second per shard that was a third of a core, more than the matching
itself. So the rounds (``ShardActor.apply_wire``'s bytes) go over a TCP connection that the
actor opens on request (``ShardActor.channel``, itself a Ray call): the actor stays a Ray actor
(created, restarted and loaded through Ray), only its hot path skips Ray's task machinery.

Protocol (one connection, calls answered in the order sent):

* a handshake in which the ``TOKEN_BYTES`` token the actor handed out through Ray never
  crosses the network: the server sends a random challenge, the client answers with its own
  challenge and the HMAC-SHA256 of both under the token, and the server proves it holds the
  token the same way. A connection that has not authenticated within ``AUTH_TIMEOUT_S``, or
  answers wrongly, is closed; at most ``MAX_CONNECTIONS`` are open at once;
* request: ``!Id`` (payload length, ``now``) then the payload;
* answer: ``!BI`` (``OK`` or ``FAILED``, length) then the answer, or for a failed call the
  error text (the caller raises ``UnavailableError``: the shard is then rebuilt).

Payloads are ``shard.wire`` bytes (msgpack), never pickles: whatever arrives, the worst it can
do is be refused. Requests are at most ``MAX_REQUEST_BYTES``.

``ChannelServer`` runs in the actor on threads (one per connection), calling ``handler``
under the actor's lock; ``Channel`` is the coordinator's asyncio end.

A bulk load replaces the shard's state, so a round sent before it must not be applied after
it (a shard that was stopped, SIGSTOP, then loaded and continued would otherwise read the
rounds still waiting in its socket and apply them to the new state): ``fence()`` (the actor
calls it when it loads) turns every connection opened before it away. A request on such a
connection is answered FAILED and the connection closed; the coordinator opens a new one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import logging
import secrets
import socket
import struct
import threading
from collections.abc import Callable

from shard.errors import UnavailableError

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
NONCE_BYTES = 32
AUTH_TIMEOUT_S = 2.0
"""A connection that has not authenticated within this is closed."""
MAX_CONNECTIONS = 16
"""Connections a shard keeps open at once (the coordinator uses one); more are closed at once."""
MAX_REQUEST_BYTES = 1 << 30
"""A request announcing more is refused and its connection closed."""
_CLIENT, _SERVER = b"geopubsub channel client", b"geopubsub channel server"
_REQUEST = struct.Struct("!Id")
_ANSWER = struct.Struct("!BI")
OK, FAILED = 0, 1
FENCED = b"the shard was loaded again since this connection opened; reconnect"


def proof(token: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    """What a side sends to show it holds ``token``: HMAC-SHA256 of its role and both challenges
    (the other side's first), so that no answer can be replayed or reflected."""
    return hmac.digest(token, role + first + second, hashlib.sha256)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``, or None at end of stream."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


class ChannelServer:
    """Listens on ``host`` (an ephemeral port) and answers each request with
    ``handler(payload, now) -> bytes``; an exception becomes a FAILED answer with its text.
    ``lock`` (the actor's) is held around the check of a connection's fence and its handler
    call together."""

    def __init__(
        self,
        host: str,
        handler: Callable[[bytes, float], bytes],
        *,
        lock: threading.RLock | None = None,
    ) -> None:
        self.handler = handler
        self.lock = lock if lock is not None else threading.RLock()
        self.epoch = 0
        """Raised by ``fence``; a connection serves only while it equals the one it opened in."""
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._open = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._sock = socket.create_server((host, 0))
        self.address = (host, self._sock.getsockname()[1])
        threading.Thread(target=self._accept, name="shard-channel", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            if not self._open.acquire(blocking=False):
                log.warning("shard channel: %d connections open, one more refused", MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="shard-channel-conn", daemon=True
            ).start()

    def _authenticated(self, conn: socket.socket) -> bool:
        """The handshake (module docstring) within ``AUTH_TIMEOUT_S``."""
        try:
            conn.settimeout(AUTH_TIMEOUT_S)
            challenge = secrets.token_bytes(NONCE_BYTES)
            conn.sendall(challenge)
            answer = _read_exactly(conn, NONCE_BYTES + TOKEN_BYTES)
            if answer is None:
                return False
            theirs, mac = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
            if not hmac.compare_digest(mac, proof(self.token, _CLIENT, challenge, theirs)):
                return False
            conn.sendall(proof(self.token, _SERVER, theirs, challenge))
            conn.settimeout(None)
            return True
        except OSError:  # timed out or gone
            return False

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_authenticated(conn)
        finally:
            self._open.release()

    def _serve_authenticated(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._authenticated(conn):
                return
            with self.lock:
                epoch = self.epoch
            try:
                while True:
                    head = _read_exactly(conn, _REQUEST.size)
                    if head is None:
                        return
                    n, now = _REQUEST.unpack(head)
                    if n > MAX_REQUEST_BYTES:
                        return
                    payload = _read_exactly(conn, n)
                    if payload is None:
                        return
                    with self.lock:
                        fenced = epoch != self.epoch
                        if fenced:
                            status, out = FAILED, FENCED
                        else:
                            try:
                                status, out = OK, self.handler(payload, now)
                            except Exception as exc:
                                status, out = FAILED, f"{type(exc).__name__}: {exc}".encode()
                    conn.sendall(_ANSWER.pack(status, len(out)) + out)
                    if fenced:
                        return
            except OSError:  # the coordinator went away; it reconnects
                return

    def fence(self) -> None:
        """Turn away every connection opened so far (the state was replaced: a round sent
        before must not be applied to it). Call it holding ``lock``."""
        with self.lock:
            self.epoch += 1

    def close(self) -> None:
        """Stop listening (connections already made stay until their client goes)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        self._sock.close()


class Channel:
    """The coordinator's end: ``call(payload, now)`` sends a request and returns its answer;
    calls are answered in the order made. Once the connection breaks every call (waiting or
    later) raises ``UnavailableError``; make a new ``Channel``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str):
        self.name = name
        self._reader = reader
        self._writer = writer
        self._waiting: collections.deque[asyncio.Future] = collections.deque()
        self._error: UnavailableError | None = None
        self._task = asyncio.get_running_loop().create_task(self._answers())

    @classmethod
    async def open(cls, address: tuple[str, int], token: bytes, name: str) -> Channel:
        try:
            reader, writer = await asyncio.open_connection(*address)
        except OSError as exc:
            raise UnavailableError(f"{name} unreachable at {address}: {exc}") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            theirs = await reader.readexactly(NONCE_BYTES)
            ours = secrets.token_bytes(NONCE_BYTES)
            writer.write(ours + proof(token, _CLIENT, theirs, ours))
            mac = await reader.readexactly(TOKEN_BYTES)
        except (OSError, asyncio.IncompleteReadError) as exc:
            writer.close()
            raise UnavailableError(f"{name} refused the channel at {address}: {exc!r}") from None
        if not hmac.compare_digest(mac, proof(token, _SERVER, ours, theirs)):
            writer.close()
            raise UnavailableError(f"{name} at {address} does not hold the channel's token")
        return cls(reader, writer, name)

    @property
    def broken(self) -> bool:
        return self._error is not None

    async def call(self, payload: bytes, now: float) -> bytes:
        if self._error is not None:
            raise self._error
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        self._writer.write(_REQUEST.pack(len(payload), now))
        self._writer.write(payload)
        return await fut

    async def _answers(self) -> None:
        reader, waiting = self._reader, self._waiting
        try:
            while True:
                status, n = _ANSWER.unpack(await reader.readexactly(_ANSWER.size))
                body = await reader.readexactly(n)
                fut = waiting.popleft()
                if fut.done():
                    continue
                if status == OK:
                    fut.set_result(body)
                else:
                    fut.set_exception(UnavailableError(f"{self.name}: {body.decode()}"))
        except (OSError, asyncio.IncompleteReadError, IndexError) as exc:
            self._fail(UnavailableError(f"{self.name}: connection lost ({exc!r})"))
        except asyncio.CancelledError:
            self._fail(UnavailableError(f"{self.name}: channel closed"))
            raise

    def _fail(self, err: UnavailableError) -> None:
        self._error = err
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # the caller may be gone: do not log it as unretrieved
        with contextlib.suppress(Exception):
            self._writer.close()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
