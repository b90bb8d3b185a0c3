"""The Redis scripts of ``coordinator.metadata`` against a model of what they document.

``put_subscriptions`` (with and without untold marks, ephemeral flags, ids repeated in a batch),
``unmark`` (forced or not) and ``delete_subscriptions`` are applied in random order to a real
redis-server, and every key they touch is compared with a dictionary model after each call.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import redis

from coordinator.metadata import Metadata
from shard import metadata_codec as codec
from shard.model import Rect, Subscription

IDS = [f"s{i}" for i in range(7)]


class Model:
    """The documented effect of each script (``PUT_SCRIPT``, ``UNMARK_LUA``, ``DELETE_SCRIPT``)."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[bytes, bytes]] = {}
        self.subs: set[str] = set()
        self.untold: set[str] = set()
        self.ephemeral: set[str] = set()

    def put(self, items, stamp: bytes, flags, mark: bool) -> None:
        for (sub, shards), e in zip(items, flags, strict=True):
            h = self.hashes.setdefault(sub.id, {})
            if mark:
                if b"told" not in h:
                    h[b"told"] = h.get(b"sub", b"")
                h[b"pending"] = b"%d" % (int(h.get(b"pending", b"0")) + 1)
                self.untold.add(sub.id)
            h.setdefault(b"created", stamp)
            h[b"sub"] = codec.encode_subscription(sub).encode()
            h[b"shards"] = codec.encode_shards(shards).encode()
            h[b"updated"] = stamp
            self.subs.add(sub.id)
            if e is True:
                self.ephemeral.add(sub.id)
            elif e is False:
                self.ephemeral.discard(sub.id)

    def unmark(self, ids, force: bool) -> None:
        for i in ids:
            h = self.hashes.get(i)
            if h is None:
                self.untold.discard(i)
                continue
            if not force:
                h[b"pending"] = b"%d" % (int(h.get(b"pending", b"0")) - 1)
            if force or int(h[b"pending"]) <= 0:
                h.pop(b"told", None)
                h.pop(b"pending", None)
                self.untold.discard(i)

    def delete(self, ids) -> None:
        for i in ids:
            self.hashes.pop(i, None)
            self.subs.discard(i)
            self.ephemeral.discard(i)


def _sub(rng: random.Random, sub_id: str) -> Subscription:
    x = rng.uniform(-100, 100)
    return Subscription(sub_id, ((f"t{rng.randrange(5)}",),), Rect(x, 0.0, x + 1.0, 1.0))


def test_the_subscription_scripts_do_what_they_document(redis_url):
    ns = uuid.uuid4().hex
    raw = redis.Redis.from_url(redis_url)
    rng = random.Random(7)
    model = Model()

    def check(step: int, what: str) -> None:
        for i in IDS:
            got = raw.hgetall(codec.sub_key(ns, i))
            assert got == model.hashes.get(i, {}), (step, what, i)
        sets = (codec.subs_key(ns), f"{ns}:untold", codec.ephemeral_key(ns))
        want = (model.subs, model.untold, model.ephemeral)
        for key, ids in zip(sets, want, strict=True):
            assert {m.decode() for m in raw.smembers(key)} == ids, (step, what, key)

    async def main() -> None:
        md = Metadata(redis_url, ns)
        kinds = {"put": 0, "unmark": 0, "delete": 0}
        for step in range(400):
            kind = rng.choice(["put", "put", "unmark", "delete"])
            ids = [rng.choice(IDS) for _ in range(rng.randint(1, 6))]  # repeats on purpose
            if kind == "put":
                items = [(_sub(rng, i), tuple(sorted(rng.sample(range(3), 2)))) for i in ids]
                flags = [rng.choice([None, True, False]) for _ in ids]
                mark = rng.random() < 0.7
                now = 1000.0 + step
                given = None if all(f is None for f in flags) else flags
                await md.put_subscriptions(items, now, ephemeral=given, mark=mark)
                model.put(items, codec.encode_stamp(now).encode(), flags, mark)
            elif kind == "unmark":
                force = rng.random() < 0.2
                await md.unmark(ids, force=force)
                model.unmark(ids, force)
            else:
                await md.delete_subscriptions(ids)
                model.delete(ids)
            kinds[kind] += 1
            check(step, kind)
        assert min(kinds.values()) > 50
        assert model.untold and model.ephemeral  # the random walk reached both marks
        await md.close()

    asyncio.run(main())


def test_a_thousand_subscriptions_are_written_and_deleted_in_one_script_call_each(redis_url):
    """The sets are changed 1,000 members a command: a full batch (and more) round-trips."""
    ns = uuid.uuid4().hex
    raw = redis.Redis.from_url(redis_url)
    subs = [Subscription(f"b{i}", (("x",),), Rect(0, 0, 1, 1)) for i in range(2500)]

    async def main() -> None:
        md = Metadata(redis_url, ns)
        await md.put_subscriptions([(s, (0,)) for s in subs], ephemeral=[True] * 2500, mark=True)
        assert raw.scard(codec.subs_key(ns)) == 2500
        assert raw.scard(f"{ns}:untold") == 2500
        assert raw.scard(codec.ephemeral_key(ns)) == 2500
        await md.unmark([s.id for s in subs])
        assert raw.scard(f"{ns}:untold") == 0
        assert raw.hkeys(codec.sub_key(ns, "b2499")) == [b"created", b"sub", b"shards", b"updated"]
        await md.delete_subscriptions([s.id for s in subs])
        assert raw.scard(codec.subs_key(ns)) == 0 and raw.scard(codec.ephemeral_key(ns)) == 0
        assert raw.exists(*(codec.sub_key(ns, s.id) for s in subs)) == 0
        await md.close()

    asyncio.run(main())
