"""Hostile requests: Hypothesis fills every field of every RPC's request (unicode
with NUL, NaN / inf / huge / negative numbers, empty and long strings, unknown enum values,
several members of a oneof, deep expressions) or sends bytes that are no request at all, through
real gRPC to a coordinator (in-process shards, a real redis-server). Every call must end with a
documented status, never INTERNAL or UNKNOWN; afterwards the coordinator is SERVING and a
subscription and a message made then meet exactly as the oracle says."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import threading
import uuid

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard
from deploy.redis_local import RedisServer
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from loader import transform
from shard.host.warmup import warm_up_shard

DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""What a call may end with here (docs/LIMITS.md): nothing is down, so not UNAVAILABLE."""
SERVICE = pb.DESCRIPTOR.services_by_name["GeoPubSub"]
EXAMPLES = 1_000
"""Examples per test (x the RPCs each draws from): a few thousand requests in all."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Coordinator:
    """A coordinator with two in-process shards on its own event loop thread."""

    def __init__(self, redis_url: str) -> None:
        self.settings = Settings.load(
            flags={
                "port": 0,
                "redis_url": redis_url,
                "namespace": uuid.uuid4().hex,
                "max_live_messages": 2_000,
                "max_streams": 50,
            }
        )
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(60), "the coordinator did not start"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GeoPubSubStub(self.channel)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.server, self.port, self.app = await create_server(
            self.settings, lambda k: LocalShard(k)
        )

    def close(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(stop_server(self.server, self.app), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    warm_up_shard()  # compiled first (a cold kernel cache takes a minute): calls are timed
    with RedisServer(tmp_path_factory.mktemp("redis")) as redis_server:
        c = Coordinator(redis_server.url)
        yield c
        c.close()


# ---- requests from the descriptors ---------------------------------------------------------
_PLAUSIBLE = st.sampled_from(["s1", "s2", "m1", "ipad", "sale", "ipad AND (sale OR deal)", "café"])
"""Ids and terms that make many requests valid, so that accepted paths are fuzzed too."""
_TEXT = st.one_of(
    _PLAUSIBLE,
    _PLAUSIBLE,
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.sampled_from(["", "\x00", "a\x00b", "ipad", "s1", " ", "(" * 300 + "a" + ")" * 300]),
    st.builds(lambda n, c: c * n, st.integers(200, 5_000), st.sampled_from(["a", "é", "("])),
    st.builds(lambda n: " AND ".join(f"t{i}" for i in range(n)) + " OR x", st.integers(1, 400)),
)
_DOUBLE = st.one_of(
    st.floats(-90, 90),
    st.floats(-90, 90),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 180.0, -180.0, 90.0, 1e12, math.nan]),
)
_INTS = {
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED64: st.integers(0, 2**64 - 1),
}


def _value(field: FieldDescriptor, depth: int):
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return _TEXT
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return _DOUBLE if t == FieldDescriptor.TYPE_DOUBLE else st.floats(width=32)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.integers(-5, 10)  # open enums: unknown values too
    if t in _INTS:
        return _INTS[t]
    if t == FieldDescriptor.TYPE_MESSAGE:
        return _message(field.message_type, depth + 1)
    raise AssertionError(f"no strategy for {field.full_name}")


def _is_map(f: FieldDescriptor) -> bool:
    return f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def _map_items(f: FieldDescriptor, depth: int):
    """(key, value) pairs for the map field ``f``."""
    key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
    return st.lists(st.tuples(_value(key, depth), _value(value, depth)), max_size=4)


def _put(msg, f: FieldDescriptor, items) -> None:
    container = getattr(msg, f.name)
    is_msg = f.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE
    for k, v in items:
        if is_msg:
            container[k].CopyFrom(v)
        else:
            container[k] = v


def _message(descriptor, depth: int = 0):
    cls = getattr(pb, descriptor.name)
    if depth > 3:
        return st.just(cls())
    fields = list(descriptor.fields)
    if not fields:
        return st.just(cls())

    @st.composite
    def build(draw):
        msg = cls()
        for f in draw(st.lists(st.sampled_from(fields), max_size=len(fields) + 2)):
            if _is_map(f):  # map<K, V>: entries by key
                _put(msg, f, draw(_map_items(f, depth)))
            elif f.label == FieldDescriptor.LABEL_REPEATED:
                values = draw(st.lists(_value(f, depth), max_size=4))
                container = getattr(msg, f.name)
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    for v in values:
                        container.add().CopyFrom(v)
                else:
                    container.extend(values)
            elif f.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(msg, f.name).CopyFrom(draw(_value(f, depth)))
            else:
                setattr(msg, f.name, draw(_value(f, depth)))
        return msg

    return build()


def _request(method) -> st.SearchStrategy:
    return _message(method.input_type)


SEEN: collections.Counter = collections.Counter()
"""(method, status) of every fuzzed call, to see that both accepted and refused requests came."""


def _call(c: Coordinator, method, requests: list) -> grpc.StatusCode:
    """Send ``requests`` (one, or a stream) to ``method``; the status the call ended with."""
    code = _status(c, method, requests)
    SEEN[method.name, code.name] += 1
    return code


def _status(c: Coordinator, method, requests: list) -> grpc.StatusCode:
    path = f"/{SERVICE.full_name}/{method.name}"
    ser = (lambda b: b) if isinstance(requests[0], bytes) else (lambda m: m.SerializeToString())
    try:
        if method.client_streaming:
            call = c.channel.stream_stream(path, ser, lambda b: b)
            for _ in call(iter(requests), timeout=10):
                pass
        elif method.server_streaming:
            call = c.channel.unary_stream(path, ser, lambda b: b)(requests[0], timeout=0.5)
            try:
                for _ in call:
                    pass
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:  # a live stream: still open
                    return grpc.StatusCode.OK
                raise
        else:
            c.channel.unary_unary(path, ser, lambda b: b)(requests[0], timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


_METHODS = [m for m in SERVICE.methods if m.name not in ("Reload", "Rebalance")]
"""Reload and Rebalance rebuild every shard (Rebalance up to 1,024 of them): below, a few times."""


@FUZZ
@given(data=st.data())
def test_every_field_of_every_request_gets_a_documented_status(coordinator, data):
    method = data.draw(st.sampled_from(_METHODS))
    n = data.draw(st.integers(1, 3)) if method.client_streaming else 1
    requests = [data.draw(_request(method)) for _ in range(n)]
    code = _call(coordinator, method, requests)
    assert code in DOCUMENTED, (method.name, code, requests)


@FUZZ
@given(data=st.data())
def test_bytes_that_are_no_request_get_a_documented_status(coordinator, data):
    method = data.draw(st.sampled_from(_METHODS))
    n = data.draw(st.integers(1, 3)) if method.client_streaming else 1
    requests = [data.draw(st.binary(max_size=200)) for _ in range(n)]
    code = _call(coordinator, method, requests)
    assert code in DOCUMENTED, (method.name, code, requests)


def _valid(name: str, k: int):
    """A request of method ``name`` that is served as it stands (``k`` varies its ids)."""
    rect = pb.Rect(min_lon=0, min_lat=0, max_lon=1, max_lat=1)
    sub = pb.Subscription(id=f"v{k}", keywords=["ipad"], rect=rect, moving=k % 2 == 0)
    msg = pb.Message(keywords=["ipad", "sale"], point=pb.Point(lon=0.5, lat=0.5), ttl_s=5)
    return {
        "Subscribe": lambda: pb.SubscribeRequest(subscription=sub),
        "Unsubscribe": lambda: pb.UnsubscribeRequest(id=f"v{k}"),
        "GetSubscription": lambda: pb.GetSubscriptionRequest(id=f"v{k}"),
        "Publish": lambda: pb.PublishRequest(message=msg),
        "PublishStream": lambda: pb.PublishRequest(messages=[msg, msg]),
        "UpdateLocation": lambda: pb.UpdateLocationRequest(
            id=f"v{k}", point=pb.Point(lon=0.6, lat=0.4)
        ),
        "LocationStream": lambda: pb.UpdateLocationRequest(
            moves=[pb.LocationUpdate(id=f"v{k}", point=pb.Point(lon=0.2, lat=0.2))]
        ),
        "StreamResults": lambda: pb.StreamResultsRequest(id=f"v{k}", after_sequence=k),
        "GetStats": lambda: pb.GetStatsRequest(),
        "GetDensity": lambda: pb.DensityRequest(view=rect, cols=4, rows=2, keyword="ipad"),
        "Watch": lambda: pb.WatchRequest(keyword="ipad", max_messages_per_s=10, max_movers=5),
    }[name]()


def _slots(msg) -> list:
    """(message, field) of every field of ``msg`` and of the messages set in it."""
    out = []
    for f in msg.DESCRIPTOR.fields:
        out.append((msg, f))
        if _is_map(f):
            continue
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if f.label == FieldDescriptor.LABEL_REPEATED:
                for sub in getattr(msg, f.name):
                    out += _slots(sub)
            elif msg.HasField(f.name):
                out += _slots(getattr(msg, f.name))
    return out


@FUZZ
@given(data=st.data())
@pytest.mark.slow
def test_one_hostile_field_in_a_request_that_was_valid(coordinator, data):
    """The accepted paths: a valid request with one field set (or added) to a hostile value."""
    method = data.draw(st.sampled_from([m for m in _METHODS if m.name != "GetStats"]))
    request = _valid(method.name, data.draw(st.integers(0, 5)))
    if data.draw(st.booleans()):  # else sent as it is
        msg, f = data.draw(st.sampled_from(_slots(request)))
        if _is_map(f):
            _put(msg, f, data.draw(_map_items(f, 2)))
        elif f.label == FieldDescriptor.LABEL_REPEATED:
            value = data.draw(_value(f, 2))
            container = getattr(msg, f.name)
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                container.add().CopyFrom(value)
            else:
                container.append(value)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, f.name).CopyFrom(data.draw(_value(f, 2)))
        else:
            setattr(msg, f.name, data.draw(_value(f, 2)))
    code = _call(coordinator, method, [request])
    assert code in DOCUMENTED, (method.name, code, request)


def test_reload_with_garbage_and_then_the_cluster_still_serves_exactly(coordinator):
    reload = SERVICE.methods_by_name["Reload"]
    for payload in (b"", b"\xff\xff", b"\x0a\x02hi"):
        assert _call(coordinator, reload, [payload]) in DOCUMENTED
    rebalance = SERVICE.methods_by_name["Rebalance"]
    for payload in (b"\xff\xff", b"\x08\x88\x27", pb.RebalanceRequest(shards=2)):  # 5000: no
        assert _call(coordinator, rebalance, [payload]) in DOCUMENTED
    health = health_pb2_grpc.HealthStub(coordinator.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    stub = coordinator.stub
    sid = f"after-{uuid.uuid4().hex}"
    sub = pb.Subscription(
        id=sid, expr="fuzz AND check", rect=pb.Rect(min_lon=1, min_lat=1, max_lon=2, max_lat=2)
    )
    stub.Subscribe(pb.SubscribeRequest(subscription=sub), timeout=10)
    hit = pb.Message(id=f"m-{sid}", keywords=["check", "fuzz"], point=pb.Point(lon=1.5, lat=1.5))
    miss = pb.Message(id=f"n-{sid}", keywords=["fuzz"], point=pb.Point(lon=1.5, lat=1.5))
    assert stub.Publish(pb.PublishRequest(message=hit), timeout=10).matched == 1
    assert stub.Publish(pb.PublishRequest(message=miss), timeout=10).matched == 0
    got = []
    call = stub.StreamResults(pb.StreamResultsRequest(id=sid), timeout=2)
    try:
        for d in call:
            got.append(d)
    except grpc.RpcError as exc:
        assert exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert [(d.sequence, d.message.id) for d in got] == [(1, hit.id)]


# ---- loader rows ---------------------------------------------------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _DOUBLE | _TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)
_ROW = st.dictionaries(
    st.sampled_from(["id", "keywords", "expr", "rect", "circle", "moving", "ephemeral", "x"]),
    _JSON,
    max_size=6,
)


def _lines() -> st.SearchStrategy:
    return st.lists(
        st.one_of(
            _ROW.map(lambda d: json.dumps(d, allow_nan=True)),
            st.text(max_size=80),
            st.just("[" * 5_000 + "]" * 5_000),  # nesting deeper than the recursion limit
            st.just('{"id": "a", "keywords": ["x"], "rect": [0, 0, 1, 1]}'),
        ),
        min_size=1,
        max_size=8,
    )


@settings(max_examples=300, deadline=None)
@given(lines=_lines())
def test_every_loader_row_is_kept_or_rejected_with_a_reason_never_an_exception(lines):
    """What the Spark job's executors run on each row (``loader.transform``): a row is an OK
    record or a BAD one with a reason, whatever it holds; the job never fails on a row."""
    for payload, raw in (
        (transform.jsonl_payload, lines),
        (transform.csv_payload, [line.replace("\n", " ") for line in lines]),
    ):
        out = list(transform.validate_rows([("f", 0, x) for x in raw], payload))
        rows = [r for r in out if r[0] in (transform.OK, transform.BAD)]
        assert len(rows) <= len(raw)  # (blank lines give none)
        assert all(isinstance(r[4], str) and r[4] for r in rows if r[0] == transform.BAD)
        assert out[-1][0] == transform.SUMMARY
        if payload is transform.jsonl_payload:
            assert len(rows) == sum(1 for x in raw if x.strip())
