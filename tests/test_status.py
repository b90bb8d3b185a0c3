"""Every geopubsub error reaches a real gRPC client with its status code and details, from unary,
server-streaming and bidirectional methods (a grpc.aio server on 127.0.0.1, port 0)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from coordinator.status import grpc_errors, status_for
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import (
    ExpressionError,
    NotFoundError,
    OverloadedError,
    StoreFullError,
    UnavailableError,
    ValidationError,
)

Code = grpc.StatusCode
ERRORS = {
    "validation": (
        ValidationError("subscription.rect.min_lon", 200.0, "longitude must be in [-180, 180]"),
        Code.INVALID_ARGUMENT,
        "subscription.rect.min_lon=200.0: longitude must be in [-180, 180]",
    ),
    "expression": (
        ExpressionError("subscription.expr", "ipad AND", "unexpected end at position 8"),
        Code.INVALID_ARGUMENT,
        "subscription.expr='ipad AND': unexpected end at position 8",
    ),
    "not_found": (
        NotFoundError("subscription", "s9"),
        Code.NOT_FOUND,
        "subscription 's9' not found",
    ),
    "unavailable": (
        UnavailableError("shard 1 unreachable"),
        Code.UNAVAILABLE,
        "shard 1 unreachable",
    ),
    "overloaded": (
        OverloadedError("publish queue full"),
        Code.RESOURCE_EXHAUSTED,
        "publish queue full",
    ),
    "store_full": (  # an UnavailableError (writers wait for Redis), full rather than down
        StoreFullError("redis at redis://h:1/0 is full: it refused a write at its maxmemory"),
        Code.RESOURCE_EXHAUSTED,
        "redis at redis://h:1/0 is full: it refused a write at its maxmemory",
    ),
    "deadline": (TimeoutError(), Code.DEADLINE_EXCEEDED, "deadline exceeded"),
    "bug": (RuntimeError("secret internals"), Code.INTERNAL, "internal error (RuntimeError)"),
}


def raise_for(name: str) -> None:
    if name in ERRORS:
        raise ERRORS[name][0]


class Failing(pb_grpc.GeoPubSubServicer):
    """Raises the error named by the request's id, after a first response when streaming."""

    @grpc_errors
    async def GetSubscription(self, request, context):
        if request.id == "own-abort":
            await context.abort(Code.PERMISSION_DENIED, "the method's own abort")
        raise_for(request.id)
        return pb.Subscription(id=request.id)

    @grpc_errors
    async def StreamResults(self, request, context):
        yield pb.Delivery(subscription_id=request.id, sequence=1)
        raise_for(request.id)
        yield pb.Delivery(subscription_id=request.id, sequence=2)

    @grpc_errors
    async def LocationStream(self, request_iterator, context):
        async for request in request_iterator:
            raise_for(request.id)
            yield pb.Delivery(subscription_id=request.id)


def with_client(test):
    """Run ``await test(stub)`` against a fresh server on 127.0.0.1:0 in a fresh event loop."""

    async def main():
        server = grpc.aio.server()
        pb_grpc.add_GeoPubSubServicer_to_server(Failing(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await test(pb_grpc.GeoPubSubStub(channel))
        finally:
            await server.stop(None)

    return asyncio.run(main())


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_unary_method_error_becomes_status(name, caplog):
    async def call(stub):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetSubscription(pb.GetSubscriptionRequest(id=name), timeout=10)
        return e.value

    with caplog.at_level(logging.ERROR, logger="coordinator.status"):
        error = with_client(call)
    _, code, details = ERRORS[name]
    assert (error.code(), error.details()) == (code, details)
    # only the unexpected error is logged, with its traceback; its message stays on the server
    logged = [r for r in caplog.records if r.name == "coordinator.status"]
    if code is Code.INTERNAL:
        assert len(logged) == 1 and "secret internals" in caplog.text
    else:
        assert logged == []


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_server_streaming_error_ends_the_stream_with_status(name):
    async def call(stub):
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for delivery in stub.StreamResults(pb.StreamResultsRequest(id=name), timeout=10):
                received.append(delivery.sequence)
        return received, e.value

    received, error = with_client(call)
    assert received == [1]
    assert (error.code(), error.details()) == ERRORS[name][1:]


@pytest.mark.parametrize("name", ["validation", "not_found", "overloaded", "bug"])
def test_bidirectional_streaming_error_ends_the_stream_with_status(name):
    async def call(stub):
        requests = [pb.UpdateLocationRequest(id=i) for i in ("a", "b", name, "c")]
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for delivery in stub.LocationStream(iter(requests), timeout=10):
                received.append(delivery.subscription_id)
        return received, e.value

    received, error = with_client(call)
    assert received == ["a", "b"]
    assert (error.code(), error.details()) == ERRORS[name][1:]


def test_success_and_the_methods_own_abort_pass_through():
    async def call(stub):
        ok = await stub.GetSubscription(pb.GetSubscriptionRequest(id="fine"), timeout=10)
        stream = [d.sequence async for d in stub.StreamResults(pb.StreamResultsRequest(id="x"))]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetSubscription(pb.GetSubscriptionRequest(id="own-abort"), timeout=10)
        return ok, stream, e.value

    ok, stream, error = with_client(call)
    assert ok == pb.Subscription(id="fine")
    assert stream == [1, 2]
    assert (error.code(), error.details()) == (Code.PERMISSION_DENIED, "the method's own abort")


def test_status_for_without_a_server():
    assert isinstance(StoreFullError("full"), UnavailableError)
    assert status_for(StoreFullError("full"))[0] is Code.RESOURCE_EXHAUSTED
    assert status_for(ExpressionError("expr", "(", "unbalanced"))[0] is Code.INVALID_ARGUMENT
    assert status_for(KeyError("x")) == (Code.INTERNAL, "internal error (KeyError)")
    # NotFoundError is a KeyError too, but a deliberate one
    assert status_for(NotFoundError("subscription", "x"))[0] is Code.NOT_FOUND


def test_only_async_methods_can_be_decorated():
    with pytest.raises(TypeError, match="async def"):

        @grpc_errors
        def Subscribe(self, request, context):
            return None
