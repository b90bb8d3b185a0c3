"""Who may call what: bearer tokens checked on every call, by role and by owner prefix.

With ``Settings.auth_on`` the gRPC server gets ``AuthInterceptor``: every call of the GeoPubSub
service and of reflection carries ``authorization: Bearer <token>`` (``coordinator.tokens``);
health stays open. The interceptor wraps each method so that, before the method runs, the token
is checked (UNAUTHENTICATED: none, unknown, revoked, expired) and its role against the method
(PERMISSION_DENIED); the method then reads the caller's token with ``caller()`` and checks every
subscription id it is given with ``check_owned`` (PERMISSION_DENIED before anything else, so a
stranger learns nothing of whether an id exists).

Tokens are read from Redis and cached; a revoke is published on ``{ns}:tokens:revoked`` and
drops the token from the cache and ends its open streams at once (a cached token is also read
again after ``RECHECK_S``, in case a revoke was published while nobody listened). A stream
opened with a token that expires is ended at its expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import math
from collections.abc import Callable, Iterable

import grpc
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordinator.status import abort_for
from coordinator.tokens import Token, bearer, parse, revoked_channel, tokens_key
from shard.errors import PermissionDeniedError, UnauthenticatedError, UnavailableError
from shard.metadata_codec import redacted

log = logging.getLogger(__name__)

RECHECK_S = 10.0
"""A cached token is read from Redis again after this long (revokes are also pushed)."""

SERVICE = "/geopubsub.v1.GeoPubSub/"
SUBSCRIBER_METHODS = frozenset(
    SERVICE + m
    for m in (
        "Subscribe",
        "Unsubscribe",
        "GetSubscription",
        "StreamResults",
        "UpdateLocation",
        "LocationStream",
    )
)
PUBLISHER_METHODS = frozenset(SERVICE + m for m in ("Publish", "PublishStream"))
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
"""Methods anyone may call (load balancers and the launcher ask health without a token)."""

_CALLER: contextvars.ContextVar[Token | None] = contextvars.ContextVar("caller", default=None)


def role_allows(role: str, method: str) -> bool:
    """Whether a token of ``role`` may call ``method`` (its full gRPC name).

    >>> role_allows("publisher", "/geopubsub.v1.GeoPubSub/Publish")
    True
    >>> role_allows("subscriber", "/geopubsub.v1.GeoPubSub/Reload")
    False
    """
    if role == "admin":
        return True
    if role == "publisher":
        return method in PUBLISHER_METHODS
    return role == "subscriber" and method in SUBSCRIBER_METHODS


def caller() -> Token | None:
    """The token of the call being served; None when auth is off."""
    return _CALLER.get()


def check_owned(field: str, ids: Iterable[str]) -> None:
    """PERMISSION_DENIED naming the first id (and its field) the caller's token does not own."""
    tok = _CALLER.get()
    if tok is None or tok.role == "admin":
        return
    for i, sub_id in enumerate(ids):
        if not tok.owns(sub_id):
            at = field.format(i=i)
            raise PermissionDeniedError(
                f"{at}={sub_id[:80]!r}: this token ({tok.role} {tok.id}) may act only on "
                f"subscription ids that start with {tok.owner!r}"
            )


