"""The generated gRPC code is current, and the API keeps its names and field numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from geopubsub.v1 import geopubsub_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("geopubsub_pb2.py", "geopubsub_pb2.pyi", "geopubsub_pb2_grpc.py")


def test_generated_code_is_current(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "geopubsub" / "v1" / name).read_bytes()
        checked_in = (ROOT / "geopubsub" / "v1" / name).read_bytes()
        assert fresh == checked_in, f"geopubsub/v1/{name} is stale: run protos/generate.py"


# message -> {field: (number, type name or message type)} as the issue lists them
FIELDS = {
    "Point": {"lon": (1, "double"), "lat": (2, "double")},
    "Rect": {
        "min_lon": (1, "double"),
        "min_lat": (2, "double"),
        "max_lon": (3, "double"),
        "max_lat": (4, "double"),
    },
    "Circle": {"lon": (1, "double"), "lat": (2, "double"), "radius_m": (3, "double")},
    "Subscription": {
        "id": (1, "string"),
        "keywords": (2, "string"),
        "expr": (3, "string"),
        "rect": (4, "Rect"),
        "circle": (5, "Circle"),
        "moving": (6, "bool"),
    },
    "Message": {
        "id": (1, "string"),
        "keywords": (2, "string"),
        "text": (3, "string"),
        "point": (4, "Point"),
        "rect": (5, "Rect"),
        "ttl_s": (6, "double"),
    },
    "Delivery": {
        "subscription_id": (1, "string"),
        "sequence": (2, "uint64"),
        "kind": (3, "Kind"),
        "message": (4, "Message"),
        "time": (5, "double"),
    },
    "SubscribeRequest": {"subscription": (1, "Subscription")},
    "SubscribeResponse": {"id": (1, "string")},
    "UnsubscribeRequest": {"id": (1, "string")},
    "GetSubscriptionRequest": {"id": (1, "string")},
    "PublishRequest": {"message": (1, "Message")},
    "PublishResponse": {"id": (1, "string"), "matched": (2, "uint32")},
    "UpdateLocationRequest": {"id": (1, "string"), "point": (2, "Point")},
    "UpdateLocationResponse": {"updates": (1, "Delivery")},
    "StreamResultsRequest": {"id": (1, "string"), "after_sequence": (2, "uint64")},
}
SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
}


def _type_name(field) -> str:
    if field.message_type is not None:
        return field.message_type.name
    if field.enum_type is not None:
        return field.enum_type.name
    return SCALARS[field.type]


@pytest.mark.parametrize("message", sorted(FIELDS))
def test_fields_keep_the_names_and_numbers_of_the_issue(message):
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    got = {
        name: (descriptor.fields_by_name[name].number, _type_name(descriptor.fields_by_name[name]))
        for name in FIELDS[message]
        if name in descriptor.fields_by_name
    }
    assert got == FIELDS[message]


def test_oneofs_kinds_and_repeated_fields():
    sub = pb.DESCRIPTOR.message_types_by_name["Subscription"]
    msg = pb.DESCRIPTOR.message_types_by_name["Message"]
    assert [f.name for f in sub.oneofs_by_name["region"].fields] == [
        "rect",
        "circle",
        "polygon",
        "point",
    ]
    assert [f.name for f in msg.oneofs_by_name["location"].fields] == ["point", "rect"]
    assert pb.Delivery.Kind.items() == [("ADD", 0), ("REMOVE", 1), ("GAP", 2)]
    repeated = {
        (m, f.name)
        for m in ("Subscription", "Message", "UpdateLocationResponse", "Stats")
        for f in pb.DESCRIPTOR.message_types_by_name[m].fields
        if f.is_repeated
    }
    assert repeated == {
        ("Subscription", "keywords"),
        ("Subscription", "predicates"),
        ("Subscription", "weights"),  # a map
        ("Message", "keywords"),
        ("Message", "attributes"),  # a map
        ("UpdateLocationResponse", "updates"),
        ("Stats", "shards"),
    }


def test_service_methods_and_streaming():
    service = pb.DESCRIPTOR.services_by_name["GeoPubSub"]
    got = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    }
    assert got == {
        "Subscribe": ("SubscribeRequest", "SubscribeResponse", False, False),
        "Unsubscribe": ("UnsubscribeRequest", "UnsubscribeResponse", False, False),
        "GetSubscription": ("GetSubscriptionRequest", "Subscription", False, False),
        "Publish": ("PublishRequest", "PublishResponse", False, False),
        "PublishStream": ("PublishRequest", "PublishResponse", True, True),
        "UpdateLocation": ("UpdateLocationRequest", "UpdateLocationResponse", False, False),
        "LocationStream": ("UpdateLocationRequest", "Delivery", True, True),
        "StreamResults": ("StreamResultsRequest", "Delivery", False, True),
        "GetStats": ("GetStatsRequest", "Stats", False, False),
        "Reload": ("ReloadRequest", "ReloadResponse", False, False),
        "Rebalance": ("RebalanceRequest", "RebalanceResponse", False, False),
        "GetDensity": ("DensityRequest", "Density", False, False),
        "Watch": ("WatchRequest", "WatchEvents", False, True),
    }
    assert pb.DESCRIPTOR.package == "geopubsub.v1"
