"""The retention log: each round's durable deliveries as one blob in Redis, read back per
subscription by following the chain its records form through the blobs.

A round is written with one script call (``APPEND_SCRIPT``) before any of its deliveries is
answered or streamed, so a delivery that was acknowledged is in Redis. Redis does no work per
delivery: one SET of one blob a round (a Redis stream per subscription capped the cluster at
~6,000 msgs/s, one XADD per delivery; docs/BENCHMARKS.md). Each subscription's record in a round
names the round of its previous record (``prev``), and the coordinator keeps the round of every
subscription's newest record (``Slots.head``); ``WALK_SCRIPT`` follows that chain inside Redis,
newest first, to the sequence a stream resumes after.

Keys (``{ns}`` is ``Settings.namespace``)::

    {ns}:round:{n}   string  round n's blob (below); expires (1 + EXPIRE_SLACK) x retention_s
                             after it is written, and is deleted earlier once the log is over
                             its size budget (oldest first)
    {ns}:round_hi    string  the last round number written (round numbers keep increasing)
    {ns}:lease       hash    subscription id -> the highest sequence number an ephemeral
                             subscription may have been given (``Deliveries`` extends it before
                             going past it; a restart continues from it)
    {ns}:live        hash    message id -> ``<d`` expiry + payload: the stored messages not yet
                             expired (a restart stores them in the shards again)
    {ns}:pos         hash    moving subscription id -> ``<dd`` lon, lat: its centre after its
                             last move (a restart puts it there)
    {ns}:owed        hash    message id -> the shards ("," -joined) that still hold a stored
                             message past its expiry which its other shards expired while
                             these were down (``LiveMessages.owed``: a restart stores it only there)
    {ns}:outage:{k}  hash    shard k's outage record: what it missed while it was down and
                             has not yet been told again (``coordinator.outages``)

A blob (little-endian): ``HEAD`` ``<4sQdIIIIII``: magic, round, time, subscriptions, deliveries,
messages, DIR length, published ids, PUB length; ``DIR``: "\\n" id "\\n" id ... "\\n" (ids are
printable, so "\\n" id "\\n" finds exactly one); ``DOFF`` u32 per subscription: offset of its
"\\n" in DIR; ``SREC`` per subscription ``<QQII``: prev round (0: none), first sequence, count,
index of its first delivery; ``KIND`` u8 and ``MIDX`` u32 per delivery (grouped by
subscription); ``MOFF`` u32 x (messages + 1); ``MSGS`` per message ``<H`` id length, id, then
its payload (a serialized Message; empty for a message only REMOVEd); ``CUT`` (only when the
round unsubscribed someone): ``<I`` count, ``<Q`` per id the last sequence its unsubscribe left
(``Slots.floor``), the ids "\\n"-joined; ``PUB``: the client-given ids of the round's
publishes, "\\n"-joined, and ``PUBN`` u32 matched per id (``Dedupe``). ``WALK_SCRIPT`` reads
only up to MSGS.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator.metadata import UNMARK_LUA, Metadata
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.model import REMOVE, Sign

MAGIC = b"GPR1"
HEAD = struct.Struct("<4sQdIIIIII")
SREC = np.dtype([("prev", "<u8"), ("first", "<u8"), ("count", "<u4"), ("start", "<u4")])
EXPIRE_SLACK = 0.25
"""A blob expires this share of ``retention_s`` after a read would skip it as too old."""
WALK_HOPS = 512
"""Records one ``WALK_SCRIPT`` call follows (Redis runs one script at a time: a deep resume is
served in several calls)."""
SCAN_BATCH = 256
"""Blobs fetched per pipeline when the log is read at start."""

APPEND_SCRIPT = (
    UNMARK_LUA
    + """
local n = ARGV[1]
redis.call('SET', ARGV[2] .. n, ARGV[3], 'EX', ARGV[4])
redis.call('SET', ARGV[5], n)
local i = 10
local function groups(cmd, key, width)
  local stop = i + 1 + width * tonumber(ARGV[i])
  i = i + 1
  while i < stop do
    local j = math.min(i + 1000 - 1, stop - 1)
    redis.call(cmd, key, unpack(ARGV, i, j))
    i = j + 1
  end
