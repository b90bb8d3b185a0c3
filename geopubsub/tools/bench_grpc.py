"""``geopubsub bench grpc``: what Python gRPC alone allows on this machine.

A server process whose PublishStream answers every request at once (no engine, no shards, no
Redis) and a client in this process that publishes ``--messages`` workload-like messages over one
stream, unpaced: first one message per request (``PublishRequest.message``), then ``--batch`` per
request (``PublishRequest.messages``). Prints messages/s and the CPU seconds of each side per
message. This is the ceiling the cluster's own PublishStream figures sit under
(docs/BENCHMARKS.md); it is not a test of geopubsub's code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import sys
import time

import grpc

from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import ValidationError
from shard.limits import MAX_PUBLISH_BATCH

UNPACED_BURST = 256
"""Messages the client hands to gRPC before it lets the event loop run (as ``traffic``)."""


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("grpc", help="Python gRPC's own ceiling: a no-op PublishStream server")
    p.add_argument("--messages", type=int, default=60_000, help="messages per measurement")
    p.add_argument("--batch", type=int, default=200, help="messages per batched request")
    p.add_argument("--json", action="store_true", help="only the JSON object on stdout")
    p.set_defaults(func=run)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _serve(port_out, done) -> None:
    """The no-op server (a child process): one response per request, as PublishStream's."""

    class NoOp(pb_grpc.GeoPubSubServicer):
        async def PublishStream(self, request_iterator, context):
            async for req in request_iterator:
                if req.messages:
                    ids = [m.id for m in req.messages]
                    yield pb.PublishResponse(ids=ids, matches=[0] * len(ids))
                else:
                    yield pb.PublishResponse(id=req.message.id)

    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_GeoPubSubServicer_to_server(NoOp(), server)
        port_out.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        cpu = []
        while True:  # one CPU reading per measurement the client asks for
            cmd = await asyncio.get_running_loop().run_in_executor(None, done.get)
            if cmd == "stop":
                break
            cpu.append(_cpu_s())
            port_out.put(cpu[-1])
        await server.stop(0)

    asyncio.run(main())


async def _publish(target: str, n: int, batch: int) -> float:
    """Publish ``n`` messages over one stream, ``batch`` per request; returns seconds."""
    base = pb.Message(
        keywords=["ipad", "discount"], text="hello there", point=pb.Point(lon=13.4, lat=52.5)
    )

    async def requests():
        for a in range(0, n, batch):
            req = pb.PublishRequest()
            if batch == 1:
                req.message.CopyFrom(base)
                req.message.id = f"m{a}"
            else:
                for j in range(a, min(n, a + batch)):
                    m = req.messages.add()
                    m.CopyFrom(base)
                    m.id = f"m{j}"
            yield req
            if (a // batch) % max(1, UNPACED_BURST // batch) == 0:
                await asyncio.sleep(0)

    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.GeoPubSubStub(ch)
        t0 = time.perf_counter()
        answered = 0
        async for r in stub.PublishStream(requests()):
            answered += len(r.ids) or 1
        seconds = time.perf_counter() - t0
    if answered != n:
        raise RuntimeError(f"{answered} of {n} messages answered")
    return seconds


def run(args) -> int:
    if args.messages < 1:
        raise ValidationError("--messages", args.messages, "must be >= 1")
    if not 1 <= args.batch <= MAX_PUBLISH_BATCH:
        raise ValidationError("--batch", args.batch, f"must be in [1, {MAX_PUBLISH_BATCH}]")
    ctx = mp.get_context("spawn")
    port_q, cmd_q = ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=_serve, args=(port_q, cmd_q), daemon=True)
    server.start()
    out: dict = {"messages": args.messages}
    try:
        target = f"127.0.0.1:{port_q.get(timeout=60)}"
        for name, batch in (("single", 1), ("batched", args.batch)):
            cmd_q.put("cpu")
            server0 = port_q.get(timeout=60)
            client0 = _cpu_s()
            seconds = asyncio.run(_publish(target, args.messages, batch))
            client1 = _cpu_s()
            cmd_q.put("cpu")
            server1 = port_q.get(timeout=60)
            out[name] = {
                "per_request": batch,
                "msgs_per_s": round(args.messages / seconds, 1),
                "server_cpu_us_per_msg": round(1e6 * (server1 - server0) / args.messages, 1),
                "client_cpu_us_per_msg": round(1e6 * (client1 - client0) / args.messages, 1),
            }
    finally:
        cmd_q.put("stop")
        server.join(timeout=10)
        if server.is_alive():
            server.kill()
    print(json.dumps(out))
    if not args.json:
        for name in ("single", "batched"):
            r = out[name]
            print(
                f"{name:8} {r['per_request']:>5} per request: {r['msgs_per_s']:>10,.0f} msgs/s; "
                f"CPU per message: server {r['server_cpu_us_per_msg']} us, client "
                f"{r['client_cpu_us_per_msg']} us",
                file=sys.stderr,
            )
    return 0
