"""A stand-in coordinator for the launcher and client tests: an in-memory GeoPubSub (brute-force
matching, no Ray, no shards) with the health and reflection services.

Imported, ``serve()`` runs it in-process on 127.0.0.1 port 0. Run as a script it honours the
coordinator's contract (``python -m coordinator`` flags, the listening line on stdout, Redis
required, stop on SIGINT/SIGTERM), and to let the tests check the launcher it also writes
``<data_dir>/fake_coordinator.json`` (the settings it loaded, the pid of a child it leaves behind
in its session the way a local Ray's processes would be) and ``fake.key`` into Redis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
import redis
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.settings import Settings
from geopubsub.convert import (
    from_proto_location_request,
    from_proto_message,
    from_proto_subscribe_request,
    from_proto_unsubscribe_request,
    to_proto_delivery,
    to_proto_message,
    to_proto_subscription,
)
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.brute import subscription_matches
from shard.errors import ValidationError
from shard.limits import MAX_MOVE_BATCH
from shard.model import ADD, REMOVE, Sign, Subscription
from shard.topk.hosted import as_event
from shard.topk.model import TopKSubscription
from shard.topk.oracle import reference_topk


class FakeGeoPubSub(pb_grpc.GeoPubSubServicer):
    """Subscriptions in a dict, every delivery kept in a per-subscription log. ``break_streams``
    makes the next StreamResults calls fail with UNAVAILABLE after that many deliveries (once per
    call, counting down), to exercise the client's resume."""

    def __init__(self) -> None:
        self.subs: dict[str, Subscription] = {}
        self.logs: dict[str, list[pb.Delivery]] = {}
        self.published = 0
        self.stream_requests: list[tuple[str, int]] = []
        self.move_requests: list[int] = []  # moves per location request
        self.break_streams: list[int] = []
        self.refused_ids: set[str] = set()
        """Subscribe answers INVALID_ARGUMENT for a request holding one of these."""
        self.requests = 0
        """Subscribe requests accepted."""
        self.changed = threading.Condition()

    def deliver(self, sid: str, sign: Sign, message: pb.Message) -> pb.Delivery:
        log = self.logs.setdefault(sid, [])
        delivery = to_proto_delivery(sid, len(log) + 1, sign, message, time=message.time)
        log.append(delivery)
        self.changed.notify_all()
        return delivery

    def Subscribe(self, request, context):
        try:
            subs, _, batch = from_proto_subscribe_request(request)
            for i, sub in enumerate(subs):
                if sub.id in self.refused_ids:
                    raise ValidationError(f"subscriptions[{i}].id", sub.id, "refused (a test)")
        except ValidationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self.changed:
            self.requests += 1
            for sub in subs:
                self.subs[sub.id] = sub
        if batch:
            return pb.SubscribeResponse(ids=[s.id for s in subs])
        return pb.SubscribeResponse(id=subs[0].id)

    def Unsubscribe(self, request, context):
        try:
            ids, _ = from_proto_unsubscribe_request(request)
        except ValidationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self.changed:
            for i in ids:
                if i not in self.subs:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"subscription {i!r} not found")
            for i in ids:
                del self.subs[i]
        return pb.UnsubscribeResponse()

    def GetSubscription(self, request, context):
        sub = self.subs.get(request.id)
        if sub is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"subscription {request.id!r} not found")
        return to_proto_subscription(sub)

    def Publish(self, request, context):
        with self.changed:
            try:
                msg = from_proto_message(
                    request.message,
                    default_id=f"auto{self.published + 1}",
                    need_terms=not request.top_k,
                )
            except ValidationError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            self.published += 1
            proto = to_proto_message(msg, time=1000.0 + self.published)
            if request.top_k:  # the oracle's k best top-k subscriptions
                tk = [
                    TopKSubscription(s.id, s.predicates, s.alpha, s.region)
                    for s in self.subs.values()
                    if s.topk
                ]
                hits = [sid for sid, _ in reference_topk(tk, as_event(msg), request.top_k)]
            else:
                hits = [
                    s.id for s in self.subs.values() if not s.topk and subscription_matches(s, msg)
                ]
            for sid in hits:
                self.deliver(sid, ADD, proto)
        return pb.PublishResponse(id=msg.id, matched=len(hits))

    def PublishStream(self, request_iterator, context):
        for request in request_iterator:
            yield self.Publish(request, context)

    def UpdateLocation(self, request, context):
        """Re-centres nothing: answers one REMOVE of a message ``left-<id>`` (to check the
        client's conversion of the updates)."""
        moves, _ = from_proto_location_request(request, MAX_MOVE_BATCH)
        with self.changed:
            self.move_requests.append(len(moves))
            updates = []
            for sid, point in moves:
                if sid not in self.subs:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"subscription {sid!r} not found")
                gone = pb.Message(id=f"left-{point.lon:g}-{point.lat:g}")
                updates.append(self.deliver(sid, REMOVE, gone))
            return pb.UpdateLocationResponse(updates=updates)

    def LocationStream(self, request_iterator, context):
        for request in request_iterator:
            yield from self.UpdateLocation(request, context).updates

    def StreamResults(self, request, context):
        with self.changed:
            if request.id not in self.subs:
                context.abort(grpc.StatusCode.NOT_FOUND, f"subscription {request.id!r} not found")
            self.stream_requests.append((request.id, request.after_sequence))
            limit = self.break_streams.pop(0) if self.break_streams else None
        sent, position = 0, request.after_sequence
        while context.is_active():
            with self.changed:
                log = self.logs.get(request.id, [])
                if position >= len(log):
                    self.changed.wait(0.05)
                    continue
                batch = log[position:]
            for delivery in batch:
                if limit is not None and sent == limit:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "fake: stream broken")
                yield delivery
                sent += 1
                position = delivery.sequence

    def GetStats(self, request, context):
        return pb.Stats(
            subscriptions=len(self.subs),
            moving_subscriptions=sum(s.moving for s in self.subs.values()),
            published=self.published,
            deliveries=sum(len(log) for log in self.logs.values()),
            shards=[pb.ShardStats(shard=0, subscriptions=len(self.subs))],
            uptime_s=1.5,
        )


