"""``geopubsub map``: the live map, a web page served over HTTP by a gRPC client of the cluster.

The page (``page.html``, no external script, no tile server) draws the world's outlines
(``livemap.outlines``), the subscriptions' density, messages as they are published and expire,
moving subscribers as they move, and a chosen subscription's region with its + / − deliveries.
Everything it shows comes through the public API, with the same credentials as any client
(``--ca``, ``--token`` / ``GEOPUBSUB_TOKEN``; an admin token where auth is on: ``GetDensity`` and
``Watch`` are admin calls):

=====================  =============================================================
``/``                  the page
``/outlines.json``     coastlines, lakes and borders (gzipped JSON)
``/api/stats``         ``GetStats``
``/api/density``       ``GetDensity`` (``view=x0,y0,x1,y1``, ``cols``, ``rows``, ``keyword``)
``/api/subscription``  ``GetSubscription`` (``id``)
``/api/events``        ``Watch`` as server-sent events (``keyword``, ``rate``)
``/api/deliveries``    ``StreamResults`` as server-sent events (``id``, ``after``)
=====================  =============================================================

A failed call answers JSON ``{"error": CODE, "details": ...}`` with a matching HTTP status. The
server binds 127.0.0.1 unless told otherwise: whoever reaches it sees what its token sees.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc

from geopubsub.client import DEFAULT_TARGET, Endpoint, add_client_flags, endpoint_from_flags
from geopubsub.tools.livemap.outlines import outlines_gzip
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import GeoPubSubError

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
PING_S = 10.0
"""An event stream with nothing to send writes a comment this often (a closed page shows)."""
CALL_TIMEOUT_S = 10.0
_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED: HTTPStatus.FORBIDDEN,
    grpc.StatusCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
    grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
}


def message_json(m: pb.Message) -> dict[str, Any]:
    """A message as the page draws it."""
    out: dict[str, Any] = {"id": m.id, "terms": list(m.keywords), "ttl": m.ttl_s, "time": m.time}
    if m.text:
        out["text"] = m.text[:200]
    if m.HasField("point"):
        out["point"] = [m.point.lon, m.point.lat]
    elif m.HasField("rect"):
        r = m.rect
        out["rect"] = [r.min_lon, r.min_lat, r.max_lon, r.max_lat]
    return out


def events_json(e: pb.WatchEvents) -> dict[str, Any]:
    return {
        "time": e.time,
        "published": [dict(message_json(w.message), matched=w.matched) for w in e.published],
        "expired": list(e.expired),
        "moved": [[m.id, m.point.lon, m.point.lat] for m in e.moved],
        "unsubscribed": list(e.unsubscribed),
        "published_count": e.published_count,
        "skipped_messages": e.skipped_messages,
        "moves_count": e.moves_count,
    }


def subscription_json(s: pb.Subscription) -> dict[str, Any]:
    out: dict[str, Any] = {"id": s.id, "moving": s.moving}
    out["condition"] = s.expr or " ".join(s.keywords)
    if s.HasField("rect"):
        r = s.rect
        out["rect"] = [r.min_lon, r.min_lat, r.max_lon, r.max_lat]
    elif s.HasField("circle"):
        c = s.circle
        out["circle"] = [c.lon, c.lat, c.radius_m]
    elif s.HasField("polygon"):  # rings of [lon, lat], where it is now
        out["polygon"] = [[[p.lon, p.lat] for p in r.points] for r in s.polygon.rings]
    elif s.HasField("point"):  # a top-k subscription
        out["point"] = [s.point.lon, s.point.lat]
        out["condition"] = f"top-k: {len(s.predicates)} weighted predicates, alpha {s.alpha:g}"
    if s.threshold:
        out["condition"] += f" (ranked: threshold {s.threshold:g})"
    return out


def delivery_json(d: pb.Delivery) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": d.sequence,
        "kind": pb.Delivery.Kind.Name(d.kind),
        "time": d.time,
        "id": d.message.id,
    }
    if d.kind == pb.Delivery.ADD:
        out["message"] = message_json(d.message)
    elif d.kind == pb.Delivery.GAP:
        out["gap_from"] = d.gap_from
    return out


def stats_json(s: pb.Stats) -> dict[str, Any]:
    return {
        "subscriptions": s.subscriptions,
        "moving": s.moving_subscriptions,
        "live_messages": s.live_messages,
        "published": s.published,
        "deliveries": s.deliveries,
        "moves": s.moves,
        "shards": len(s.shards),
        "uptime_s": s.uptime_s,
    }


class MapServer(ThreadingHTTPServer):
    """The HTTP server; ``stub`` reaches the coordinator. ``shutdown()`` ends the open event
    streams too."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], endpoint: Endpoint) -> None:
        super().__init__(address, _Handler)
        self.endpoint = endpoint
        self.channel = endpoint.channel()
        self.stub = pb_grpc.GeoPubSubStub(self.channel)
        self.page = resources.files("geopubsub.tools.livemap").joinpath("page.html").read_bytes()
        self.closing = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
        self.channel.close()


