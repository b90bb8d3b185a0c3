"""The one place that maps geopubsub's exceptions (``shard/errors.py``) to gRPC status codes.

Servicer methods raise; ``@grpc_errors`` turns what they raise into an aborted call::

    class Servicer(geopubsub_pb2_grpc.GeoPubSubServicer):
        @grpc_errors
        async def Subscribe(self, request, context): ...

        @grpc_errors
        async def StreamResults(self, request, context):  # async generator: streaming response
            yield ...
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from grpc.aio import AbortError

from shard.errors import (
    GeoPubSubError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    StoreFullError,
    UnauthenticatedError,
    UnavailableError,
    ValidationError,
)

log = logging.getLogger(__name__)

STATUS_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),  # ExpressionError included
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (StoreFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),  # an UnavailableError: before it
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    # A wait bounded by the call's deadline (asyncio.timeout(context.time_remaining())) ran out.
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
)
"""Checked in order; the first class the exception is an instance of gives the code."""

F = TypeVar("F", bound=Callable[..., Any])


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, details) for an exception. Details are the error's message (a ValidationError's
    reads ``field=value: reason``); anything unexpected is INTERNAL and does not leak its message.

    >>> status_for(NotFoundError("subscription", "s1"))
    (<StatusCode.NOT_FOUND: (5, 'not found')>, "subscription 's1' not found")
    """
    for cls, code in STATUS_CODES:
        if isinstance(exc, cls):
            return code, str(exc) if isinstance(exc, GeoPubSubError) else "deadline exceeded"
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})"


async def abort_for(exc: BaseException, context: grpc.aio.ServicerContext) -> NoReturn:
    """Abort the call with the status of ``exc``; an unexpected exception is logged first."""
    code, details = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.error("unexpected error in a gRPC method", exc_info=exc)
    await context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")  # for the type checker


def grpc_errors(method: F) -> F:
    """Decorate an async servicer method (coroutine, or async generator for a streaming response)
    so that an exception it raises aborts the call with the status ``status_for`` gives.
    An abort of the method's own (``context.abort``) and cancellation pass through unchanged.
    """
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for response in method(self, request, context):
                    yield response
            except AbortError:
                raise
            except Exception as exc:
                await abort_for(exc, context)

        return stream  # type: ignore[return-value]

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def unary(self: Any, request: Any, context: Any) -> Any:
            try:
                return await method(self, request, context)
            except AbortError:
                raise
            except Exception as exc:
                await abort_for(exc, context)

        return unary  # type: ignore[return-value]

    raise TypeError(f"{method.__qualname__} must be an async def method (grpc.aio)")