def serve(
    servicer: FakeGeoPubSub | None = None, host: str = "127.0.0.1", port: int = 0
) -> tuple[grpc.Server, int, FakeGeoPubSub]:
    """A started gRPC server with the fake, health (SERVING) and reflection."""
    servicer = servicer or FakeGeoPubSub()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_GeoPubSubServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (pb.DESCRIPTOR.services_by_name["GeoPubSub"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.start()
    return server, bound, servicer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for flag in ("config", "host", "redis-url", "ray-address", "data-dir"):
        parser.add_argument(f"--{flag}")
    parser.add_argument("--shards", type=int)
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k != "config"}
    settings = Settings.load(file=args.config, env=os.environ, flags=flags)
    client = redis.Redis.from_url(settings.redis_url)
    client.set("fake.key", "written by the fake coordinator")
    client.close()
    leftover_pid = None
    if os.environ.get("FAKE_COORDINATOR_LEFTOVER"):
        # Stands for a local Ray's processes: left behind in our session for the launcher to stop.
        leftover_pid = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL
        ).pid
    data_dir = Path(settings.data_dir)
    report = {
        "settings": dataclasses.asdict(settings),
        "leftover_pid": leftover_pid,
        "pid": os.getpid(),
        "argv": sys.argv[1:],
    }
    (data_dir / "fake_coordinator.json").write_text(json.dumps(report))
    server, port, _ = serve(host=settings.host, port=settings.port)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"geopubsub coordinator listening on {settings.host}:{port}", flush=True)
    stop.wait()
    server.stop(grace=1.0).wait()
    print("fake coordinator stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
