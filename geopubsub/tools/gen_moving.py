"""``geopubsub gen --moving``: an event stream of moving subscribers and expiring messages.

Modelled on the paper's Table 3: every subscription is moving; time advances in steps (30 s); at
each step a share of subscribers (mobility, 20 %) moves towards its random waypoint at the
velocity given (km/h), picking a new waypoint from the location model when it arrives; messages
arrive at a fixed number per step and live ``lifetime`` steps. Written next to ``subs.jsonl``
(the initial subscriptions, loaded in bulk) as ``events.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shard.errors import ValidationError

KM_PER_DEG = 111.195
"""Kilometres per degree of latitude on the 6,371,008.8 m sphere."""


def write_events(
    out_dir: Path,
    *,
    seed: int,
    steps: int,
    step_s: float,
    mobility: float,
    velocity_kmh: float,
    lifetime_steps: float,
) -> dict:
    """Turn ``subs.jsonl``/``msgs.jsonl`` in ``out_dir`` into ``events.jsonl``: the messages spread
    evenly over ``steps`` steps as publishes with a ttl, and moves of the subscribers."""
    if steps < 1:
        raise ValidationError("--steps", steps, "must be >= 1")
    if not step_s > 0:
        raise ValidationError("--step-s", step_s, "must be > 0")
    if not 0 <= mobility <= 1:
        raise ValidationError("--mobility", mobility, "must be in [0, 1]")
    if not velocity_kmh >= 0:
        raise ValidationError("--velocity-kmh", velocity_kmh, "must be >= 0")
    if not lifetime_steps > 0:
        raise ValidationError("--lifetime-steps", lifetime_steps, "must be > 0")
    rng = np.random.default_rng(seed + 7919)
    ids, cx, cy = [], [], []
    with open(out_dir / "subs.jsonl", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            ids.append(d["id"])
            if "rect" in d:
                r = d["rect"]
                cx.append((r[0] + r[2]) / 2)
                cy.append((r[1] + r[3]) / 2)
            else:
                cx.append(d["circle"][0])
                cy.append(d["circle"][1])
    with open(out_dir / "msgs.jsonl", encoding="utf-8") as fh:
        msgs = fh.readlines()
    n = len(ids)
    x = np.array(cx)
    y = np.array(cy)
    # waypoints: other subscribers' positions (the skewed location model)
    wx = x[rng.integers(0, max(n, 1), n)] if n else x
    wy = y[rng.integers(0, max(n, 1), n)] if n else y
    step_deg = velocity_kmh * step_s / 3600.0 / KM_PER_DEG
    per_step = len(msgs) / steps
    ttl = lifetime_steps * step_s
    n_moves = 0
    with open(out_dir / "events.jsonl", "w", encoding="utf-8") as out:
        mi = 0
        for k in range(steps):
            t = round(k * step_s, 6)
            movers = np.flatnonzero(rng.random(n) < mobility)
            if movers.size and step_deg > 0:
                dx = wx[movers] - x[movers]
                dy = wy[movers] - y[movers]
                coslat = np.maximum(np.cos(np.radians(y[movers])), 0.05)
                dist = np.hypot(dx * coslat, dy)
                f = np.minimum(1.0, step_deg / np.maximum(dist, 1e-12))
                x[movers] = np.clip(x[movers] + dx * f, -180, 180)
                y[movers] = np.clip(y[movers] + dy * f, -90, 90)
                arrived = movers[f >= 1.0]
                pick = rng.integers(0, n, arrived.size)
                wx[arrived] = x[pick]
                wy[arrived] = y[pick]
                for i in movers.tolist():
                    out.write(
                        f'{{"t":{t},"op":"move","id":{json.dumps(ids[i])},'
                        f'"point":[{round(float(x[i]), 6)},{round(float(y[i]), 6)}]}}\n'
                    )
                n_moves += movers.size
            end = min(len(msgs), round((k + 1) * per_step))
            while mi < end:
                d = json.loads(msgs[mi])
                d["ttl"] = ttl
                out.write(json.dumps({"t": t, "op": "publish", "msg": d}, separators=(",", ":")))
                out.write("\n")
                mi += 1
    return {"events": n_moves + len(msgs), "moves": n_moves, "publishes": len(msgs)}