class _Handler(BaseHTTPRequestHandler):
    server: MapServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one line a request
        log.debug("%s " + fmt, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        route = {
            "/": self._page,
            "/index.html": self._page,
            "/outlines.json": self._outlines,
            "/api/stats": self._stats,
            "/api/density": self._density,
            "/api/subscription": self._subscription,
            "/api/events": self._events,
            "/api/deliveries": self._deliveries,
        }.get(url.path)
        if route is None:
            self._json({"error": "NOT_FOUND", "details": f"no such page: {url.path}"}, 404)
            return
        try:
            route(q)
        except grpc.RpcError as exc:
            code = exc.code()
            status = _HTTP.get(code, HTTPStatus.SERVICE_UNAVAILABLE)
            self._json({"error": code.name, "details": exc.details()}, status)
        except _BadParam as exc:
            self._json({"error": "INVALID_ARGUMENT", "details": str(exc)}, 400)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ---- plain answers ------------------------------------------------------------------------
    def _send(self, body: bytes, ctype: str, status: int = 200, gzipped: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, data: Any, status: int = 200) -> None:
        body = json.dumps(data, separators=(",", ":")).encode()
        self._send(body, "application/json", status)

    def _page(self, q: dict) -> None:
        self._send(self.server.page, "text/html; charset=utf-8")

    def _outlines(self, q: dict) -> None:
        self._send(outlines_gzip(), "application/json", gzipped=True)

    def _stats(self, q: dict) -> None:
        st = self.server.stub.GetStats(pb.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
        self._json(stats_json(st))

    def _density(self, q: dict) -> None:
        req = pb.DensityRequest(
            cols=_int(q, "cols", 0), rows=_int(q, "rows", 0), keyword=q.get("keyword", "")
        )
        if q.get("view"):
            try:
                x0, y0, x1, y1 = (float(v) for v in q["view"].split(","))
            except ValueError:
                raise _BadParam(f"view={q['view']!r}: must be four numbers x0,y0,x1,y1") from None
            req.view.CopyFrom(pb.Rect(min_lon=x0, min_lat=y0, max_lon=x1, max_lat=y1))
        d = self.server.stub.GetDensity(req, timeout=CALL_TIMEOUT_S)
        v = d.view
        self._json(
            {
                "view": [v.min_lon, v.min_lat, v.max_lon, v.max_lat],
                "cols": d.cols,
                "rows": d.rows,
                "counts": list(d.counts),
                "subscriptions": d.subscriptions,
            }
        )

    def _subscription(self, q: dict) -> None:
        req = pb.GetSubscriptionRequest(id=q.get("id", ""))
        self._json(subscription_json(self.server.stub.GetSubscription(req, timeout=CALL_TIMEOUT_S)))

    # ---- event streams ----------------------------------------------------------------------
    def _events(self, q: dict) -> None:
        req = pb.WatchRequest(
            keyword=q.get("keyword", ""), max_messages_per_s=_int(q, "rate", 0), max_movers=0
        )
        self._stream(self.server.stub.Watch(req), events_json)

    def _deliveries(self, q: dict) -> None:
        req = pb.StreamResultsRequest(id=q.get("id", ""), after_sequence=_int(q, "after", 0))
        self._stream(self.server.stub.StreamResults(req), delivery_json)

    def _stream(self, call: Any, as_json: Callable[[Any], dict]) -> None:
        """Relay a gRPC server stream as server-sent events until the page or the call goes.
        The call is read on a thread of its own, so that a quiet stream still writes a ping
        (and learns that the page has gone); its first item (or error) comes before the
        answer's headers, so a refused call is an ordinary JSON error."""
        items: queue.Queue = queue.Queue(maxsize=1000)

        def read() -> None:
            try:
                for item in call:
                    items.put(("item", item))
            except grpc.RpcError as exc:
                items.put(("error", exc))
            else:
                items.put(("end", None))

        threading.Thread(target=read, daemon=True, name="livemap-stream").start()
        try:
            first = self._next(items)
            if first[0] == "error" and first[1].code() != grpc.StatusCode.CANCELLED:
                raise first[1]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for kind, item in self._items(items, first):
                if kind == "ping":
                    self.wfile.write(b": ping\n\n")
                elif kind == "item":
                    self.wfile.write(
                        b"data: " + json.dumps(as_json(item), separators=(",", ":")).encode()
                    )
                    self.wfile.write(b"\n\n")
                else:
                    detail = {"error": item.code().name, "details": item.details()}
                    self.wfile.write(b"event: failed\ndata: " + json.dumps(detail).encode())
                    self.wfile.write(b"\n\n")
                    break
                self.wfile.flush()
        finally:
            call.cancel()

    def _next(self, items: queue.Queue) -> tuple[str, Any]:
        while True:
            try:
                return items.get(timeout=PING_S)
            except queue.Empty:
                if self.server.closing.is_set():
                    return ("end", None)
                return ("ping", None)

    def _items(self, items: queue.Queue, first: tuple[str, Any]) -> Iterator[tuple[str, Any]]:
        got = first
        while got[0] != "end" and not self.server.closing.is_set():
            yield got
            if got[0] == "error":
                return
            got = self._next(items)


class _BadParam(ValueError):
    pass


def _int(q: dict, name: str, default: int) -> int:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _BadParam(f"{name}={raw!r}: must be an integer") from None
    if value < 0:
        raise _BadParam(f"{name}={raw!r}: must be >= 0")
    return value


def serve(endpoint: Endpoint, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> MapServer:
    """Start the map's HTTP server on a thread of its own; ``close()`` it to stop."""
    server = MapServer((host, port), endpoint)
    threading.Thread(target=server.serve_forever, daemon=True, name="livemap").start()
    return server


def register(sub: Any) -> None:
    p = sub.add_parser(
        "map",
        help="the live map: a web page of the cluster's subscriptions, messages and movers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--coordinator", default=DEFAULT_TARGET, help="the coordinator's host:port")
    p.add_argument("--host", default="127.0.0.1", help="address the page is served on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="its port (0: any free one)")
    add_client_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        endpoint = endpoint_from_flags(args.coordinator, args)
        server = serve(endpoint, args.host, args.port)
    except (GeoPubSubError, OSError) as exc:
        print(f"geopubsub map: {exc}", file=sys.stderr)
        return 2
    print(f"geopubsub map: {server.url} (the cluster at {args.coordinator}); Ctrl-C stops it")
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    server.close()
    return 0