end
groups('HSET', ARGV[6], 2)
groups('HSET', ARGV[7], 2)
local gone = i
groups('HDEL', ARGV[7], 1)
i = gone
groups('HDEL', ARGV[9], 1)
groups('HSET', ARGV[8], 2)
groups('HSET', ARGV[9], 2)
local function per_key(cmd, width)
  local stop = i + 1 + width * tonumber(ARGV[i])
  i = i + 1
  while i < stop do
    redis.call(cmd, unpack(ARGV, i, i + width - 1))
    i = i + width
  end
end
per_key('DEL', 1)
per_key('HDEL', 2)
local noted = i + 1 + 3 * tonumber(ARGV[i])
i = i + 1
while i < noted do
  local cmd = 'HSETNX'
  if string.sub(ARGV[i + 1], 1, 1) == 'm' and #ARGV[i + 2] > 0 then cmd = 'HSET' end
  redis.call(cmd, ARGV[i], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
local told = i + 3 + tonumber(ARGV[i])
for j = i + 3, told - 1 do unmark(ARGV[i + 1] .. ARGV[j], ARGV[j], false) end
untell(ARGV[i + 2])
i = told
while i <= #ARGV do
  redis.call('DEL', ARGV[2] .. ARGV[i])
  i = i + 1
end
return 1
"""
).encode()
"""ARGV: round, blob prefix, blob, ttl, round_hi key, lease key, live key, position key, owed
key; then eight groups, each a count and its items: leases (id, sequence), live messages stored
(id, ``<d`` expiry + payload), live messages expired (id; their owed fields go too), positions
(id, ``<dd`` lon, lat), owed (id, the shards "," -joined: ``LiveMessages.owed``), outage
records deleted (key), outage fields settled (key, field), outage fields noted (key, field,
value; the first value kept, but a one-shot message's payload replaces an empty value); then the count of subscribe changes told, the subscription key
prefix, the untold set, and their ids (``Metadata.unmark``); then the rounds to delete
(trimmed). Items go 1,000 values a command (Lua's unpack takes ~8,000)."""

ADOPT_SCRIPT = (
    UNMARK_LUA
    + """
local n = tonumber(ARGV[3])
for i = 4, 3 + 3 * n, 3 do redis.call('HSETNX', ARGV[i], ARGV[i + 1], ARGV[i + 2]) end
for i = 4 + 3 * n, #ARGV do unmark(ARGV[1] .. ARGV[i], ARGV[i], true) end
untell(ARGV[2])
return 1
"""
).encode()
"""``RoundLog.adopt``: ARGV = subscription key prefix, the untold set, the count of fields, the
fields (outage record key, field, value), then the ids whose untold marks are cleared."""

WALK_SCRIPT = b"""
local prefix, pat = ARGV[1], '\\n' .. ARGV[2] .. '\\n'
local round, after = tonumber(ARGV[3]), tonumber(ARGV[4])
local room, hops, oldest = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local out = {0, 0}
while true do
  if round == 0 then out[2] = 0; break end
  if hops == 0 then out[2] = 1; break end
  hops = hops - 1
  local b = redis.call('GET', prefix .. round)
  if not b then out[2] = 2; break end
  local _, _, t, nsubs, ndel, nmsg, dirlen = struct.unpack('<c4I8dI4I4I4I4', b)
  if t < oldest then out[2] = 3; break end
  local dir0 = 45
  local dirend = dir0 + dirlen
  local p = string.find(b, pat, dir0, true)
  if (not p) or p + #pat > dirend then out[2] = 5; break end
  local rel = p - dir0
  local lo, hi = 0, nsubs - 1
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if struct.unpack('<I4', b, dirend + 4 * mid) <= rel then lo = mid else hi = mid - 1 end
  end
  local srec = dirend + 4 * nsubs
  local prev, first, count, start = struct.unpack('<I8I8I4I4', b, srec + 24 * lo)
  local kbase = srec + 24 * nsubs
  local mbase = kbase + ndel
  local obase = mbase + 4 * ndel
  local msg0 = obase + 4 * (nmsg + 1)
  local parts = {struct.pack('<dI8I4', t, first, count), string.sub(b, kbase + start, kbase + start + count - 1)}
  for j = 0, count - 1 do
    local m = struct.unpack('<I4', b, mbase + 4 * (start + j))
    local a, z = struct.unpack('<I4I4', b, obase + 4 * m)
    parts[#parts + 1] = struct.pack('<I4', z - a) .. string.sub(b, msg0 + a, msg0 + z - 1)
  end
  out[#out + 1] = table.concat(parts)
  room = room - count
  if first <= after + 1 then round = 0; out[2] = 0; break end
  round = prev
  if room <= 0 then out[2] = 4; break end
end
out[1] = round
return out
"""
"""ARGV: blob prefix, subscription id, newest round, after, deliveries wanted at most, records
at most, oldest time kept. Returns {next round, why it stopped, records newest first}: why is 0
(reached ``after`` or the chain's start), 1 (record limit: call again from next round), 2 (next
round is gone: trimmed or expired), 3 (too old), 4 (enough deliveries), 5 (the subscription is
not in next round: cannot happen short of a corrupt log). A record: ``<dQI`` time, first
sequence, count; the kinds; per delivery ``<I`` length and the message (``<H`` id length, id,
payload)."""
REACHED, MORE, GONE, OLD, FULL, CORRUPT = range(6)


@dataclass(slots=True)
class Entry:
    """One delivery read from the log."""

    sequence: int
    kind: Sign
    msg_id: str
    payload: bytes
    time: float


@dataclass(slots=True)
class Recovered:
    """What the log held at start: each subscription's newest (round, sequence), the leases,
    the rounds kept (for the size budget) and the client-given message ids published."""

    heads: dict[str, tuple[int, int]] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    live: list[tuple[bytes, float]] = field(default_factory=list)
    """Stored messages not yet expired when the log was last written: (payload, expiry)."""
    positions: dict[str, tuple[float, float]] = field(default_factory=dict)
    rounds: list[tuple[int, float, int, list[str]]] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)
    cuts: dict[str, int] = field(default_factory=dict)
    """Each id's last unsubscribe in the log: the sequence it ended at (``Slots.floor``)."""
    last_round: int = 0
    owed: dict[str, frozenset[int]] = field(default_factory=dict)
    """Stored messages past their expiry -> the shards that had not expired them."""
    outages: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    """Shard -> its outage record (``coordinator.outages``), for the shards that had one."""


def encode_round(
    n: int,
    t: float,
    dir_: bytes,
    doff: np.ndarray,
    recs: np.ndarray,
    kinds: np.ndarray,
    midx: np.ndarray,
    msgs: Sequence[bytes],
    pub_ids: Sequence[str] = (),
    pub_matched: Sequence[int] = (),
    cuts: Sequence[tuple[str, int]] = (),
) -> bytes:
    """Round ``n``'s blob. ``dir_`` / ``doff``: the subscriptions' ids and their offsets
    (``directory_of``, or ``coordinator.slots.directory``); subscription i has record
    ``recs[i]`` (``SREC``) and the deliveries ``recs[i].start`` .. ``+ count`` of ``kinds`` /
    ``midx``; ``msgs[k]`` is message k's ``<H`` id length, id and payload (``message_record``);
    ``cuts``: (id, last sequence) of each subscription the round unsubscribed.

    >>> recs = np.zeros(1, SREC); recs["first"] = 4; recs["count"] = 1
    >>> b = encode_round(7, 1.5, *directory_of([b"s"]), recs, np.zeros(1, np.uint8),
    ...                  np.zeros(1, np.uint32), [message_record("m", b"")])
    >>> decode_round(b).heads
    {'s': (7, 4)}
    >>> b = encode_round(8, 2.0, *directory_of([]), np.zeros(0, SREC), np.zeros(0, np.uint8),
    ...                  np.zeros(0, np.uint32), [], ["p"], [0], cuts=[("s", 4), ("t", 9)])
    >>> d = decode_round(b); d.cuts, d.published
    ({'s': 4, 't': 9}, {'p': 0})
    """
    moff = np.zeros(len(msgs) + 1, "<u4")
    np.cumsum(np.fromiter(map(len, msgs), np.uint32, count=len(msgs)), out=moff[1:])
    pub = "\n".join(pub_ids).encode()
    cut = (
        struct.pack(f"<I{len(cuts)}Q", len(cuts), *(q for _, q in cuts))
        + "\n".join(sid for sid, _ in cuts).encode()
        if cuts
        else b""
    )
    return b"".join(
        (
            HEAD.pack(
                MAGIC, n, t, len(doff), len(kinds), len(msgs), len(dir_), len(pub_ids), len(pub)
            ),
            dir_,
            doff.astype("<u4", copy=False).tobytes(),
            recs.astype(SREC, copy=False).tobytes(),
            kinds.astype(np.uint8, copy=False).tobytes(),
            midx.astype("<u4", copy=False).tobytes(),
            moff.tobytes(),
            *msgs,
            cut,
            pub,
            np.asarray(pub_matched, "<u4").tobytes(),
        )
    )


def directory_of(ids: Sequence[bytes]) -> tuple[bytes, np.ndarray]:
    """A blob's DIR and offsets for these encoded ids (the slow, plain way)."""
    lens = np.fromiter(map(len, ids), np.uint32, count=len(ids)) + 1
    doff = np.zeros(len(ids), "<u4")
    np.cumsum(lens[:-1], out=doff[1:])
    return b"\n" + b"\n".join(ids) + b"\n", doff


_ID_LEN = struct.Struct("<H")


def message_record(msg_id: str, payload: bytes) -> bytes:
    """A message as a blob's MSGS holds it."""
    b = msg_id.encode()
    return _ID_LEN.pack(len(b)) + b + payload


@dataclass(slots=True)
class Decoded:
    n: int
    time: float
    heads: dict[str, tuple[int, int]]
    """Each subscription's (round, last sequence) in this round."""
    published: dict[str, int]
    cuts: dict[str, int]
    """The subscriptions this round unsubscribed: the last sequence each had."""


def decode_round(blob: bytes) -> Decoded:
    """The parts of a blob that recovery needs (``RoundLog.recover``)."""
    magic, n, t, nsubs, ndel, nmsg, dirlen, npub, publen = HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise ValueError(f"not a round blob (magic {magic!r})")
    at = HEAD.size
    ids = blob[at + 1 : at + dirlen - 1].decode().split("\n") if nsubs else []
    at += dirlen + 4 * nsubs
    recs = np.frombuffer(blob, SREC, nsubs, at)
    last = (recs["first"] + recs["count"] - 1).tolist()
    heads = {sid: (n, q) for sid, q in zip(ids, last, strict=True)}
    moff = at + 24 * nsubs + 5 * ndel
    cut0 = moff + 4 * (nmsg + 1) + struct.unpack_from("<I", blob, moff + 4 * nmsg)[0]
    cut1 = len(blob) - publen - 4 * npub
    cuts: dict[str, int] = {}
    if cut1 > cut0:  # (blobs written before CUT existed have none)
        (k,) = struct.unpack_from("<I", blob, cut0)
        qs = struct.unpack_from(f"<{k}Q", blob, cut0 + 4)
        cuts = dict(zip(blob[cut0 + 4 + 8 * k : cut1].decode().split("\n"), qs, strict=True))
    published: dict[str, int] = {}
    if npub:
        pub = blob[len(blob) - publen - 4 * npub : len(blob) - 4 * npub]
        matched = np.frombuffer(blob, "<u4", npub, len(blob) - 4 * npub).tolist()
        published = dict(zip(pub.decode().split("\n"), matched, strict=True))
    return Decoded(n, t, heads, published, cuts)


def parse_record(rec: bytes) -> list[Entry]:
    """The deliveries of one ``WALK_SCRIPT`` record, in sequence order."""
    t, first, count = struct.unpack_from("<dQI", rec)
    kinds = rec[20 : 20 + count]
    at = 20 + count
    out = []
    for j in range(count):
        (size,) = struct.unpack_from("<I", rec, at)
        (idlen,) = struct.unpack_from("<H", rec, at + 4)
        mid = rec[at + 6 : at + 6 + idlen].decode()
        payload = rec[at + 6 + idlen : at + 4 + size]
        at += 4 + size
        out.append(Entry(first + j, Sign(kinds[j]), mid, payload, t))
    return out


def to_message(e: Entry) -> pb.Message:
    """The Message a logged delivery carries (a REMOVE, or a message stored without payload:
    its id alone)."""
    if e.kind == REMOVE or not e.payload:
        return pb.Message(id=e.msg_id)
    return pb.Message.FromString(e.payload)


class RoundLog:
    """The Redis side of the retention log: append a round, read a subscription's records,
    recover at start, keep the log within its time and size budgets."""

    def __init__(self, md: Metadata, *, retention_s: float, max_bytes: int) -> None:
        self.md = md
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self.prefix = md.key("round", "").encode()
        self.hi_key = md.key("round_hi").encode()
        self.lease_key = md.key("lease").encode()
        self.live_key = md.key("live").encode()
        self.pos_key = md.pos_key.encode()
        self.owed_key = md.key("owed").encode()
        self.outage_prefix = md.key("outage", "").encode()
        self.sub_prefix = md.key("sub", "").encode()
        self.untold_key = md.untold_key.encode()
        self.last_round = 0
        """The last round number given out (``next_round``)."""
        self.kept: collections.deque[tuple[int, float, int, list[str]]] = collections.deque()
        """Rounds in the log, oldest first: (round, time, bytes, client ids published)."""
        self.bytes = 0

    def next_round(self) -> int:
        self.last_round += 1
        return self.last_round

    async def append(
        self,
        n: int,
        t: float,
        blob: bytes,
        pub_ids: list[str],
        leases: Sequence[tuple[bytes, int]],
        stored: Sequence[tuple[bytes, bytes]] = (),
        expired: Sequence[bytes] = (),
        moved: Sequence[tuple[bytes, bytes]] = (),
        outages: tuple[
            Sequence[int], Sequence[tuple[int, bytes]], Sequence[tuple[int, bytes, bytes]]
        ] = ((), (), ()),
        told: Sequence[str] = (),
        owed: Sequence[tuple[bytes, bytes]] = (),
    ) -> list[str]:
        """Write round ``n``: its blob, ``leases`` (id, highest sequence of an ephemeral
        subscription), the messages it stored (id, ``<d`` expiry + payload) and expired (id),
        the positions it moved subscriptions to (id, ``<dd`` lon, lat), the changes of the
        shards' outage records (shards whose record is deleted, (shard, field) deleted,
        (shard, field, value) added), the subscriptions whose change it tells (one each,
        ``Metadata.unmark``), the messages whose owed shards changed (id, shards); the oldest
        rounds past the budgets are deleted in the same call. Returns the client ids of the rounds dropped (their duplicates are no
        longer detected)."""
        self.kept.append((n, t, len(blob), pub_ids))
        self.bytes += len(blob)
        drop: list[tuple[int, float, int, list[str]]] = []
        oldest = t - self.retention_s
        while len(self.kept) > 1 and (self.bytes > self.max_bytes or self.kept[0][1] < oldest):
            old = self.kept.popleft()
            self.bytes -= old[2]
            drop.append(old)
        ttl = b"%d" % max(1, int(self.retention_s * (1 + EXPIRE_SLACK)))
        args = [
            b"%d" % n,
            self.prefix,
            blob,
            ttl,
            self.hi_key,
            self.lease_key,
            self.live_key,
            self.pos_key,
            self.owed_key,
            b"%d" % len(leases),
        ]
        for k, q in leases:
            args += (k, b"%d" % q)
        args.append(b"%d" % len(stored))
        for k, v in stored:
            args += (k, v)
        args.append(b"%d" % len(expired))
        args += expired
        args.append(b"%d" % len(moved))
        for k, v in moved:
            args += (k, v)
        args.append(b"%d" % len(owed))
        for k, v in owed:
            args += (k, v)
        reset, settled, noted = outages
        key = self.outage_key
        args.append(b"%d" % len(reset))
        args += [key(k) for k in reset]
        args.append(b"%d" % len(settled))
        for k, f in settled:
            args += (key(k), f)
        args.append(b"%d" % len(noted))
        for k, f, v in noted:
            args += (key(k), f, v)
        args += (b"%d" % len(told), self.sub_prefix, self.untold_key)
        args += [t.encode() for t in told]
        args += [b"%d" % d[0] for d in drop]
        try:
            await self.md.eval_packed(APPEND_SCRIPT, args)
        except BaseException:
            # not written: the caller retries this round; the dropped ones are dropped again
            self.kept.pop()
            self.bytes -= len(blob)
            for old in reversed(drop):
                self.kept.appendleft(old)
                self.bytes += old[2]
            raise
        return [i for d in drop for i in d[3]]

    def outage_key(self, k: int) -> bytes:
        """Shard ``k``'s outage record."""
        return self.outage_prefix + b"%d" % k

    async def adopt(self, records: dict[int, dict[bytes, bytes]], ids: Sequence[str]) -> None:
        """At start, in one call: add ``records``' fields to the shards' outage records (a
        field there already is kept: it is older) and clear the untold marks of ``ids``, which
        those fields now stand for (``coordinator.outages.untold_records``)."""
        fields = [(self.outage_key(k), f, v) for k, rec in records.items() for f, v in rec.items()]
        args = [self.sub_prefix, self.untold_key, b"%d" % len(fields)]
        for x in fields:
            args += x
        args += [i.encode() for i in ids]
        await self.md.eval_packed(ADOPT_SCRIPT, args)

    async def write_leases(self, leases: Sequence[tuple[bytes, int]]) -> None:
        """Set ephemeral subscriptions' leases (at a clean stop: to their exact sequences)."""
        await self.md.hset_pairs(self.lease_key, leases)

    async def positions(self) -> dict[str, tuple[float, float]]:
        """Where each moving subscription's last move (or registration) put its centre."""
        return {
            k.decode(): struct.unpack("<dd", v)
            for k, v in (await self.md.hgetall(self.pos_key)).items()
        }

    async def read(
        self, sub_id: str, head: int, after: int, *, keep: int, now: float
    ) -> list[Entry]:
        """The logged deliveries of ``sub_id`` with sequence > ``after``, oldest first, from
        its chain ending in round ``head``: at most the newest ``keep``, none older than
        ``retention_s``. What is missing before them the caller reports as a gap."""
        records: list[bytes] = []
        got = 0
        round_ = head
        oldest = repr(now - self.retention_s).encode()
        sid = sub_id.encode()
        while True:
            nxt, why, *recs = await self.md.eval_packed(
                WALK_SCRIPT,
                [
                    self.prefix,
                    sid,
                    b"%d" % round_,
                    b"%d" % after,
                    b"%d" % (keep - got),
                    b"%d" % WALK_HOPS,
                    oldest,
                ],
            )
            records += recs
            got += sum(struct.unpack_from("<dQI", r)[2] for r in recs)
            if why != MORE:
                break
            round_ = int(nxt)
        out = [e for r in reversed(records) for e in parse_record(r) if e.sequence > after]
        return out[-keep:] if len(out) > keep else out

    async def recover(self, shards: int = 0) -> Recovered:
        """Read the log back at start: from the last round written down to the first one gone
        (blobs expire and are trimmed oldest first), and the outage records of ``shards``."""
        got = Recovered()
        raw = await self.md.get(self.hi_key)
        hi = int(raw) if raw else 0
        got.last_round = hi
        n = hi
        while n > 0:
            ns = list(range(n, max(0, n - SCAN_BATCH), -1))
            blobs = await self.md.get_many([self.prefix + b"%d" % k for k in ns])
            stop = False
            for blob in blobs:
                if blob is None:
                    stop = True
                    break
                d = decode_round(blob)
                for sid, head in d.heads.items():
                    got.heads.setdefault(sid, head)
                for sid, q in d.cuts.items():
                    got.cuts.setdefault(sid, q)
                for mid, matched in d.published.items():
                    got.published.setdefault(mid, matched)
                got.rounds.append((d.n, d.time, len(blob), list(d.published)))
            if stop:
                break
            n -= len(ns)
        got.rounds.reverse()
        got.leases = {
            k.decode(): int(v) for k, v in (await self.md.hgetall(self.lease_key)).items()
        }
        got.live = [
            (v[8:], struct.unpack_from("<d", v)[0])
            for v in (await self.md.hgetall(self.live_key)).values()
        ]
        got.positions = await self.positions()
        got.owed = {
            k.decode(): frozenset(int(x) for x in v.split(b","))
            for k, v in (await self.md.hgetall(self.owed_key)).items()
        }
        for k in range(shards):
            fields = await self.md.hgetall(self.outage_key(k))
            if fields:
                got.outages[k] = fields
        self.last_round = hi
        self.kept = collections.deque(got.rounds)
        self.bytes = sum(r[2] for r in got.rounds)
        return got
