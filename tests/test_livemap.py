"""The operator's view and the live map: ``GetDensity`` counts every subscription once, at its
centre, over shards that share subscriptions; ``Watch`` streams the traffic of a real cluster
(Ray shard actors, redis-server, gRPC over loopback) as it happens; and the page of
``geopubsub map``, loaded in Debian's headless Chromium, draws the subscriptions and shows a
message published while it is open within a second (a screenshot is kept)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from coordinator import overview
from coordinator.access import role_allows
from geopubsub.client import Endpoint, GeoPubSubClient
from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.tools.livemap.outlines import outlines
from geopubsub.tools.livemap.server import serve, subscription_json
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.geometry import region_bbox
from shard.model import Circle, Message, Point, Rect, Subscription, subscription_from_dict
from shard.partition_map import PartitionMap, bbox_centre
from shard.state import ShardState
from tests.clusters import Cluster, coordinator_settings, settled, subscribe_all
from tests.workloads import as_moving, random_subscription

ARTIFACTS = Path(os.environ.get("GEOPUBSUB_TEST_ARTIFACTS", ".geopubsub/test-artifacts"))
"""Where the browser test keeps its screenshot."""
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def centre(s: Subscription) -> tuple[float, float]:
    if isinstance(s.region, Circle):
        return s.region.lon, s.region.lat
    return bbox_centre(region_bbox(s.region))


def brute_density(subs, view, cols, rows, keyword="") -> list[int]:
    """The grid by definition: each subscription naming ``keyword`` in the cell of its centre."""
    x0, y0, x1, y1 = view
    out = [0] * (cols * rows)
    for s in subs:
        if keyword and not any(keyword in c for c in s.clauses):
            continue
        cx, cy = centre(s)
        if not (x0 <= cx <= x1 and y0 <= cy <= y1):
            continue
        c = min(int((cx - x0) / ((x1 - x0) / cols)), cols - 1)
        r = min(int((cy - y0) / ((y1 - y0) / rows)), rows - 1)
        out[r * cols + c] += 1
    return out


def _subscriptions(rng: random.Random, n: int) -> list[Subscription]:
    subs = [random_subscription(rng, f"s{i}") for i in range(n)]
    # wide ones too, held by several shards; and one centred on a part's edge
    subs += [
        Subscription("wide", (("a",),), Rect(-170, -80, 170, 80)),
        Subscription("circle", (("b", "c"),), Circle(10.0, 5.0, 3_000_000.0)),
    ]
    return subs


def test_density_counts_each_subscription_once_at_its_centre_across_shards():
    rng = random.Random(11)
    subs = _subscriptions(rng, 500)
    pm = PartitionMap.build([centre(s) for s in subs], 3)
    states = [
        ShardState.build(k, [s for s in subs if k in pm.overlapping(region_bbox(s.region))])
        for k in range(3)
    ]
    assert sum(len(st) for st in states) > len(subs)  # shared subscriptions: counted once below
    for view, cols, rows, kw in [
        ((-180.0, -90.0, 180.0, 90.0), 36, 18, ""),
        ((-180.0, -90.0, 180.0, 90.0), 7, 3, "a"),
        ((-20.0, -10.0, 15.0, 30.0), 50, 40, ""),
        ((-20.0, -10.0, 15.0, 30.0), 1, 1, "c"),
    ]:
        got = sum(st.density(pm.boxes[k], view, cols, rows, kw) for k, st in enumerate(states))
        assert got.tolist() == brute_density(subs, view, cols, rows, kw), (view, cols, rows, kw)
    world = sum(st.density(pm.boxes[k], (-180, -90, 180, 90), 4, 2) for k, st in enumerate(states))
    assert int(world.sum()) == len(subs)
    assert states[0].density(pm.boxes[0], (-180, -90, 180, 90), 4, 2, "nosuchterm").sum() == 0


def test_the_map_calls_are_an_admins():
    for method in ("GetDensity", "Watch"):
        path = f"/geopubsub.v1.GeoPubSub/{method}"
        assert role_allows("admin", path)
        assert not role_allows("subscriber", path)
        assert not role_allows("publisher", path)


def test_a_polygon_and_a_ranked_subscription_reach_the_page_as_drawn():
    """The page draws a chosen subscription's region: a polygon as its rings (where it is now),
    a ranked one with its threshold beside its keywords."""
    poly = subscription_from_dict(
        {"id": "p", "keywords": ["x"], "polygon": [[[0, 0], [4, 0], [0, 4], [0, 0]]]}
    )
    got = subscription_json(to_proto_subscription(poly))
    assert got["polygon"] == [[[0.0, 0.0], [4.0, 0.0], [0.0, 4.0], [0.0, 0.0]]]
    assert "rect" not in got and "circle" not in got
    ranked = subscription_from_dict(
        {"id": "r", "keywords": ["a", "b"], "rect": [0, 0, 1, 1], "threshold": 0.7}
    )
    assert subscription_json(to_proto_subscription(ranked))["condition"] == (
        "a b (ranked: threshold 0.7)"
    )


def test_the_outlines_come_from_the_package():
    o = outlines()
    land = [np.array(r).reshape(-1, 2) for r in o["land"]]
    assert len(land) > 500 and len(o["borders"]) > 300
    pts = np.concatenate(land)
    assert pts[:, 0].min() == -180 and pts[:, 0].max() == 180
    assert pts[:, 1].min() >= -90 and pts[:, 1].max() < 84


# ---- a real cluster -------------------------------------------------------------------------
async def _events_until(call, done, timeout_s: float = 15.0) -> list[pb.WatchEvents]:
    """Read a Watch stream until ``done(events so far)``."""
    got: list[pb.WatchEvents] = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        left = deadline - time.monotonic()
        assert left > 0, f"the Watch stream did not show it within {timeout_s} s: {got[-3:]}"
        got.append(await asyncio.wait_for(call.read(), left))
    return got


def _published(events) -> dict[str, int]:
    return {w.message.id: w.matched for e in events for w in e.published}


def test_density_and_watch_show_a_real_clusters_subscriptions_and_traffic(ray_session, redis_url):
    rng = random.Random(4)
    subs = _subscriptions(rng, 80)
    movers = [
        as_moving(Subscription(f"car{i}", (("taxi",),), Circle(i, i, 50_000.0))) for i in range(3)
    ]
    movers.append(as_moving(Subscription("bus", (("bus",),), Rect(0, 0, 1, 1))))
    settings = coordinator_settings(redis_url, uuid.uuid4().hex)

    async def main():
        async with Cluster(settings) as c:
            stub = c.stub
            await subscribe_all(stub, subs)
            for s in movers:
                await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(s)))
            # (the density is the shards': a Subscribe answered before its round is counted
            # once the round is done, within subscribe_defer_ms)
            await settled(c.app.engine)
            everyone = subs + movers

            # the density: every subscription once, by its centre; a keyword; a view
            d = await stub.GetDensity(pb.DensityRequest(cols=36, rows=18))
            assert list(d.counts) == brute_density(everyone, (-180, -90, 180, 90), 36, 18)
            assert d.subscriptions == len(everyone)
            d = await stub.GetDensity(pb.DensityRequest(cols=5, rows=5, keyword="TAXI"))
            assert d.subscriptions == 3
            assert list(d.counts) == brute_density(everyone, (-180, -90, 180, 90), 5, 5, "taxi")
            view = pb.Rect(min_lon=-30, min_lat=-20, max_lon=30, max_lat=20)
            d = await stub.GetDensity(pb.DensityRequest(view=view, cols=12, rows=8))
            assert list(d.counts) == brute_density(everyone, (-30, -20, 30, 20), 12, 8)
            d = await stub.GetDensity(pb.DensityRequest())
            assert (d.cols, d.rows, d.subscriptions) == (360, 180, len(everyone))
            for bad, field in [
                (pb.DensityRequest(cols=2000, rows=1), "cols=2000"),
                (pb.DensityRequest(cols=5, rows=0), "rows=0"),
                (pb.DensityRequest(cols=1024, rows=1024), "cols=1024"),
                (pb.DensityRequest(view=pb.Rect(min_lon=5, max_lon=1, max_lat=1)), "view"),
                (pb.DensityRequest(keyword="two words"), "keyword="),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.GetDensity(bad)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in err.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Watch(pb.WatchRequest(max_messages_per_s=10_001)).read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "max_messages_per_s=10001" in err.value.details()

            # three watchers: everything, a keyword, a rate of 5 a second
            every = stub.Watch(pb.WatchRequest(max_messages_per_s=1000))
            taxis = stub.Watch(pb.WatchRequest(keyword="taxi", max_messages_per_s=1000))
            slow = stub.Watch(pb.WatchRequest(max_messages_per_s=5))
            for call in (every, taxis, slow):
                first = await call.read()  # sent at once: the stream is open
                assert not first.published and first.time > 0
            with pytest.MonkeyPatch.context() as mp:  # one stream more than the limit
                mp.setattr(overview, "MAX_WATCHERS", 3)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Watch(pb.WatchRequest()).read()
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "3 Watch streams are open" in err.value.details()
            msgs = [
                Message(f"m{i}", ("a", "taxi") if i % 3 == 0 else ("a",), Point(i % 20, i % 10))
                for i in range(30)
            ]
            msgs = [dataclasses.replace(m, ttl=1.0 if i < 4 else 600.0) for i, m in enumerate(msgs)]
            resp = await stub.Publish(
                pb.PublishRequest(messages=[to_proto_message(m) for m in msgs])
            )
            matched = dict(zip(resp.ids, resp.matches, strict=True))
            for i in range(3):  # taxis move; the bus moves and is then unsubscribed
                await stub.UpdateLocation(
                    pb.UpdateLocationRequest(id=f"car{i}", point=pb.Point(lon=20 + i, lat=-5))
                )
            await stub.UpdateLocation(pb.UpdateLocationRequest(id="bus", point=pb.Point(lon=7)))
            await stub.Unsubscribe(pb.UnsubscribeRequest(id="bus"))

            got = await _events_until(
                every,
                lambda ev: (
                    {m for e in ev for m in e.expired} >= {"m0", "m1", "m2", "m3"}
                    and "bus" in {u for e in ev for u in e.unsubscribed}
                ),
            )
            assert _published(got) == matched
            sent = {w.message.id: w.message for e in got for w in e.published}
            assert sent["m5"].point.lon == 5 and sent["m5"].time > 0 and sent["m5"].ttl_s == 600
            assert sum(e.published_count for e in got) == 30
            assert sum(e.skipped_messages for e in got) == 0
            moved = [(m.id, m.point.lon, m.point.lat) for e in got for m in e.moved]
            assert moved == [("car0", 20, -5), ("car1", 21, -5), ("car2", 22, -5), ("bus", 7, 0)]
            assert sum(e.moves_count for e in got) == 4
            expired = [m for e in got for m in e.expired]
            assert sorted(expired) == ["m0", "m1", "m2", "m3"]  # the stored ones sent, once

            got = await _events_until(taxis, lambda ev: sum(e.moves_count for e in ev) >= 4)
            assert _published(got) == {m.id: matched[m.id] for m in msgs if "taxi" in m.terms}
            assert sum(e.published_count for e in got) == 10  # with the keyword
            assert [m.id for e in got for m in e.moved] == ["car0", "car1", "car2"]

            got = await _events_until(slow, lambda ev: sum(e.published_count for e in ev) >= 30)
            assert len(_published(got)) == 5
            assert sum(e.skipped_messages for e in got) == 25

            # a move shows in the density at once
            d = await stub.GetDensity(pb.DensityRequest(cols=36, rows=18, keyword="taxi"))
            car0 = dataclasses.replace(movers[0], region=Circle(20, -5, 50_000.0))
            now = [
                car0,
                *[
                    dataclasses.replace(m, region=Circle(20 + i, -5, 5e4))
                    for i, m in enumerate(movers[1:3], 1)
                ],
            ]
            assert list(d.counts) == brute_density(now, (-180, -90, 180, 90), 36, 18, "taxi")
            for call in (every, taxis, slow):
                call.cancel()
            await asyncio.sleep(0.2)
            assert not c.app.watch.watchers  # closed streams are gone from the hub

    asyncio.run(main())


# ---- the page in a browser ----------------------------------------------------------------
def _browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), (
            f"{path} is missing: `make test` installs Debian's chromium and chromium-driver"
        )
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,800"):
        opts.add_argument(flag)
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))


def _wait(driver, script: str, timeout_s: float = 20.0, step_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError(
        f"not within {timeout_s} s: {script}; page status {driver.execute_script('return window.geomap && window.geomap.status')}"
    )


def test_the_live_map_in_headless_chromium(ray_session, redis_url):
    rng = random.Random(9)
    subs = _subscriptions(rng, 300)
    mover = as_moving(Subscription("phone", (("coffee",),), Circle(13.4, 52.5, 200_000.0)))
    settings = coordinator_settings(redis_url, uuid.uuid4().hex)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def in_browser(target: str) -> dict:
        server = serve(Endpoint(target), "127.0.0.1", 0)
        driver = _browser()
        try:
            # the server answers errors as JSON naming the field
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(server.url + "api/density?cols=x", timeout=10)
            assert err.value.code == 400 and b"cols='x'" in err.value.read()
            driver.get(server.url)
            _wait(driver, "return window.geomap.status === 'live'")
            _wait(driver, "return window.geomap.outlines !== null")
            drawn = _wait(driver, "return window.geomap.densityDrawn")
            total = driver.execute_script("return window.geomap.densityTotal")
            with GeoPubSubClient(target) as client:
                client.update_location("phone", 13.0, 52.0)
                _wait(driver, "return window.geomap.movers.has('phone')")
                t0 = time.monotonic()
                client.publish(["coffee", "latte"], point=(13.1, 52.1), ttl_s=600, id="hello")
                _wait(driver, "return window.geomap.shown.has('hello')", timeout_s=5.0, step_s=0.01)
                shown_s = time.monotonic() - t0
            # choose the phone: its region, and the message among its results
            driver.execute_script("document.getElementById('sub-id').value = 'phone'")
            driver.find_element("id", "sub-go").click()
            _wait(
                driver,
                "return window.geomap.selected && window.geomap.selected.results.has('hello')",
            )
            log = driver.find_element("id", "sub-log").text
            driver.save_screenshot(str(ARTIFACTS / "livemap.png"))
            # a keyword: the density and the messages are only those naming it
            driver.find_element("id", "keyword").send_keys("Coffee")
            driver.find_element("id", "kw-go").click()
            _wait(driver, "return window.geomap.densityTotal === 1")
            _wait(driver, "return window.geomap.status === 'live'")
            with GeoPubSubClient(target) as client:
                client.publish(["tea"], point=(13.1, 52.1), id="tea1")
                client.publish(["coffee"], point=(13.1, 52.1), id="coffee1")
            _wait(driver, "return window.geomap.shown.has('coffee1')")
            filtered = not driver.execute_script("return window.geomap.shown.has('tea1')")
            return {
                "drawn": drawn,
                "total": total,
                "shown_s": shown_s,
                "log": log,
                "filtered": filtered,
            }
        finally:
            driver.quit()
            server.close()

    async def main():
        async with Cluster(settings) as c:
            await c.stub.Subscribe(
                pb.SubscribeRequest(
                    subscriptions=[to_proto_subscription(s) for s in subs + [mover]]
                )
            )
            return await asyncio.to_thread(in_browser, f"127.0.0.1:{c.port}")

    r = asyncio.run(main())
    assert r["total"] == len(subs) + 1 and r["drawn"] > 50
    assert r["shown_s"] < 1.0, r
    assert "+hello" in r["log"]
    assert r["filtered"], "a message without the keyword was drawn"
    png = (ARTIFACTS / "livemap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    print(json.dumps({k: v for k, v in r.items() if k != "log"}))
