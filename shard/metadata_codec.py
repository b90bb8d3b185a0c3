"""Names and value encoding of the subscription metadata in Redis, without any Redis client.

The coordinator (``coordinator.metadata``, async) and the bulk loader (``loader.load``, sync, on
Spark executors) both write subscriptions; they build keys and hash fields here, so a
subscription written by either is read back identically by the other. The key layout itself is
described in ``coordinator.metadata``.

>>> from shard.model import subscription_from_dict
>>> sub = subscription_from_dict({"id": "s1", "keywords": ["iPad"], "rect": [0, 0, 1, 1]})
>>> sub_key("gps", "s1"), encode_subscription(sub)
('gps:sub:s1', '{"id":"s1","keywords":["iPad"],"rect":[0.0,0.0,1.0,1.0]}')
>>> subscription_fields(sub, (0, 2), 5.0)
{'sub': '{"id":"s1","keywords":["iPad"],"rect":[0.0,0.0,1.0,1.0]}', 'shards': '0,2', 'updated': '5.0'}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from shard.model import Subscription, subscription_from_dict, subscription_to_dict

SUB_FIELD = "sub"
"""Hash field: the subscription in its workload (JSON) form."""
SHARDS_FIELD = "shards"
"""Hash field: the shards it is placed on, ``"0,2"``."""
CREATED_FIELD = "created"
"""Hash field: time of the first write (``repr`` of seconds since the epoch); never rewritten."""
UPDATED_FIELD = "updated"
"""Hash field: time of the last write that changed the subscription."""


def key(ns: str, *parts: str) -> str:
    return ":".join((ns, *parts))


def subs_key(ns: str) -> str:
    """The set of every registered subscription id."""
    return key(ns, "subs")


def sub_key(ns: str, sub_id: str) -> str:
    """The hash of one subscription (fields above)."""
    return key(ns, "sub", sub_id)


def pos_key(ns: str) -> str:
    """The hash of moving subscriptions' centres after their last move (``<dd`` lon, lat),
    written with each round (``coordinator.retention``); a subscription written anew (Subscribe,
    the bulk loader) drops its entry."""
    return key(ns, "pos")


def ephemeral_key(ns: str) -> str:
    """The set of subscriptions whose deliveries skip the retention log."""
    return key(ns, "ephemeral")


def partition_map_key(ns: str) -> str:
    """The string ``PartitionMap.to_json()``."""
    return key(ns, "partition_map")


_COMPACT = json.JSONEncoder(separators=(",", ":"))
"""One encoder: ``json.dumps`` with ``separators`` makes a new one each call (~1 µs)."""


def encode_subscription(sub: Subscription) -> str:
    """The ``sub`` field: compact JSON of ``subscription_to_dict``. O(terms)."""
    return _COMPACT.encode(subscription_to_dict(sub))


def decode_subscription(raw: bytes | str) -> Subscription:
    """Inverse of ``encode_subscription`` (validated again: Redis is outside the process)."""
    return subscription_from_dict(json.loads(raw))


def encode_shards(shards: Sequence[int]) -> str:
    """The ``shards`` field. O(shards)."""
    return ",".join(map(str, shards))


def encode_stamp(t: float) -> str:
    """The ``created`` / ``updated`` fields."""
    return repr(t)


def subscription_fields(sub: Subscription, shards: Sequence[int], stamp: float) -> dict[str, str]:
    """The fields an upsert sets (``created`` is set only if absent, with the same stamp)."""
    return encoded_fields(encode_subscription(sub), shards, stamp)


def encoded_fields(sub_json: str, shards: Sequence[int], stamp: float) -> dict[str, str]:
    """``subscription_fields`` for a subscription already encoded by ``encode_subscription``."""
    return {
        SUB_FIELD: sub_json,
        SHARDS_FIELD: encode_shards(shards),
        UPDATED_FIELD: encode_stamp(stamp),
    }


SECRET_QUERY_KEYS = frozenset({"password", "ssl_password"})
"""Query parameters of a Redis URL that hold a secret (redis-py reads them as keyword arguments)."""


def redacted(url: str) -> str:
    """``url`` with its password, and any ``password`` / ``ssl_password`` in its query, replaced
    by ``***``: what may be printed or logged.

    >>> redacted("redis://:s3cret@127.0.0.1:6379/0"), redacted("redis://127.0.0.1:6379/0")
    ('redis://:***@127.0.0.1:6379/0', 'redis://127.0.0.1:6379/0')
    >>> redacted("rediss://u:pw@[::1]:6380/0?ssl_ca_certs=/ca.pem&ssl_password=k")
    'rediss://u:***@[::1]:6380/0?ssl_ca_certs=/ca.pem&ssl_password=***'
    """
    parts = urlsplit(url)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(k in SECRET_QUERY_KEYS for k, _ in pairs):
            kept = [(k, "***" if k in SECRET_QUERY_KEYS else v) for k, v in pairs]
            parts = parts._replace(query=urlencode(kept, safe="/*:"))
    if parts.password is not None:
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
        parts = parts._replace(netloc=f"{user}:***@{host}{port}")
    return urlunsplit(parts)
