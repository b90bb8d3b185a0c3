"""Subscription metadata and the partition map in Redis, and the plain calls the retention log
(``coordinator.retention``) is written and read with.

Keys (``{ns}`` is ``Settings.namespace``)::

    {ns}:subs             set     every registered subscription id
    {ns}:sub:{id}         hash    sub (JSON, the workload form), shards ("0,2"), created, updated;
                                  while a Subscribe's round is not yet written, told (the JSON
                                  its subscriber was last told, "" none) and pending (a count)
    {ns}:untold           set     the subscriptions with told / pending (``PUT_SCRIPT``)
    {ns}:ephemeral        set     subscriptions whose deliveries skip the log
    {ns}:partition_map    string  PartitionMap.to_json()
    {ns}:round:…, {ns}:round_hi, {ns}:lease, {ns}:live, {ns}:pos, {ns}:outage:{k}
                                  the retention log (``coordinator.retention``)

Redis is the source of truth a restarted coordinator rebuilds the shards from. Writes are
pipelined in batches; every write is an idempotent upsert. Key names and the encoding of a
subscription's hash come from ``shard.metadata_codec``, which the bulk loader (``loader.load``)
uses too.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import OutOfMemoryError, RedisError

from shard import metadata_codec as codec
from shard.errors import StoreFullError, UnavailableError
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


SETS_LUA = """
local function each(cmd, key, list)
  for a = 1, #list, 1000 do
    redis.call(cmd, key, unpack(list, a, math.min(a + 999, #list)))
  end
end
"""
"""``each(cmd, key, list)``: ``cmd key member ...`` over ``list``, 1,000 members a command (Lua's
``unpack`` takes ~8,000): a set changed once a batch, not once a member."""

PUT_SCRIPT = (
    "#!lua\n"
    + SETS_LUA
    + """
local prefix, subs, eph, stamp, untold = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ids, flag, flagged = {}, {}, {}
for i = 6, #ARGV, 4 do
  local id = ARGV[i]
  local k = prefix .. id
  if redis.call('EXISTS', k) == 0 then
    if untold ~= '' then
      redis.call('HSET', k, 'created', stamp, 'sub', ARGV[i + 1], 'shards', ARGV[i + 2],
        'updated', stamp, 'told', '', 'pending', '1')
    else
      redis.call('HSET', k, 'created', stamp, 'sub', ARGV[i + 1], 'shards', ARGV[i + 2],
        'updated', stamp)
    end
  else
    if untold ~= '' then
      if redis.call('HEXISTS', k, 'told') == 0 then
        redis.call('HSET', k, 'told', redis.call('HGET', k, 'sub') or '')
      end
      redis.call('HINCRBY', k, 'pending', 1)
    end
    redis.call('HSETNX', k, 'created', stamp)
    redis.call('HSET', k, 'sub', ARGV[i + 1], 'shards', ARGV[i + 2], 'updated', stamp)
  end
  ids[#ids + 1] = id
  local f = ARGV[i + 3]
  if f ~= '-' then
    if flag[id] == nil then flagged[#flagged + 1] = id end
    flag[id] = f
  end
end
each('SADD', subs, ids)
if untold ~= '' then each('SADD', untold, ids) end
local on, off = {}, {}
for _, id in ipairs(flagged) do
  if flag[id] == '1' then on[#on + 1] = id else off[#off + 1] = id end
end
each('SADD', eph, on)
each('SREM', eph, off)
return 1
"""
).encode()
"""``put_subscriptions``: ARGV = hash key prefix, the id set, the ephemeral set, the stamp, the
untold set (empty: no marks), then per subscription its id, JSON, shards and ephemeral flag ('1',
'0', '-': unchanged; an id given twice: its last flag counts). With an untold set, each
subscription is *marked* until the rounds that
tell its subscriber of the change are written (``RoundLog.append`` unmarks it): ``told`` keeps
the subscription as it was before the first change not yet told ('' : none), ``pending`` counts
the changes on their way, and the id is in the untold set (``coordinator.outages``). The
``#!lua`` line gives it (empty) flags, so that Redis checks its maxmemory once, before the
script runs, and then lets it finish: a script without flags is refused at its first write past
maxmemory, after the writes before it. The field names are ``shard.metadata_codec``'s.

A new subscription costs two commands (EXISTS, one HSET of all its fields) and the sets one
command a batch: nine commands a subscription, each also appended to the AOF, cost Redis
17 µs of CPU a subscription in batched Subscribes (docs/BENCHMARKS.md)."""

UNMARK_LUA = (
    SETS_LUA
    + """
local unmarked = {}
local function unmark(key, id, force)
  if redis.call('EXISTS', key) == 0 then
    unmarked[#unmarked + 1] = id
  elseif force or redis.call('HINCRBY', key, 'pending', -1) <= 0 then
    redis.call('HDEL', key, 'told', 'pending')
    unmarked[#unmarked + 1] = id
  end
end
local function untell(untold)
  each('SREM', untold, unmarked)
  unmarked = {}
end
"""
)
"""``unmark(key, id, force)`` clears a subscription's untold mark (``PUT_SCRIPT``) once no change
is pending (a gone subscription's too); ``untell(untold)`` then takes the ids so cleared out of
the untold set, in one command."""
UNMARK_SCRIPT = (
    UNMARK_LUA
    + """
for i = 4, #ARGV do unmark(ARGV[1] .. ARGV[i], ARGV[i], ARGV[3] == '1') end
untell(ARGV[2])
return 1
"""
).encode()
"""``Metadata.unmark``: ARGV = hash key prefix, the untold set, force ('1' / '0'), the ids."""

DELETE_SCRIPT = (
    "#!lua flags=allow-oom\n"
    + SETS_LUA
    + """
local prefix, pos, subs, eph = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ids, keys = {}, {}
for i = 5, #ARGV do
  ids[#ids + 1] = ARGV[i]
  keys[#keys + 1] = prefix .. ARGV[i]
end
for a = 1, #keys, 1000 do redis.call('DEL', unpack(keys, a, math.min(a + 999, #keys))) end
each('HDEL', pos, ids)
each('SREM', subs, ids)
each('SREM', eph, ids)
return 1
"""
).encode()
"""``delete_subscriptions``: ARGV = hash key prefix, the position hash, the id set, the ephemeral
set, then the ids. ``allow-oom``: a full Redis must still let subscriptions go (each command
frees memory). Four commands a thousand ids."""

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
        return codec.key(self.ns, *parts)

    @property
    def pos_key(self) -> str:
        """The hash of moving subscriptions' last positions (``coordinator.retention``)."""
        return codec.pos_key(self.ns)

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> None:
        try:
            await self.r.ping()
        except (RedisError, OSError) as exc:
            raise UnavailableError(
                f"redis at {codec.redacted(self.url)} unreachable: {exc}"
            ) from None

    # ---- partition map ---------------------------------------------------------------------
    async def load_partition_map(self) -> PartitionMap | None:
        raw = await self._call(self.r.get(self.key("partition_map")))
        return None if raw is None else PartitionMap.from_json(raw.decode())

    async def save_partition_map(self, pm: PartitionMap) -> None:
        await self._call(self.r.set(self.key("partition_map"), pm.to_json()))

    # ---- subscriptions ---------------------------------------------------------------------
    async def put_subscriptions(
        self,
        items: Sequence[tuple[Subscription, Sequence[int]]],
        now: float | None = None,
        *,
        ephemeral: Sequence[bool] | None = None,
        mark: bool = False,
    ) -> None:
        """Upsert subscriptions with their shard placement (and, given ``ephemeral``, each one's
        flag) in one script call (``PUT_SCRIPT``): Redis runs it whole or, at its maxmemory,
        refuses it before it starts (a pipeline could stop part way and leave a batch half
        written). A Subscribe request is at most ``MAX_SUBSCRIBE_BATCH`` subscriptions (a few
        ms of Redis). ``mark``: each is marked untold until its round is written. One packed command: a redis-py pipeline cost the coordinator ~2 commands'
        worth of Python per subscription."""
        if not items:
            return
        stamp = codec.encode_stamp(time.time() if now is None else now).encode()
        args = [
            codec.sub_key(self.ns, "").encode(),
            codec.subs_key(self.ns).encode(),
            codec.ephemeral_key(self.ns).encode(),
            stamp,
            self.untold_key.encode() if mark else b"",
        ]
        flags = ephemeral if ephemeral is not None else [None] * len(items)
        for (sub, shards), e in zip(items, flags, strict=True):
            args += (
                sub.id.encode(),
                codec.encode_subscription(sub).encode(),
                codec.encode_shards(shards).encode(),
                b"-" if e is None else b"1" if e else b"0",
            )
        await self.eval_packed(PUT_SCRIPT, args)

    @property
    def untold_key(self) -> str:
        """The set of subscriptions marked untold (``PUT_SCRIPT``)."""
        return self.key("untold")

    async def untold(self) -> dict[str, Subscription | None]:
        """The subscriptions marked untold, each as its subscriber was last told (None: it had
        none); one gone since is dropped from the set."""
        ids = [i.decode() for i in await self._call(self.r.smembers(self.untold_key))]
        out: dict[str, Subscription | None] = {}
        gone = []
        for i in ids:
            raw = await self._call(self.r.hget(codec.sub_key(self.ns, i), "told"))
            if raw is None:
                gone.append(i)
            else:
                out[i] = codec.decode_subscription(raw) if raw else None
        if gone:
            await self._call(self.r.srem(self.untold_key, *gone))
        return out

    async def unmark(self, ids: Sequence[str], *, force: bool = False) -> None:
        """One change of each of ``ids`` is told (or will never be: ``force`` clears the mark
        whole)."""
        if ids:
            args = [
                codec.sub_key(self.ns, "").encode(),
                self.untold_key.encode(),
                b"1" if force else b"0",
            ]
            await self.eval_packed(UNMARK_SCRIPT, args + [i.encode() for i in ids])

    async def ephemeral_ids(self) -> set[str]:
        return {i.decode() for i in await self._call(self.r.smembers(codec.ephemeral_key(self.ns)))}

    async def delete_subscriptions(self, ids: Iterable[str]) -> None:
        """Forget subscriptions (their hash, position, and membership of the id and ephemeral
        sets) in one script call (``DELETE_SCRIPT``): a redis-py pipeline of four commands a
        subscription took ~60 % of the coordinator's time in batched Unsubscribes (py-spy,
        docs/BENCHMARKS.md)."""
        ids = list(ids)
        if not ids:
            return
        args = [
            codec.sub_key(self.ns, "").encode(),
            self.pos_key.encode(),
            codec.subs_key(self.ns).encode(),
            codec.ephemeral_key(self.ns).encode(),
        ]
        await self.eval_packed(DELETE_SCRIPT, args + [i.encode() for i in ids])

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

    # ---- plain calls (the retention log) ------------------------------------------------
    async def get(self, key: bytes) -> bytes | None:
        return await self._call(self.r.get(key))

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return await self._call(self.r.mget(keys)) if keys else []

    async def hgetall(self, key: bytes) -> dict[bytes, bytes]:
        """Every field of a hash, read in pages (HSCAN: Redis is not blocked by a big one)."""
        out: dict[bytes, bytes] = {}
        cursor = 0
        while True:
            cursor, page = await self._call(self.r.hscan(key, cursor, count=SCAN_BATCH))
            out.update(page)
            if cursor == 0:
                return out

    async def hset_pairs(self, key: bytes, pairs: Sequence[tuple[bytes, int]]) -> None:
        """HSET ``key`` field value ... in commands of ``SCAN_BATCH`` pairs."""
        for a in range(0, len(pairs), SCAN_BATCH):
            part = pairs[a : a + SCAN_BATCH]
            await self._call(self.r.hset(key, mapping=dict(part)))

    async def eval_packed(self, script: bytes, args: Sequence[bytes]):
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
        except OutOfMemoryError:
            raise StoreFullError(_full(codec.redacted(self.url))) from None
        except (RedisError, OSError) as exc:
            raise UnavailableError(f"redis at {codec.redacted(self.url)}: {exc}") from None

    async def _call(self, awaitable):
        """Await a Redis command: StoreFullError when Redis is full (maxmemory reached,
        ``noeviction``: it refuses writes), UnavailableError for any other Redis failure."""
        try:
            return await awaitable
        except OutOfMemoryError:
            raise StoreFullError(_full(codec.redacted(self.url))) from None
        except (RedisError, OSError) as exc:
            raise UnavailableError(f"redis at {codec.redacted(self.url)}: {exc}") from None


def _full(url: str) -> str:
    return (
        f"redis at {url} is full: it refused a write at its maxmemory (policy noeviction); "
        "retry once deliveries or subscriptions are removed, or raise maxmemory "
        "(redis_maxmemory_mb)"
    )
