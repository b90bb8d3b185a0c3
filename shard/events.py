"""Event streams (JSON Lines) for the AP+-Tree: what happens to subscriptions and messages, in time.

```
{"t": 0.0,  "op": "subscribe",   "sub": {...subscription...}}
{"t": 1.5,  "op": "unsubscribe", "id": "s1"}
{"t": 2.0,  "op": "publish",     "msg": {...message..., "ttl": 300}}
{"t": 30.0, "op": "move",        "id": "s1", "point": [lon, lat]}
```

Times are seconds and never decrease; before the events of time t are applied the index advances
to t. A bad line is reported as ``file:line: reason`` (skipped and counted, or fatal with strict).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shard.errors import ValidationError
from shard.model import (
    Message,
    Point,
    Subscription,
    message_from_dict,
    message_to_dict,
    subscription_from_dict,
    subscription_to_dict,
    validate_id,
    validate_point,
)
from shard.workload import iter_jsonl

OPS = ("subscribe", "unsubscribe", "publish", "move")


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    op: str
    sub: Subscription | None = None
    msg: Message | None = None
    id: str | None = None
    point: Point | None = None


def event_from_dict(d: Mapping[str, Any]) -> Event:
    """Validate one event object; errors name the field (``t``, ``op``, ``sub.rect[2]``, ...)."""
    t = d.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ValidationError("t", t, "must be a finite number of seconds >= 0")
    op = d.get("op")
    if op not in OPS:
        raise ValidationError("op", op, f"must be one of {', '.join(OPS)}")
    allowed = {"t", "op", {"subscribe": "sub", "publish": "msg"}.get(op, "id")}
    if op == "move":
        allowed.add("point")
    extra = sorted(set(d) - allowed)
    if extra:
        raise ValidationError(extra[0], d[extra[0]], f"unknown field for op {op!r}")
    t = float(t)
    try:
        if op == "subscribe":
            return Event(t, op, sub=subscription_from_dict(_obj("sub", d.get("sub"))))
        if op == "publish":
            return Event(t, op, msg=message_from_dict(_obj("msg", d.get("msg"))))
    except ValidationError as exc:
        key = "sub" if op == "subscribe" else "msg"
        raise ValidationError(f"{key}.{exc.field}", exc.value, exc.reason) from exc
    ident = validate_id("id", d.get("id"))
    if op == "unsubscribe":
        return Event(t, op, id=ident)
    p = d.get("point")
    if not isinstance(p, list) or len(p) != 2:
        raise ValidationError("point", p, "must be [lon, lat]")
    return Event(t, op, id=ident, point=validate_point("point", p[0], p[1]))


def _obj(field: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(field, value, "must be a JSON object")
    return value


def read_events(
    path: str | Path, *, strict: bool = False, errors: list[str] | None = None
) -> Iterator[Event]:
    """Stream validated events; a time earlier than the previous event's is a bad line."""
    last = [0.0]

    def parse(d: Any) -> Event:
        ev = event_from_dict(d)
        if ev.t < last[0]:
            raise ValidationError("t", ev.t, f"goes back in time (previous event at {last[0]})")
        last[0] = ev.t
        return ev

    return iter_jsonl(path, parse, strict=strict, errors=errors)


def event_to_dict(ev: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"t": ev.t, "op": ev.op}
    if ev.sub is not None:
        out["sub"] = subscription_to_dict(ev.sub)
    if ev.msg is not None:
        out["msg"] = message_to_dict(ev.msg)
    if ev.id is not None:
        out["id"] = ev.id
    if ev.point is not None:
        out["point"] = [ev.point.lon, ev.point.lat]
    return out
