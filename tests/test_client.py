"""``geopubsub.client`` against a real gRPC server on 127.0.0.1 (the in-memory stand-in of
``fake_coordinator``): argument validation before any call, the conversions of results, and the
resume of a result stream after the stream or the whole server went away."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from geopubsub.client import Delivery, GeoPubSubClient, PublishResult
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.errors import ExpressionError, ValidationError
from shard.model import ADD, Circle, Message, Point, Rect
from tests.fake_coordinator import serve


@pytest.fixture
def server():
    server, port, fake = serve()
    yield fake, port
    server.stop(0).wait()


@pytest.fixture
def client(server):
    with GeoPubSubClient(f"127.0.0.1:{server[1]}") as client:
        yield client


def test_subscribe_get_unsubscribe(server, client):
    fake, _ = server
    assert client.subscribe("s1", ["iPad", "sale"], rect=(0, 0, 1, 1)) == "s1"
    assert (
        client.subscribe("s2", expr="ipad AND (sale OR discount)", circle=(1, 2, 500), moving=True)
        == "s2"
    )
    s1, s2 = client.get_subscription("s1"), client.get_subscription("s2")
    assert (s1.keywords, s1.clauses, s1.region, s1.moving) == (
        ("iPad", "sale"),
        (("ipad", "sale"),),
        Rect(0, 0, 1, 1),
        False,
    )
    assert (s2.expr, s2.region, s2.moving) == (
        "ipad AND (sale OR discount)",
        Circle(1, 2, 500),
        True,
    )
    client.unsubscribe("s1")
    assert set(fake.subs) == {"s2"}
    with pytest.raises(grpc.RpcError) as info:
        client.unsubscribe("s1")
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"keywords": ["a"], "rect": (200, 0, 1, 1)}, ValidationError, "rect[0]=200"),
        ({"keywords": ["a"], "circle": (0, 0, 0)}, ValidationError, "circle[2]=0"),
        ({"keywords": ["a"], "rect": (0, 0, 1, 1), "circle": (0, 0, 1)}, ValidationError, "rect="),
        ({"expr": "ipad AND", "rect": (0, 0, 1, 1)}, ExpressionError, "expr='ipad AND'"),
        ({"rect": (0, 0, 1, 1)}, ValidationError, "keywords=None"),
        ({"keywords": ["a"], "rect": (0, 0, 1)}, ValidationError, "rect=[0, 0, 1]"),
    ],
)
def test_invalid_subscriptions_fail_before_any_call(server, client, kwargs, error, field):
    with pytest.raises(error, match=field.replace("[", r"\[").replace("(", r"\(")):
        client.subscribe("s1", **kwargs)
    assert server[0].subs == {}


def test_publish_and_publish_many(server, client):
    client.subscribe("s1", ["ipad"], rect=(0, 0, 10, 10))
    assert client.publish(["ipad"], point=(1, 1), id="m1") == PublishResult("m1", 1)
    assert client.publish(text="an iPad", rect=(20, 20, 30, 30), ttl_s=5) == ("auto2", 0)
    results = list(
        client.publish_many(
            [
                {"id": "m3", "keywords": ["ipad"], "point": [2, 2]},
                Message("m4", ("ipad",), Point(3, 3), keywords=("ipad",)),
                {"keywords": ["other"], "point": [2, 2]},
            ]
        )
    )
    assert results == [("m3", 1), ("m4", 1), ("auto5", 0)]
    with pytest.raises(ValidationError, match="ttl"):
        client.publish(["ipad"], point=(1, 1), ttl_s=-1)
    with pytest.raises(ValidationError, match="keywords"):
        client.publish(point=(1, 1))


def test_publish_many_stops_at_an_invalid_message_and_raises_it(server, client):
    client.subscribe("s1", ["ipad"], rect=(0, 0, 10, 10))
    results = []
    with pytest.raises(ValidationError, match=r"point\[1\]=95"):
        for result in client.publish_many(
            [
                {"id": "m1", "keywords": ["ipad"], "point": [1, 1]},
                {"id": "bad", "keywords": ["ipad"], "point": [1, 95]},
                {"id": "m3", "keywords": ["ipad"], "point": [1, 1]},
            ]
        ):
            results.append(result)
    assert results == [("m1", 1)]
    assert server[0].published == 1


def test_update_location_returns_deliveries(server, client):
    client.subscribe("s1", ["ipad"], rect=(0, 0, 1, 1), moving=True)
    updates = client.update_location("s1", 3, 4)
    assert updates == [Delivery("s1", 1, "-", "left-3-4")]
    assert str(updates[0]) == "- s1 left-3-4"
    assert list(client.update_locations([("s1", 5, 6), ("s1", 7, 8)])) == [
        Delivery("s1", 2, "-", "left-5-6"),
        Delivery("s1", 3, "-", "left-7-8"),
    ]
    fake = server[0]
    fake.move_requests.clear()
    walk = [("s1", x, 0) for x in range(5)]
    got = list(client.update_locations(walk, batch=2))  # requests of 2, 2 and 1 moves
    assert [d.message_id for d in got] == [f"left-{x}-0" for x in range(5)]
    assert fake.move_requests == [2, 2, 1]
    with pytest.raises(ValidationError, match="batch"):
        list(client.update_locations(walk, batch=0))
    with pytest.raises(ValidationError, match=r"point\[1\]=91"):
        client.update_location("s1", 0, 91)


def test_stream_results_converts_deliveries(server, client):
    client.subscribe("s1", ["ipad"], rect=(0, 0, 10, 10))
    client.publish(["ipad", "sale"], point=(1.5, 2), id="m1")
    client.publish(["ipad"], rect=(1, 1, 2, 2), text="big sale", id="m2")
    stream = client.stream_results("s1")
    first, second = next(stream), next(stream)
    stream.close()
    assert first == Delivery("s1", 1, "+", "m1", ("ipad", "sale"), "", (1.5, 2.0), 1001.0)
    assert second == Delivery("s1", 2, "+", "m2", ("ipad",), "big sale", (1, 1, 2, 2), 1002.0)
    assert str(first) == "+ s1 m1 ipad,sale @1.5,2"


def _collect(client, sid, n, out, after=0):
    for delivery in client.stream_results(sid, after_sequence=after):
        out.append(delivery)
        if len(out) == n:
            return


def test_stream_results_resumes_after_a_broken_stream_without_duplicates(server, client):
    fake, _ = server
    client.subscribe("s1", ["ipad"], rect=(0, 0, 10, 10))
    for i in range(1, 6):
        client.publish(["ipad"], point=(1, 1), id=f"m{i}")
    fake.break_streams = [2, 1]  # first call breaks after 2 deliveries, the second after 1
    got: list[Delivery] = []
    _collect(client, "s1", 4, got, after=1)
    assert [d.sequence for d in got] == [2, 3, 4, 5]
    assert [d.message_id for d in got] == ["m2", "m3", "m4", "m5"]
    assert fake.stream_requests == [("s1", 1), ("s1", 3), ("s1", 4)]


def test_stream_results_resumes_after_a_server_restart():
    first, port, fake = serve()
    target = f"127.0.0.1:{port}"
    got: list[Delivery] = []
    with GeoPubSubClient(target) as client:
        client.subscribe("s1", ["ipad"], rect=(0, 0, 10, 10))
        client.publish(["ipad"], point=(1, 1), id="m1")
        reader = threading.Thread(target=_collect, args=(client, "s1", 3, got), daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [d.message_id for d in got] == ["m1"]
        # The server goes away; a delivery is made while the client is disconnected; a new server
        # comes up on the same port with the same state.
        first.stop(0).wait()
        with fake.changed:
            fake.deliver("s1", ADD, pb.Message(id="m2"))
        time.sleep(0.5)
        second, _, _ = serve(fake, port=port)
        try:
            with fake.changed:
                fake.deliver("s1", ADD, pb.Message(id="m3"))
            reader.join(timeout=20)
            assert not reader.is_alive()
        finally:
            second.stop(0).wait()
    assert [(d.sequence, d.message_id) for d in got] == [(1, "m1"), (2, "m2"), (3, "m3")]
    assert fake.stream_requests[0] == ("s1", 0)
    assert fake.stream_requests[-1] == ("s1", 1)


def test_health(client):
    assert client.health() == "SERVING"
    with pytest.raises(grpc.RpcError) as info:
        client.health("no.such.Service")
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
