"""The loader's load: subscription metadata into Redis from the Spark executors (sync redis-py).

Keys and values are those of ``coordinator.metadata`` (both build them with
``shard.metadata_codec``), so the coordinator reads what the loader wrote as if its own
``put_subscriptions`` had written it. Each executor sends batches of ``DEFAULT_BATCH``
subscriptions to one server-side script (``UPSERT_SCRIPT``) that writes only those new or
changed (``created`` only when absent) and adds every id to ``{ns}:subs``. Loading the same
rows again therefore writes nothing (the ``updated`` stamps stay), and a changed row replaces
the old version. (Pipelining the same commands from Python -- HMGET, then HSET per changed
subscription -- costs two client-side commands a subscription; the script costs ~3 arguments.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

import redis

from shard import metadata_codec as codec
from shard.errors import UnavailableError
from shard.partition_map import PartitionMap

DEFAULT_BATCH = 2000
"""Subscriptions per script call (the coordinator's ``SCAN_BATCH`` too): round trips become a
small share of the time, and Redis is busy with one call for only some milliseconds, so a
running coordinator's requests wait no longer than that."""


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=60.0, socket_connect_timeout=10.0)


def ping(url: str) -> None:
    """Raise ``UnavailableError`` unless Redis at ``url`` answers."""
    r = connect(url)
    try:
        r.ping()
    except (redis.RedisError, OSError) as exc:
        raise UnavailableError(f"redis at {codec.redacted(url)} unreachable: {exc}") from None
    finally:
        r.close()


def read_partition_map(url: str, ns: str) -> PartitionMap | None:
    r = connect(url)
    try:
        raw = r.get(codec.partition_map_key(ns))
    finally:
        r.close()
    return None if raw is None else PartitionMap.from_json(raw.decode())


def count_subscriptions(url: str, ns: str) -> int:
    r = connect(url)
    try:
        return int(r.scard(codec.subs_key(ns)))
    finally:
        r.close()


def write_partition_map(url: str, ns: str, pm: PartitionMap) -> None:
    r = connect(url)
    try:
        r.set(codec.partition_map_key(ns), pm.to_json())
    finally:
        r.close()


UPSERT_SCRIPT = """
local f_sub, f_shards, f_created, f_updated, stamp, prefix, data, eph = unpack(ARGV, 1, 8)
local new, changed, unchanged = 0, 0, 0
local ids = {}
local pos = 1
while pos <= #data do
  local a = string.find(data, '\\n', pos, true)
  local b = string.find(data, '\\n', a + 1, true)
  local c = string.find(data, '\\n', b + 1, true)
  local id = string.sub(data, pos, a - 1)
  local sub = string.sub(data, a + 1, b - 1)
  local shards = string.sub(data, b + 1, c - 1)
  pos = c + 1
  ids[#ids + 1] = id
  local k = prefix .. id
  local old = redis.call('HMGET', k, f_sub, f_shards, f_created)
  if old[1] == sub and old[2] == shards then
    unchanged = unchanged + 1
  else
    if old[1] then changed = changed + 1 else new = new + 1 end
    redis.call('HDEL', KEYS[3], id)
    if old[3] then
      redis.call('HSET', k, f_sub, sub, f_shards, shards, f_updated, stamp)
    else
      redis.call('HSET', k, f_sub, sub, f_shards, shards, f_updated, stamp, f_created, stamp)
    end
  end
end
if #ids > 0 then
  redis.call('SADD', KEYS[1], unpack(ids))
  redis.call(eph == '1' and 'SADD' or 'SREM', KEYS[2], unpack(ids))
end
return {new, changed, unchanged}
"""
"""One batch of upserts, run inside Redis: a subscription whose stored ``sub`` and ``shards``
equal the new ones is left alone, any other gets what ``Metadata.put_subscriptions`` writes
(``created`` only where absent; ``sub``, ``shards``, ``updated``; its id added to the set), and
every id is added to the ephemeral set (ARGV[8] "1") or removed from it; a subscription written
anew loses its last moved position (KEYS[3]: its region is the one loaded).
Keys, field names and values all come from the caller (``shard.metadata_codec``); the batch is
one argument: id, sub JSON and shards of each subscription, each followed by a line break (an
id is printable and JSON escapes line breaks, so no field holds one). One argument instead of
three a subscription takes most of the client's work away (redis-py encodes every argument). The script touches keys it does not declare, which a single Redis allows (a Redis
Cluster would not)."""


def upsert_subscriptions(
    items: Iterable[tuple[str, str, tuple[int, ...]]],
    url: str,
    ns: str,
    stamp: float,
    batch: int = DEFAULT_BATCH,
    ephemeral: bool = False,
) -> Iterator[dict]:
    """Upsert ``(id, sub_json, shards)`` items (one Spark partition) and yield one dict of
    counts: ``new``, ``changed``, ``unchanged`` and, per shard k, ``("shard", k)``. ``stamp`` is
    the ``created`` / ``updated`` time of what is written; ``ephemeral``: the subscriptions'
    deliveries skip the retention log (else they are logged, as a Subscribe without it). One script call per ``batch`` items
    (``UPSERT_SCRIPT``): O(items) work in Redis, ``items / batch`` round trips."""
    if batch > 7000:  # the ids go to one SADD through Lua's unpack (stack of ~8000)
        raise ValueError(f"batch {batch} > 7000")
    counts: dict = {"new": 0, "changed": 0, "unchanged": 0}
    r = connect(url)
    upsert = r.register_script(UPSERT_SCRIPT)
    head = [
        codec.SUB_FIELD,
        codec.SHARDS_FIELD,
        codec.CREATED_FIELD,
        codec.UPDATED_FIELD,
        codec.encode_stamp(stamp),
        codec.sub_key(ns, ""),
    ]
    subs_key = codec.subs_key(ns)
    eph_key = codec.ephemeral_key(ns)
    pos_key = codec.pos_key(ns)
    it = iter(items)
    try:
        while chunk := list(islice(it, batch)):
            lines = []
            for sub_id, sub_json, shards in chunk:
                lines += (sub_id, sub_json, codec.encode_shards(shards))
                for k in shards:
                    counts["shard", k] = counts.get(("shard", k), 0) + 1
            data = "\n".join(lines) + "\n"
            new, changed, unchanged = upsert(
                keys=[subs_key, eph_key, pos_key],
                args=[*head, data, "1" if ephemeral else "0"],
            )
            counts["new"] += new
            counts["changed"] += changed
            counts["unchanged"] += unchanged
    except (redis.RedisError, OSError) as exc:
        raise UnavailableError(f"redis at {codec.redacted(url)}: {exc}") from None
    finally:
        r.close()
    yield counts
