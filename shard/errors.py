"""The one exception hierarchy of geopubsub.

::

    GeoPubSubError
    ├── ValidationError        bad input; names the field and the value  -> INVALID_ARGUMENT
    │   └── ExpressionError    a keyword expression that does not parse  -> INVALID_ARGUMENT
    ├── NotFoundError          an unknown id                             -> NOT_FOUND
    ├── UnavailableError       a shard or Redis cannot be reached        -> UNAVAILABLE
    │   ├── StoreFullError     Redis at its maxmemory refuses writes     -> RESOURCE_EXHAUSTED
    │   └── ShardDeadError     a shard's actor is gone for good          -> UNAVAILABLE
    ├── OverloadedError        backpressure: a queue or store is full    -> RESOURCE_EXHAUSTED
    ├── UnauthenticatedError   no valid bearer token                     -> UNAUTHENTICATED
    └── PermissionDeniedError  the token's role or owner does not allow  -> PERMISSION_DENIED

The mapping to gRPC status codes lives in one place in the coordinator.
"""

from __future__ import annotations

from typing import Any


class GeoPubSubError(Exception):
    """Base of every error geopubsub raises on purpose."""


class ValidationError(GeoPubSubError, ValueError):
    """Invalid input. ``field`` is a dotted path (``rect[2]``, ``keywords[0]``), ``value`` the bad value.

    >>> str(ValidationError("rect[0]", 200.0, "longitude must be in [-180, 180]"))
    'rect[0]=200.0: longitude must be in [-180, 180]'
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={_show(value)}: {reason}")

    def __reduce__(self):  # survive pickling (Ray, multiprocessing): args is only the message
        return (type(self), (self.field, self.value, self.reason))


class ExpressionError(ValidationError):
    """A keyword expression (``expr``) that cannot be parsed or is too large."""


class NotFoundError(GeoPubSubError, KeyError):
    """An id that is not known (``kind`` is e.g. ``subscription``)."""

    def __init__(self, kind: str, ident: str) -> None:
        self.kind = kind
        self.ident = ident
        super().__init__(f"{kind} {_show(ident)} not found")

    def __reduce__(self):
        return (type(self), (self.kind, self.ident))

    def __str__(self) -> str:  # KeyError would quote the message; a long id is cut (_show)
        return f"{self.kind} {_show(self.ident)} not found"


class UnavailableError(GeoPubSubError):
    """A shard or Redis could not be reached."""


class StoreFullError(UnavailableError):
    """Redis refused a write at its maxmemory (policy noeviction); nothing of it was written.
    Code that waits for Redis to take writes again treats it as the UnavailableError it is; a
    client gets RESOURCE_EXHAUSTED (it is full, not down)."""


class ShardDeadError(UnavailableError):
    """A shard's Ray actor is dead for good (its restarts are used up): only a new actor
    brings the shard back (the coordinator makes one)."""


class OverloadedError(GeoPubSubError):
    """A bounded buffer or store is full (waiting operations, live messages); the caller should
    retry later."""


class UnauthenticatedError(GeoPubSubError):
    """A call without a bearer token, or with one that is unknown, revoked or expired."""


class PermissionDeniedError(GeoPubSubError):
    """A valid token whose role does not allow the method, or a subscription id outside its
    owner prefix (said without telling whether that subscription exists)."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
