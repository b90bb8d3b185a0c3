"""A Python client of the geopubsub gRPC API for applications: subscribe, publish, move, and follow a
subscription's deliveries with automatic resume after a disconnect.

Arguments are validated here, with the rules the server applies (``shard.model`` through
``geopubsub.convert``), so a bad argument raises ``ValidationError`` naming it before any call;
failed calls raise ``grpc.RpcError`` with the server's status code and details. ::

    with GeoPubSubClient("127.0.0.1:50051") as client:
        client.subscribe("s1", expr="ipad AND (sale OR discount)", rect=(13.3, 52.4, 13.5, 52.6))
        client.publish(["ipad", "sale"], point=(13.4, 52.5), ttl_s=60)  # PublishResult(id, matched=1)
        for delivery in client.stream_results("s1"):  # until the caller breaks out
            print(delivery)  # + s1 <id> ipad,sale @13.4,52.5
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from geopubsub.convert import (
    from_proto_delivery,
    from_proto_subscription,
    to_proto_message,
    to_proto_point,
    to_proto_subscription,
)
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import UnavailableError, ValidationError
from shard.limits import MAX_MOVE_BATCH, MAX_SUBSCRIBE_BATCH, MAX_TOP_K
from shard.model import (
    Message,
    Subscription,
    message_from_dict,
    subscription_from_dict,
    validate_id,
    validate_point,
)

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 10.0
"""Deadline of each unary call."""
RESUME_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,  # server gone or restarting, connection lost
        grpc.StatusCode.CANCELLED,  # server-side cancel at shutdown (our own cancel ends the loop)
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,  # RST_STREAM when the server process dies mid-stream
    }
)
"""Status codes after which ``stream_results`` reconnects instead of raising."""
RESUME_TIMEOUT_S = 60.0
"""How long ``stream_results`` keeps reconnecting without receiving anything before it gives up."""
RESUME_BACKOFF_S = (0.1, 5.0)
"""First and longest pause between reconnection attempts (doubling in between)."""
CONNECTED_S = 1.0
"""A result stream that lasted this long before it broke counts as having been connected: the
reconnection backoff and ``resume_timeout_s`` start afresh."""
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
)
"""Reconnect quickly after a coordinator restart (gRPC's defaults back off to 120 s)."""


@dataclass(frozen=True, slots=True)
class Tls:
    """How a client reaches a coordinator that serves TLS: ``ca``, the PEM file of the CA(s) it
    trusts (None: the system's roots), for mutual TLS ``cert`` / ``key``, its own certificate
    and key, and ``server_name``, the name the server's certificate must carry when it is not
    the target's host (a certificate for ``geo.example.org`` reached at 127.0.0.1)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(name: str, path: str | None) -> bytes | None:
            if not path:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise ValidationError(name, path, f"cannot be read: {exc.strerror}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read("ca", self.ca),
            private_key=read("client_key", self.key),
            certificate_chain=read("client_cert", self.cert),
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A coordinator and how to reach it: ``target`` (``host:port``), ``tls`` (None: plaintext)
    and the bearer ``token`` of a cluster with auth on (never in the ``repr``)."""

    target: str
    tls: Tls | None = None
    token: str | None = field(default=None, repr=False)

    def channel(self, *, aio: bool = False, options=CHANNEL_OPTIONS):
        """A new gRPC channel to it (``open_channel``)."""
        return open_channel(self.target, self.tls, aio=aio, options=options, token=self.token)


def open_channel(
    target: str,
    tls: Tls | None = None,
    *,
    aio: bool = False,
    options=CHANNEL_OPTIONS,
    token: str | None = None,
):
    """A gRPC channel to ``target``: plaintext, or TLS with ``tls``; ``aio``: an asyncio one.
    ``token``: sent on every call as ``authorization: Bearer <token>``, which gRPC does only over
    TLS or, without TLS, to a loopback address (its local credentials: they refuse any other
    peer, so a token never crosses a network in clear)."""
    mod = grpc.aio if aio else grpc
    if tls is not None and tls.server_name:
        options = (*options, ("grpc.ssl_target_name_override", tls.server_name))
    if not token:
        if tls is None:
            return mod.insecure_channel(target, options=options)
        return mod.secure_channel(target, tls.credentials(), options=options)
    if tls is None:
        if not _loopback_target(target):
            raise ValidationError(
                "token",
                "***",
                f"sent only over TLS or to a loopback address, not in clear to {target} "
                "(give the coordinator's CA: --ca / GEOPUBSUB_CA)",
            )
        channel_creds = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        channel_creds = tls.credentials()
    creds = grpc.composite_channel_credentials(
        channel_creds, grpc.access_token_call_credentials(token)
    )
    return mod.secure_channel(target, creds, options=options)


def _loopback_target(target: str) -> bool:
    """Whether ``target`` (``host:port``, ``[v6]:port``, ``ipv4:``/``ipv6:`` URIs) is this machine.

    >>> [_loopback_target(t) for t in ("127.0.0.1:1", "localhost:1", "[::1]:1", "geo.org:1")]
    [True, True, True, False]
    """
    host = target.split("://", 1)[-1]
    for scheme in ("ipv4:", "ipv6:", "dns:"):
        host = host.removeprefix(scheme)
    host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Delivery:
    """One update of a subscription's results, as received.

    ``kind`` is ``"+"`` (ADD), ``"-"`` (REMOVE) or ``"gap"``: the text of the core's ``Sign``
    (``str(Sign.ADD)``), what a script compares with and prints; ``location`` is ``(lon, lat)`` for a point
    message, ``(min_lon, min_lat, max_lon, max_lat)`` for a rectangle, None when the server did not
    send it (a REMOVE guarantees only the message id). ``time``: when the update took effect.
    """

    subscription_id: str
    sequence: int
    kind: str
    message_id: str
    keywords: tuple[str, ...] = ()
    text: str = ""
    location: tuple[float, ...] | None = None
    time: float = 0.0
    gap_from: int = 0
    """For ``kind == "gap"``: the deliveries ``gap_from`` .. ``sequence`` cannot be served (not
    retained, or never logged): the server says so instead of skipping them."""
    score: float = 0.0
    """For an ADD to a ranked subscription: the message's similarity score."""

    @classmethod
    def from_proto(cls, delivery: pb.Delivery) -> Delivery:
        if delivery.kind == pb.Delivery.GAP:
            return cls(
                delivery.subscription_id,
                delivery.sequence,
                "gap",
                "",
                time=delivery.time,
                gap_from=delivery.gap_from,
            )
        sid, sign, mid = from_proto_delivery(delivery)
        msg = delivery.message
        where = msg.WhichOneof("location")
        location: tuple[float, ...] | None = None
        if where == "point":
            location = (msg.point.lon, msg.point.lat)
        elif where == "rect":
            r = msg.rect
            location = (r.min_lon, r.min_lat, r.max_lon, r.max_lat)
        return cls(
            sid,
            delivery.sequence,
            str(sign),
            mid,
            tuple(msg.keywords),
            msg.text,
            location,
            delivery.time,
            score=delivery.score,
        )

    def __str__(self) -> str:
        """``+ sub msg keyword,keyword @lon,lat``, the line ``geopubsub subscribe --follow`` prints
        (a message without keywords shows its text; what the server did not send is left out).

        >>> str(Delivery("s1", 3, "+", "m7", ("ipad", "sale"), "", (13.4, 52.5), 0.0))
        '+ s1 m7 ipad,sale @13.4,52.5'
        >>> str(Delivery("s1", 4, "-", "m7"))
        '- s1 m7'
        >>> str(Delivery("s1", 1025, "gap", "", gap_from=5))
        'gap s1 #5..#1025'
        """
        if self.kind == "gap":
            return f"gap {self.subscription_id} #{self.gap_from}..#{self.sequence}"
        parts = [self.kind, self.subscription_id, self.message_id]
        if self.keywords or self.text:
            parts.append(",".join(self.keywords) if self.keywords else repr(self.text))
        if self.location is not None:
            parts.append("@" + ",".join(f"{x:g}" for x in self.location))
        if self.score:
            parts.append(f"score={self.score:.4g}")
        return " ".join(parts)


class PublishResult(NamedTuple):
    """The message's id (server-assigned when it was published without one) and how many
    subscriptions it matched."""

    id: str
    matched: int


Coordinates = Sequence[float]


def add_client_flags(p: argparse.ArgumentParser) -> None:
    """``--ca``, ``--cert``, ``--key``, ``--token``: how a client reaches a coordinator that
    serves TLS or has auth on (resolved by ``client_access``; ``GEOPUBSUB_CA``,
    ``GEOPUBSUB_TOKEN``... and the settings file too)."""
    p.add_argument(
        "--ca",
        help="TLS: PEM CA file to trust (default: the local cluster's, from cluster.json)",
    )
    p.add_argument("--cert", dest="client_cert", help="mutual TLS: this client's certificate")
    p.add_argument("--key", dest="client_key", help="mutual TLS: its private key")
    p.add_argument(
        "--token",
        help="bearer token of a cluster with auth on (geopubsub token create); better "
        "GEOPUBSUB_TOKEN, which ps does not show",
    )


def endpoint_from_flags(
    target: str, args: argparse.Namespace, env: Mapping[str, str] = os.environ
) -> Endpoint:
    """``target`` reached as the ``add_client_flags`` of ``args`` say, else as the environment
    does (``GEOPUBSUB_CA``, ``GEOPUBSUB_CLIENT_CERT``, ``GEOPUBSUB_CLIENT_KEY``,
    ``GEOPUBSUB_TOKEN``): TLS once a CA or a client certificate is given, else plaintext.

    >>> endpoint_from_flags("h:1", argparse.Namespace(ca="ca.pem"), env={"GEOPUBSUB_TOKEN": "t"})
    Endpoint(target='h:1', tls=Tls(ca='ca.pem', cert=None, key=None, server_name=None))
    >>> endpoint_from_flags("h:1", argparse.Namespace(client_cert="c.pem"), env={})
    Traceback (most recent call last):
    ...
    shard.errors.ValidationError: client_key=None: give it with client_cert (--cert and --key)
    """

    def pick(flag: str, var: str) -> str | None:
        return getattr(args, flag, None) or env.get(var) or None

    ca = pick("ca", "GEOPUBSUB_CA")
    cert = pick("client_cert", "GEOPUBSUB_CLIENT_CERT")
    key = pick("client_key", "GEOPUBSUB_CLIENT_KEY")
    if bool(cert) != bool(key):
        missing, given = ("client_key", "client_cert") if cert else ("client_cert", "client_key")
        raise ValidationError(missing, None, f"give it with {given} (--cert and --key)")
    tls = Tls(ca, cert, key) if ca or cert else None
    return Endpoint(target, tls, pick("token", "GEOPUBSUB_TOKEN"))


RELOAD_TIMEOUT_S = 600.0
"""A reload rebuilds every shard: ~1-2 min for 1M subscriptions here."""


def request_reload(endpoint: Endpoint, timeout_s: float = RELOAD_TIMEOUT_S) -> bool:
    """Ask the coordinator at ``endpoint`` to rebuild its shards from Redis (the admin RPC
    ``Reload``, after a bulk load); False if it has no such RPC (it then serves the loaded
    subscriptions from its next start). Any other failure raises ``UnavailableError``."""
    with endpoint.channel(options=()) as channel:
        try:
            pb_grpc.GeoPubSubStub(channel).Reload(pb.ReloadRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return False
            raise UnavailableError(
                f"Reload at {endpoint.target}: {exc.code().name} {exc.details()}"
            ) from None
    return True


class GeoPubSubClient:
    """A synchronous client over one gRPC channel; use it as a context manager or ``close()`` it.
    Thread-safe like the channel (one stream per thread). ``tls``: reach a coordinator that
    serves TLS (``Tls(ca="ca.pem")``; with ``cert`` / ``key`` for mutual TLS); ``token``: the
    bearer token of a cluster with auth on (``geopubsub token create``)."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        channel: grpc.Channel | None = None,
        tls: Tls | None = None,
        token: str | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._channel = channel or open_channel(target, tls, token=token)
        self._stub = pb_grpc.GeoPubSubStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GeoPubSubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GeoPubSubClient({self.target!r})"

    # ---- subscriptions ----------------------------------------------------------------------
    def subscribe(
        self,
        id: str,
        keywords: Sequence[str] | None = None,
        expr: str | None = None,
        *,
        rect: Coordinates | None = None,
        circle: Coordinates | None = None,
        polygon: Sequence[Sequence[Coordinates]] | None = None,
        point: Coordinates | None = None,
        predicates: Sequence[Mapping[str, Any]] | None = None,
        threshold: float | None = None,
        alpha: float | None = None,
        weights: Mapping[str, float] | None = None,
        moving: bool = False,
        ephemeral: bool = False,
    ) -> str:
        """Create the subscription, or replace the one with this id; returns the id. Give one of
        ``keywords`` (all must occur) and ``expr`` (``ipad AND (sale OR discount) AND NOT
        refurbished``), and one of ``rect`` ``(min_lon, min_lat, max_lon, max_lat)``, ``circle``
        ``(lon, lat, radius_m)`` and ``polygon`` (rings of ``(lon, lat)``, the exterior first,
        each closed); ``predicates`` on the messages' attributes (``[{"attr": "price", "op":
        "<=", "value": 5}]``, docs/LIMITS.md) must all hold. ``threshold`` (with ``alpha``, and
        optionally ``weights`` by keyword) makes it ranked: the keywords are scored, not all
        required (``shard.ranking``; its deliveries carry the score). ``point`` ``(lon, lat)``
        instead of a region makes a top-k subscription (paper 001): no keywords, ``predicates``
        with a ``"weight"`` each, ``alpha``; it is reached only by top-k publishes (``publish(...,
        top_k=k)``), scored. ``ephemeral``: its deliveries skip the retention log (a live result
        stream only).
        """
        d: dict[str, Any] = {"id": id, "moving": moving}
        for name, value in (("keywords", keywords), ("expr", expr)):
            if value is not None:
                d[name] = list(value) if name == "keywords" else value
        for name, value in (("rect", rect), ("circle", circle), ("point", point)):
            if value is not None:
                d[name] = list(value)
        if polygon is not None:
            d["polygon"] = [[list(p) for p in ring] for ring in polygon]
        if predicates is not None:
            d["predicates"] = [dict(p) for p in predicates]
        for name, value in (("threshold", threshold), ("alpha", alpha), ("weights", weights)):
            if value is not None:
                d[name] = dict(value) if name == "weights" else value
        sub = to_proto_subscription(subscription_from_dict(d))
        sub.ephemeral = ephemeral
        return self._stub.Subscribe(
            pb.SubscribeRequest(subscription=sub), timeout=self.timeout_s
        ).id

    def subscribe_many(
        self,
        subs: Iterable[Subscription | Mapping[str, Any]],
        *,
        batch: int = MAX_SUBSCRIBE_BATCH,
        ephemeral: bool = False,
    ) -> list[str]:
        """Register subscriptions (``shard.model.Subscription`` or the workload form ``{"id",
        "keywords" | "expr", "rect" | "circle", "moving"}``) in requests of up to ``batch``
        (``SubscribeRequest.subscriptions``: each request all or nothing); returns the ids. An
        invalid one raises its ValidationError before its request is sent (those before it are
        registered)."""
        if not 1 <= batch <= MAX_SUBSCRIBE_BATCH:
            raise ValidationError("batch", batch, f"must be 1-{MAX_SUBSCRIBE_BATCH}")
        out: list[str] = []
        part: list[pb.Subscription] = []

        def send() -> None:
            response = self._stub.Subscribe(
                pb.SubscribeRequest(subscriptions=part), timeout=self.timeout_s
            )
            out.extend(response.ids)
            part.clear()

        for s in subs:
            p = to_proto_subscription(
                s if isinstance(s, Subscription) else subscription_from_dict(s)
            )
            p.ephemeral = ephemeral
            part.append(p)
            if len(part) == batch:
                send()
        if part:
            send()
        return out

    def unsubscribe(self, id: str) -> None:
        """Remove the subscription (NOT_FOUND if it does not exist)."""
        self._stub.Unsubscribe(
            pb.UnsubscribeRequest(id=validate_id("id", id)), timeout=self.timeout_s
        )

    def unsubscribe_many(self, ids: Iterable[str], *, batch: int = MAX_SUBSCRIBE_BATCH) -> None:
        """Remove subscriptions in requests of up to ``batch`` ids (``UnsubscribeRequest.ids``:
        each request all or nothing; NOT_FOUND names the first unknown id of its request)."""
        if not 1 <= batch <= MAX_SUBSCRIBE_BATCH:
            raise ValidationError("batch", batch, f"must be 1-{MAX_SUBSCRIBE_BATCH}")
        ids = [validate_id("ids", i) for i in ids]
        for a in range(0, len(ids), batch):
            self._stub.Unsubscribe(
                pb.UnsubscribeRequest(ids=ids[a : a + batch]), timeout=self.timeout_s
            )

    def get_subscription(self, id: str) -> Subscription:
        """The subscription as registered (``shard.model.Subscription``)."""
        sub = self._stub.GetSubscription(
            pb.GetSubscriptionRequest(id=validate_id("id", id)), timeout=self.timeout_s
        )
        return from_proto_subscription(sub)

    # ---- publishing -------------------------------------------------------------------------
    def publish(
        self,
        keywords: Sequence[str] = (),
        *,
        point: Coordinates | None = None,
        rect: Coordinates | None = None,
        text: str = "",
        ttl_s: float = 0.0,
        id: str = "",
        attributes: Mapping[str, float | str] | None = None,
        top_k: int = 0,
    ) -> PublishResult:
        """Publish one message at ``point`` ``(lon, lat)`` or over ``rect``. ``ttl_s`` 0: delivered
        to the subscriptions matching now and not stored; else live for ``ttl_s`` seconds. An empty
        ``id`` lets the server assign one. ``attributes``: ``{"price": 4.5, "category":
        "food"}``, what subscriptions' predicates test. ``top_k`` > 0: deliver it to the k top-k
        subscriptions scoring it highest instead (a point, no ttl, keywords optional)."""
        d: dict[str, Any] = {"id": id, "keywords": list(keywords)}
        if text:
            d["text"] = text
        if attributes:
            d["attributes"] = dict(attributes)
        for name, value in (("point", point), ("rect", rect)):
            if value is not None:
                d[name] = list(value)
        if ttl_s:
            d["ttl"] = ttl_s
        response = self._stub.Publish(_publish_request(d, top_k), timeout=self.timeout_s)
        return PublishResult(response.id, response.matched)

    def publish_many(
        self, messages: Iterable[Message | Mapping[str, Any]], *, top_k: int = 0
    ) -> Iterator[PublishResult]:
        """Publish over one PublishStream: one result per message, in order. A message is a
        ``shard.model.Message`` or its workload form (``{"id", "keywords", "text", "point" |
        "rect", "ttl"}``, as ``geopubsub gen`` writes; the id may be empty or absent). Messages are sent as
        the iterator is consumed; an invalid one ends the stream after the results of those before
        it, then raises its ``ValidationError``. ``top_k``: as ``publish``."""
        rejected: list[Exception] = []

        def requests() -> Iterator[pb.PublishRequest]:
            for m in messages:
                try:
                    yield _publish_request(m, top_k)
                except Exception as exc:  # raised to the caller below, not inside gRPC's thread
                    rejected.append(exc)
                    return

        for response in self._stub.PublishStream(requests()):
            yield PublishResult(response.id, response.matched)
        if rejected:
            raise rejected[0]

    # ---- moving subscriptions ---------------------------------------------------------------
    def update_location(self, id: str, lon: float, lat: float) -> list[Delivery]:
        """Re-centre a moving subscription on (lon, lat); returns the REMOVE / ADD deliveries the
        move caused (also part of the subscription's result stream)."""
        response = self._stub.UpdateLocation(
            _location_request(id, lon, lat), timeout=self.timeout_s
        )
        return [Delivery.from_proto(d) for d in response.updates]

    def update_locations(
        self, moves: Iterable[tuple[str, float, float]], *, batch: int = 1
    ) -> Iterator[Delivery]:
        """Send ``(id, lon, lat)`` moves over one LocationStream, up to ``batch`` per request
        (``UpdateLocationRequest.moves``); yields the deliveries they cause as they arrive (each
        also goes to its subscription's result stream). A batch is sent once full or when
        ``moves`` ends."""
        if not 1 <= batch <= MAX_MOVE_BATCH:
            raise ValidationError("batch", batch, f"must be 1-{MAX_MOVE_BATCH}")
        rejected: list[Exception] = []

        def requests() -> Iterator[pb.UpdateLocationRequest]:
            pending: list[pb.LocationUpdate] = []
            for sid, lon, lat in moves:
                try:
                    req = _location_request(sid, lon, lat)
                except Exception as exc:
                    rejected.append(exc)
                    break
                if batch == 1:
                    yield req
                    continue
                pending.append(pb.LocationUpdate(id=req.id, point=req.point))
                if len(pending) == batch:
                    yield pb.UpdateLocationRequest(moves=pending)
                    pending = []
            if pending:
                yield pb.UpdateLocationRequest(moves=pending)

        for delivery in self._stub.LocationStream(requests()):
            yield Delivery.from_proto(delivery)
        if rejected:
            raise rejected[0]

    # ---- results ----------------------------------------------------------------------------
    def stream_results(
        self,
        id: str,
        after_sequence: int = 0,
        *,
        resume: bool = True,
        resume_timeout_s: float = RESUME_TIMEOUT_S,
    ) -> Iterator[Delivery]:
        """The subscription's deliveries after ``after_sequence``, then new ones as they happen,
        until the caller stops iterating (which cancels the call).

        When the connection drops (a status in ``RESUME_CODES``, or the server ending the stream),
        it reconnects with backoff and resumes after the last sequence it yielded, so the caller
        sees no duplicate and, within the server's retention window, misses nothing; what the
        server cannot serve comes as a ``Delivery`` of kind ``"gap"`` naming the range. It gives up,
        re-raising, after ``resume_timeout_s`` without receiving anything; ``resume=False`` raises
        at once.
        """
        validate_id("id", id)
        last = after_sequence
        pause_s = RESUME_BACKOFF_S[0]
        stalled_since: float | None = None
        while True:
            began = time.monotonic()
            call = self._stub.StreamResults(pb.StreamResultsRequest(id=id, after_sequence=last))
            error: grpc.RpcError | None = None
            try:
                for delivery in call:
                    stalled_since, pause_s = None, RESUME_BACKOFF_S[0]
                    if delivery.sequence <= last:
                        continue  # already yielded before a reconnect
                    last = delivery.sequence
                    yield Delivery.from_proto(delivery)
            except grpc.RpcError as exc:
                if not resume or exc.code() not in RESUME_CODES:
                    raise
                error = exc
            finally:
                call.cancel()
            if not resume:
                return
            now = time.monotonic()
            if now - began >= CONNECTED_S:
                stalled_since, pause_s = None, RESUME_BACKOFF_S[0]
            stalled_since = stalled_since if stalled_since is not None else now
            if now - stalled_since >= resume_timeout_s:
                if error is not None:
                    raise error
                return
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, RESUME_BACKOFF_S[1])

    # ---- cluster ----------------------------------------------------------------------------
    def rebalance(
        self, shards: int = 0, timeout_s: float = RELOAD_TIMEOUT_S
    ) -> pb.RebalanceResponse:
        """Admin: a new partition map for ``shards`` shards (0: as many as now), shards added or
        removed, every shard rebuilt (``Rebalance``)."""
        return self._stub.Rebalance(pb.RebalanceRequest(shards=shards), timeout=timeout_s)

    def stats(self) -> pb.Stats:
        """Cluster figures (``geopubsub.v1.Stats``)."""
        return self._stub.GetStats(pb.GetStatsRequest(), timeout=self.timeout_s)

    def health(self, service: str = "", *, timeout_s: float | None = None) -> str:
        """The grpc.health.v1 status name of ``service`` ("" is the whole server): ``SERVING``,
        ``NOT_SERVING``, ``UNKNOWN`` or ``SERVICE_UNKNOWN``."""
        response = self._health.Check(
            health_pb2.HealthCheckRequest(service=service),
            timeout=self.timeout_s if timeout_s is None else timeout_s,
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def _publish_request(message: Message | Mapping[str, Any], top_k: int = 0) -> pb.PublishRequest:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= MAX_TOP_K:
        raise ValidationError("top_k", top_k, f"must be an integer in [0, {MAX_TOP_K}]")
    if not isinstance(message, Message):
        message = message_from_dict(
            {"id": "", **message}, allow_empty_id=True, need_terms=not top_k
        )
    return pb.PublishRequest(message=to_proto_message(message), top_k=top_k)


def _location_request(id: str, lon: float, lat: float) -> pb.UpdateLocationRequest:
    point = to_proto_point(validate_point("point", lon, lat))
    return pb.UpdateLocationRequest(id=validate_id("id", id), point=point)


def describe_stats(stats: pb.Stats) -> list[str]:
    """Human-readable lines of a Stats (``geopubsub stats`` / ``status``)."""
    lines = [
        f"subscriptions {stats.subscriptions} ({stats.moving_subscriptions} moving), "
        f"live messages {stats.live_messages}",
        f"published {stats.published}, deliveries {stats.deliveries}, "
        f"dropped deliveries {stats.dropped_deliveries}, uptime {stats.uptime_s:.1f} s",
        f"moves {stats.moves}, rounds {stats.rounds}, rejected (overload) "
        f"{stats.rejected_overload}, shard failures {stats.shard_failures}, "
        f"gaps {stats.gaps}",
        f"log {stats.log_rounds} rounds, {stats.log_bytes / 1e6:.1f} MB, "
        f"write failures {stats.log_write_failures}",
    ]
    lines += [
        f"shard {s.shard}: {s.subscriptions} subscriptions, {s.live_messages} live messages"
        for s in stats.shards
    ]
    return lines
