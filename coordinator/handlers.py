"""The GeoPubSub service registered on a gRPC server with requests decoded without trusting them.

The generated ``add_GeoPubSubServicer_to_server`` decodes each request with ``FromString``; bytes
that are not a valid message of its type (truncated, a wrong wire type, a string field that is
not UTF-8, which a client in another language can send) make that raise, and grpc then answers
UNKNOWN ("Unexpected DecodeError") before any servicer code runs. Here every request is decoded
by ``_decode``: what does not parse becomes a ``Malformed`` stand-in whose every use raises
``ValidationError`` (field ``request``, naming the message type and the parser's reason), which
the servicer's ``@grpc_errors`` answers INVALID_ARGUMENT — in a request stream, after the
requests before it were served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from geopubsub.v1 import geopubsub_pb2 as pb
from shard.errors import ValidationError

SERVICE = pb.DESCRIPTOR.services_by_name["GeoPubSub"]

_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


class Malformed:
    """A request whose bytes did not parse: any attribute raises ``ValidationError``.

    >>> m = Malformed("SubscribeRequest", 3, "Error parsing message")
    >>> m.subscription
    Traceback (most recent call last):
    ...
    shard.errors.ValidationError: request='3 bytes': not a valid SubscribeRequest (Error parsing message)
    """

    __slots__ = ("error",)

    def __init__(self, type_name: str, size: int, reason: str) -> None:
        self.error = ValidationError(
            "request", f"{size} bytes", f"not a valid {type_name} ({reason})"
        )

    def __getattr__(self, name: str) -> Any:
        raise self.error


def _decode(cls: type) -> Callable[[bytes], Any]:
    name = cls.DESCRIPTOR.name

    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as exc:
            return Malformed(name, len(data), str(exc) or type(exc).__name__)

    return decode


def add_service(servicer: Any, server: grpc.aio.Server) -> None:
    """Register ``servicer``'s methods of ``geopubsub.v1.GeoPubSub`` on ``server`` (as the
    generated ``add_GeoPubSubServicer_to_server`` does, with ``_decode`` for every request)."""
    handlers = {}
    for method in SERVICE.methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        make = _HANDLERS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_decode(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(SERVICE.full_name, handlers)  # (as generated)
