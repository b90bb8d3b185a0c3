"""Subscription metadata, the partition map and the delivery retention log in Redis.

Keys (``{ns}`` is ``Settings.namespace``)::

    {ns}:subs             set     every registered subscription id
    {ns}:sub:{id}         hash    sub (JSON, the workload form), shards ("0,2"), created, updated
    {ns}:ephemeral        set     subscriptions whose deliveries skip the log
    {ns}:partition_map    string  PartitionMap.to_json()
    {ns}:log:{id}         stream  deliveries of {id}; entry id "{sequence}-0"; fields k (0 ADD,
                                  1 REMOVE), i (message id), t (time)
    {ns}:msg:{id}         string  a delivered message as published (pb.Message), kept for the
                                  retention time; log entries refer to it by id

Redis is the source of truth a restarted coordinator rebuilds the shards from. Writes are
pipelined in batches; every write is an idempotent upsert. Key names and the encoding of a
subscription's hash come from ``shard.metadata_codec``, which the bulk loader (``loader.load``)
uses too.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from geopubsub.v1 import geopubsub_pb2 as pb
from shard import metadata_codec as codec
from shard.errors import UnavailableError
from shard.model import Subscription
from shard.partition_map import PartitionMap

SCAN_BATCH = 2000
SCAN_SCRIPT = """
local page = redis.call('SSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local out = {}
for _, id in ipairs(page[2]) do
  local sub = redis.call('HGET', ARGV[3] .. id, ARGV[4])
  if sub then out[#out + 1] = sub end
end
return {page[1], table.concat(out, '\\n')}
"""
"""One page of ``iter_subscriptions``: (next cursor, the ``sub`` fields of the page's ids joined
by line breaks; a JSON text holds none). Reads only; touches keys it does not declare, which a
single Redis allows."""


LOG_CHUNK = 4096
"""Deliveries (or ids) per script call of the retention log."""
APPEND_SCRIPT = b"""
local logp, msgp, maxlen, ttl, t = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n = tonumber(ARGV[6])
local i = 7
for _ = 1, n do
  redis.call('SET', msgp .. ARGV[i], ARGV[i + 1], 'EX', ttl)
  i = i + 2
end
while i <= #ARGV do
  local key, kind = logp .. ARGV[i], tonumber(ARGV[i + 2])
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, ARGV[i + 1] .. '-0',
             'k', kind % 2, 'i', ARGV[i + 3], 't', t)
  if kind >= 2 then redis.call('EXPIRE', key, ttl) end
  i = i + 4
end
return 1
"""
"""``append_log``: ARGV = log prefix, message prefix, maxlen, ttl, time, n, then n (message id,
payload), then per delivery (sub id, sequence, kind + 2 if the log's expiry is refreshed,
message id). Touches keys it does not declare, which a single Redis allows."""
LAST_SEQ_SCRIPT = b"""
local out = {}
for i = 2, #ARGV do
  local e = redis.call('XREVRANGE', ARGV[1] .. ARGV[i], '+', '-', 'COUNT', 1)
  out[#out + 1] = e[1] and string.match(e[1][1], '^(%d+)') or '0'
end
return table.concat(out, ',')
"""
"""``last_sequences``: ARGV = log prefix, then ids; the last sequences joined by commas."""
LOGGED_SCRIPT = b"""
local page = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local out = {}
local skip = string.len(ARGV[4]) + 1
for _, k in ipairs(page[2]) do
  local e = redis.call('XREVRANGE', k, '+', '-', 'COUNT', 1)
  if e[1] then
    out[#out + 1] = string.sub(k, skip)
    out[#out + 1] = string.match(e[1][1], '^(%d+)')
  end
end
return {page[1], table.concat(out, '\\n')}
"""
"""``logged_sequences``: ARGV = SCAN cursor, pattern, count, log prefix; the next cursor and
the page's (id, last sequence) pairs, all joined by line breaks (ids are printable)."""
LOGGED_SCAN_COUNT = 10_000


def removal_payload(msg_id: str) -> bytes:
    """The Message of a REMOVE delivery: the id alone."""
    return pb.Message(id=msg_id).SerializeToString()


REDIS_RETRIES = 1
"""Retries of a command that failed on a broken connection or timed out (a connection left
over from a Redis that restarted fails once, then the retry reconnects)."""


class Metadata:
    """Async access to the cluster's Redis keys.

    ``timeout_s`` bounds every command (connect, and each wait for an answer): a Redis that is
    down or stopped makes a call raise ``UnavailableError`` within about ``timeout_s`` instead
    of hanging (the coordinator passes ``Settings.deadline_s``). Each of the ``1 +
    REDIS_RETRIES`` attempts gets its share. None: no timeouts (tools, tests).
    """

    def __init__(self, url: str, namespace: str = "gps", *, timeout_s: float | None = None) -> None:
        self.url = url
        self.ns = namespace
        self.timeout_s = timeout_s
        bounded = {}
        if timeout_s is not None:
            share = timeout_s / (1 + REDIS_RETRIES)
            bounded = {
                "socket_timeout": share,
                "socket_connect_timeout": share,
                "retry": Retry(NoBackoff(), REDIS_RETRIES),
            }
        self.r = aioredis.from_url(url, decode_responses=False, **bounded)

    def key(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> None:
        try:
            await self.r.ping()
        except (RedisError, OSError) as exc:
            raise UnavailableError(f"redis at {self.url} unreachable: {exc}") from None

    # ---- partition map ---------------------------------------------------------------------
    async def load_partition_map(self) -> PartitionMap | None:
        raw = await self._call(self.r.get(self.key("partition_map")))
        return None if raw is None else PartitionMap.from_json(raw.decode())

    async def save_partition_map(self, pm: PartitionMap) -> None:
        await self._call(self.r.set(self.key("partition_map"), pm.to_json()))

    # ---- subscriptions ---------------------------------------------------------------------
    async def put_subscriptions(
        self, items: Sequence[tuple[Subscription, Sequence[int]]], now: float | None = None
    ) -> None:
        """Upsert subscriptions with their shard placement, in one pipeline."""
        if not items:
            return
        t = time.time() if now is None else now
        stamp = codec.encode_stamp(t)
        pipe = self.r.pipeline(transaction=False)
        for sub, shards in items:
            k = codec.sub_key(self.ns, sub.id)
            pipe.hsetnx(k, codec.CREATED_FIELD, stamp)
            pipe.hset(k, mapping=codec.subscription_fields(sub, shards, t))
            pipe.sadd(codec.subs_key(self.ns), sub.id)
        await self._call(pipe.execute())

    async def set_ephemeral(self, sub_id: str, ephemeral: bool) -> None:
        k = codec.ephemeral_key(self.ns)
        await self._call(self.r.sadd(k, sub_id) if ephemeral else self.r.srem(k, sub_id))

    async def ephemeral_ids(self) -> set[str]:
        return {i.decode() for i in await self._call(self.r.smembers(codec.ephemeral_key(self.ns)))}

    async def delete_subscriptions(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        if not ids:
            return
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.delete(self.key("sub", i), self.key("log", i))
            pipe.srem(self.key("subs"), i)
            pipe.srem(codec.ephemeral_key(self.ns), i)
        await self._call(pipe.execute())

    async def get_subscription(self, sub_id: str) -> Subscription | None:
        raw = await self._call(self.r.hget(codec.sub_key(self.ns, sub_id), codec.SUB_FIELD))
        return None if raw is None else codec.decode_subscription(raw)

    async def count_subscriptions(self) -> int:
        return int(await self._call(self.r.scard(self.key("subs"))))

    async def iter_subscriptions(self) -> AsyncIterator[list[Subscription]]:
        """Every registered subscription, in batches: one script call per batch
        (``SCAN_SCRIPT``: SSCAN, then HGET of each id's ``sub``, inside Redis), whose reply is
        the batch's JSON forms joined by line breaks. One reply a batch instead of one per
        subscription: reading 1M subscriptions took 34.6 s of CPU with SSCAN + a pipelined HGET
        each, ~25 µs a subscription of them in redis-py."""
        scan = self.r.register_script(SCAN_SCRIPT)
        prefix = codec.sub_key(self.ns, "")
        cursor = b"0"
        while True:
            cursor, raw = await self._call(
                scan(
                    keys=[codec.subs_key(self.ns)],
                    args=[cursor, SCAN_BATCH, prefix, codec.SUB_FIELD],
                )
            )
            if raw:
                yield [codec.decode_subscription(line) for line in raw.split(b"\n")]
            if cursor == b"0":
                return

    # ---- delivery retention ----------------------------------------------------------------
    async def last_sequences(self, ids: Sequence[str]) -> list[int]:
        """The last logged sequence of each subscription (0 if none); one script call per
        ``LOG_CHUNK`` ids."""
        out: list[int] = []
        prefix = self.key("log", "").encode()
        for a in range(0, len(ids), LOG_CHUNK):
            chunk = [prefix] + [i.encode() for i in ids[a : a + LOG_CHUNK]]
            reply = await self._eval(LAST_SEQ_SCRIPT, chunk)
            out.extend(int(x) for x in reply.split(b","))
        return out

    async def logged_sequences(self) -> dict[str, int]:
        """The last logged sequence of every subscription that has a retention log, read once
        at start (``LOGGED_SCRIPT``: SCAN and XREVRANGE inside Redis, a page per call) so that
        rounds need not ask for it; O(keys in the database)."""
        prefix = self.key("log", "").encode()
        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", prefix) + b"*"
        out: dict[str, int] = {}
        cursor = b"0"
        while True:
            cursor, raw = await self._eval(
                LOGGED_SCRIPT, [cursor, pattern, b"%d" % LOGGED_SCAN_COUNT, prefix]
            )
            if raw:
                parts = raw.decode().split("\n")
                out.update(zip(parts[0::2], map(int, parts[1::2]), strict=True))
            if cursor == b"0":
                return out

    async def append_log(
        self,
        deliveries: Sequence[tuple[str, int, int, str, bool]],
        payloads: dict[str, bytes],
        t: float,
        maxlen: int,
        ttl_s: float,
    ) -> None:
        """Log one round's deliveries, (sub id, sequence, kind 0/1, message id, refresh the
        log's expiry?), all at time ``t``, with the payloads of the messages ADDed (each stored
        once, for ``ttl_s``). Each log keeps about ``maxlen`` entries and expires ``ttl_s``
        after the last refresh. One script call per ``LOG_CHUNK`` deliveries, its command
        packed here (redis-py packs argument by argument: that cost ~30 us per delivery)."""
        if not deliveries:
            return
        ttl = b"%d" % max(1, int(ttl_s))
        head = [
            self.key("log", "").encode(),
            self.key("msg", "").encode(),
            b"%d" % maxlen,
            ttl,
            repr(t).encode(),
        ]
        for a in range(0, len(deliveries), LOG_CHUNK):
            part = deliveries[a : a + LOG_CHUNK]
            msgs = {m for _, _, kind, m, _ in part if kind == 0}
            args = [*head, b"%d" % len(msgs)]
            for m in msgs:
                args += (m.encode(), payloads[m])
            for sub_id, seq, kind, m, refresh in part:
                args += (sub_id.encode(), b"%d" % seq, b"%d" % (kind + 2 * refresh), m.encode())
            await self._eval(APPEND_SCRIPT, args)

    async def read_log(
        self, sub_id: str, after: int, count: int = 1000
    ) -> list[tuple[int, int, bytes, float]]:
        """Logged deliveries with sequence > ``after``: (sequence, kind, message bytes, time); a
        message whose stored payload has expired reads as its id alone."""
        rows = await self._call(
            self.r.xrange(self.key("log", sub_id), min=f"({after}-0", max="+", count=count)
        )
        ids = [f[b"i"] for _, f in rows if int(f[b"k"]) == 0]
        stored = (
            await self._call(self.r.mget([self.key("msg", i.decode()) for i in ids])) if ids else []
        )
        found = dict(zip(ids, stored, strict=True))
        out = []
        for i, f in rows:
            kind = int(f[b"k"])
            payload = found.get(f[b"i"]) if kind == 0 else None
            if payload is None:
                payload = removal_payload(f[b"i"].decode())
            out.append((int(i.split(b"-")[0]), kind, payload, float(f[b"t"])))
        return out

    async def _eval(self, script: bytes, args: Sequence[bytes]):
        """EVAL ``script`` with no keys and ``args``, the command packed in one piece."""
        parts = [
            b"*%d\r\n$4\r\nEVAL\r\n$%d\r\n%b\r\n$1\r\n0\r\n" % (len(args) + 3, len(script), script)
        ]
        parts += [b"$%d\r\n%b\r\n" % (len(a), a) for a in args]
        pool = self.r.connection_pool
        try:
            conn = await pool.get_connection()
            try:
                await conn.send_packed_command(b"".join(parts))
                return await conn.read_response()
            finally:
                await pool.release(conn)
        except (RedisError, OSError) as exc:
            raise UnavailableError(f"redis at {self.url}: {exc}") from None

    async def _call(self, awaitable):
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            raise UnavailableError(f"redis at {self.url}: {exc}") from None