class Access:
    """The coordinator's view of the tokens in Redis (see the module docstring)."""

    def __init__(self, url: str, namespace: str, *, timeout_s: float, clock) -> None:
        self.url = url
        self.ns = namespace
        self.clock = clock
        share = timeout_s / 2
        self.r = aioredis.from_url(url, socket_timeout=share, socket_connect_timeout=share)
        self._cache: dict[str, tuple[Token, float]] = {}
        self._streams: dict[str, set[asyncio.Task]] = {}
        self._listener: asyncio.Task | None = None

    async def start(self) -> None:
        self._listener = asyncio.ensure_future(self._listen())

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._listener, 3.0)
        await self.r.aclose()

    async def authenticate(self, metadata) -> Token:
        """The token of a call's metadata, checked; UnauthenticatedError otherwise."""
        token_id, secret = parse(bearer(metadata))
        now = self.clock()
        hit = self._cache.get(token_id)
        if hit is None or now - hit[1] > RECHECK_S:
            try:
                raw = await self.r.hget(tokens_key(self.ns), token_id)
            except (RedisError, OSError) as exc:
                if hit is None:
                    raise UnavailableError(
                        f"redis at {redacted(self.url)} unreachable (tokens): {exc}"
                    ) from None
                raw = hit[0].to_json()  # Redis away: the token as last read
            if raw is None:
                self._cache.pop(token_id, None)
                raise UnauthenticatedError(f"token {token_id} is unknown or revoked")
            hit = (Token.from_json(token_id, raw), now)
            self._cache[token_id] = hit
        tok = hit[0]
        if tok.expired(now):
            raise UnauthenticatedError(f"token {token_id} expired")
        if not tok.valid(secret, now):
            raise UnauthenticatedError(f"token {token_id}: wrong secret")
        return tok

    @contextlib.contextmanager
    def streaming(self, tok: Token):
        """While a stream of ``tok`` is open: its task is cancelled by the token's revoke or
        expiry, and the ``Ended`` yielded says why (the stream then ends UNAUTHENTICATED)."""
        task = asyncio.current_task()
        assert task is not None
        ended = Ended(task)
        self._streams.setdefault(tok.id, set()).add(ended)
        timer = None
        if not math.isinf(tok.expires):
            delay = max(0.0, tok.expires - self.clock())
            timer = asyncio.get_running_loop().call_later(
                delay, ended.end, f"token {tok.id} expired"
            )
        try:
            yield ended
        finally:
            if timer is not None:
                timer.cancel()
            open_ = self._streams.get(tok.id)
            if open_ is not None:
                open_.discard(ended)
                if not open_:
                    del self._streams[tok.id]

    def revoked(self, token_id: str) -> None:
        self._cache.pop(token_id, None)
        for ended in list(self._streams.pop(token_id, ())):
            ended.end(f"token {token_id} was revoked")

    async def _listen(self) -> None:
        """Follow ``{ns}:tokens:revoked``; after any break, forget every cached token (a revoke
        may have been missed) and subscribe again."""
        channel = revoked_channel(self.ns).encode()
        listening = False
        while True:
            pubsub = self.r.pubsub()
            try:
                await pubsub.subscribe(channel)
                self._cache.clear()
                if not listening:
                    log.info("auth: following token revokes on %s", channel.decode())
                listening = True
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg["type"] == "message":
                        self.revoked(msg["data"].decode(errors="replace"))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                if listening:
                    log.warning("auth: token revokes not followed (%s); retrying", exc)
                listening = False
                self._cache.clear()
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


class Ended:
    """An open stream's end by its token: ``end`` cancels its task with a ``reason``."""

    __slots__ = ("task", "reason")

    def __init__(self, task: asyncio.Task) -> None:
        self.task = task
        self.reason = ""

    def end(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
            self.task.cancel()


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call but health's before its method runs (module docstring)."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        access = self.access

        async def admit(context) -> Token:
            try:
                tok = await access.authenticate(details.invocation_metadata)
                if not role_allows(tok.role, method):
                    raise PermissionDeniedError(
                        f"method={method.rsplit('/', 1)[-1]}: not allowed for a {tok.role} token"
                    )
            except Exception as exc:
                await abort_for(exc, context)
            return tok

        return _wrapped(handler, admit, access)


def _wrapped(handler, admit: Callable, access: Access):
    kind = (
        ("stream" if handler.request_streaming else "unary")
        + "_"
        + ("stream" if handler.response_streaming else "unary")
    )
    inner = getattr(handler, kind)
    if inspect.isasyncgenfunction(inner):

        async def stream(request, context):
            tok = await admit(context)
            _CALLER.set(tok)
            with access.streaming(tok) as ended:
                try:
                    async for response in inner(request, context):
                        yield response
                except asyncio.CancelledError:
                    if not ended.reason:
                        raise
                    ended.task.uncancel()  # (grpc answers a cancelled task with no status)
                    await abort_for(UnauthenticatedError(ended.reason), context)

        behavior = stream
    else:

        async def unary(request, context):
            tok = await admit(context)
            _CALLER.set(tok)
            return await inner(request, context)

        behavior = unary
    return handler._replace(**{kind: behavior})
