"""A deterministic top-k workload modelled on paper 001's Sect. 6.1 (BE-Gen expressions, Twitter
locations in the USA, the weights of Whang et al.): ``subs.jsonl`` and ``events.jsonl`` in the
JSON Lines form of ``shard.topk.model``.

* ``n_attrs`` attributes (the paper's d, default 400), each of cardinality ``cardinality``
  (c, default 100); a share ``string_share`` of them take strings ``v0 .. v{c-1}``, the rest
  integers ``0 .. c-1``.
* A subscription has about ``sub_len`` predicates (L_s, default 4: uniform in L_s ± 1), an event
  about ``event_len`` attributes (L_e, default 10: uniform in L_e ± 2), on distinct attributes
  chosen by ``dist``: ``zipf`` (exponent ``zipf_s`` over a random attribute order) or
  ``uniform``; values follow the same law over the cardinality.
* Operators: numeric attributes ``between`` (width up to c/10), ``=``, ``<``, ``<=``, ``>``,
  ``>=``, ``!=``, ``in``, ``not in``; string attributes ``=``, ``in``, ``!=``, ``not in``
  (``_NUMERIC_OPS`` / ``_STRING_OPS`` give the shares).
* Weights (Sect. 6.1, after [18]): ξ_attr = 1 / (subscriptions constraining attr),
  ω = max(ξ, x) with x ~ N(0.8ξ, 0.05ξ); the parser then normalises them to sum to 1.
* α (Table 4, f_α): ``uniform`` U(0, 1) (the paper's default) or ``normal:M`` N(M, 0.05),
  clipped to [0, 1].
* Locations: the paper draws real Twitter points in the USA; we draw ``clusters`` Zipf-popular
  Gaussian clusters (σ 0.5°) in the USA's bounding box, for subscriptions and events alike.

Where the paper is ambiguous
----------------------------
* BE-Gen's operator mix is not given in the paper: ours is ``_NUMERIC_OPS`` / ``_STRING_OPS``.
* As written, max(ξ, x) with x ~ N(0.8ξ, 0.05ξ) is ξ except with probability ~3e-5 (x > ξ is
  a 4σ event); we implement it as written. "Frequency" is taken as the count of subscriptions
  with a predicate on the attribute.
* The paper's "distribution of choosing predicates' attributes" (Uniform / Zipf) is applied to
  the values too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from shard.errors import ValidationError
from shard.topk.model import MAX_EVENT_ATTRS, MAX_PREDICATES

USA_BOX = (-124.7, 25.1, -67.0, 49.4)
"""lon/lat box of the contiguous USA (the paper's Twitter points are in the USA)."""

CLUSTER_SIGMA_DEG = 0.5
"""Spread of one location cluster, degrees."""

_NUMERIC_OPS = {
    "between": 0.35,
    "=": 0.15,
    "<": 0.05,
    "<=": 0.1,
    ">": 0.05,
    ">=": 0.1,
    "!=": 0.05,
    "in": 0.1,
    "not in": 0.05,
}
_STRING_OPS = {"=": 0.5, "in": 0.3, "!=": 0.1, "not in": 0.1}


def _law(n: int, dist: str, zipf_s: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities over ``n`` items: Zipf over a random order, or uniform."""
    if dist == "uniform":
        return np.full(n, 1.0 / n)
    p = 1.0 / np.arange(1, n + 1) ** zipf_s
    p = p[rng.permutation(n)]
    return p / p.sum()


def _distinct(rng: np.random.Generator, p: np.ndarray, n: int) -> list[int]:
    """``n`` distinct items drawn by ``p`` (without replacement)."""
    n = min(n, len(p))
    out: list[int] = []
    seen: set[int] = set()
    while len(out) < n:
        for a in rng.choice(len(p), size=2 * n, p=p).tolist():
            if a not in seen:
                seen.add(a)
                out.append(a)
                if len(out) == n:
                    break
    return out


def _points(rng: np.random.Generator, n: int, centres: np.ndarray, popularity: np.ndarray):
    which = rng.choice(len(centres), size=n, p=popularity)
    pts = centres[which] + rng.normal(0.0, CLUSTER_SIGMA_DEG, size=(n, 2))
    pts[:, 0] = np.clip(pts[:, 0], USA_BOX[0], USA_BOX[2])
    pts[:, 1] = np.clip(pts[:, 1], USA_BOX[1], USA_BOX[3])
    return np.round(pts, 5)


def _alphas(rng: np.random.Generator, n: int, alpha: str) -> np.ndarray:
    if alpha == "uniform":
        a = rng.uniform(0.0, 1.0, n)
    elif alpha.startswith("normal:"):
        a = rng.normal(float(alpha.split(":", 1)[1]), 0.05, n)
    else:
        raise ValidationError("alpha", alpha, "must be 'uniform' or 'normal:MEAN'")
    return np.round(np.clip(a, 0.0, 1.0), 4)


def generate_topk(
    n_subs: int,
    n_events: int,
    out_dir: str | Path,
    seed: int = 1,
    *,
    n_attrs: int = 400,
    cardinality: int = 100,
    sub_len: int = 4,
    event_len: int = 10,
    dist: str = "zipf",
    zipf_s: float = 1.0,
    alpha: str = "uniform",
    string_share: float = 0.25,
    clusters: int = 50,
) -> dict:
    """Write ``subs.jsonl`` and ``events.jsonl`` into ``out_dir``; returns their paths and the
    settings. Deterministic in ``seed``. O(n_subs x sub_len + n_events x event_len).

    >>> import tempfile
    >>> out = generate_topk(20, 5, tempfile.mkdtemp(), seed=3, n_attrs=10, cardinality=5)
    >>> [Path(out[f]).read_text().count("\\n") for f in ("subs", "events")]
    [20, 5]
    """
    if dist not in ("zipf", "uniform"):
        raise ValidationError("dist", dist, "must be 'zipf' or 'uniform'")
    for name, v, lo in (
        ("n_subs", n_subs, 0),
        ("n_events", n_events, 0),
        ("n_attrs", n_attrs, 1),
        ("cardinality", cardinality, 1),
        ("sub_len", sub_len, 1),
        ("event_len", event_len, 1),
        ("clusters", clusters, 1),
    ):
        if not isinstance(v, int) or v < lo:
            raise ValidationError(name, v, f"must be an integer >= {lo}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    attr_p = _law(n_attrs, dist, zipf_s, rng)
    value_p = _law(cardinality, dist, zipf_s, rng)
    is_str = rng.random(n_attrs) < string_share
    x0, y0, x1, y1 = USA_BOX
    centres = np.column_stack([rng.uniform(x0, x1, clusters), rng.uniform(y0, y1, clusters)])
    popularity = _law(clusters, "zipf", 1.0, rng)

    def value(a: int, v: int):
        return f"v{v}" if is_str[a] else v

    # subscriptions: attributes first (the weights need the attributes' frequencies)
    lengths = np.clip(
        rng.integers(sub_len - 1, sub_len + 2, n_subs), 1, min(n_attrs, MAX_PREDICATES)
    )
    sub_attrs = [_distinct(rng, attr_p, int(n)) for n in lengths]
    freq = np.bincount(np.concatenate(sub_attrs) if sub_attrs else [], minlength=n_attrs)
    xi = 1.0 / np.maximum(freq, 1)
    num_ops, num_cum = list(_NUMERIC_OPS), np.cumsum(list(_NUMERIC_OPS.values()))
    str_ops, str_cum = list(_STRING_OPS), np.cumsum(list(_STRING_OPS.values()))
    points = _points(rng, n_subs, centres, popularity)
    alphas = _alphas(rng, n_subs, alpha)
    total = int(lengths.sum())
    op_u = rng.random(total)
    values = rng.choice(cardinality, size=total, p=value_p)
    widths = rng.integers(0, cardinality // 10 + 1, size=total)
    noise = rng.normal(0.8, 0.05, size=total)
    j = 0
    with open(out / "subs.jsonl", "w", encoding="utf-8") as fh:
        for i, attrs in enumerate(sub_attrs):
            preds = []
            for a in attrs:
                ops, cum = (str_ops, str_cum) if is_str[a] else (num_ops, num_cum)
                op = ops[
                    min(int(np.searchsorted(cum, op_u[j] * cum[-1], side="right")), len(ops) - 1)
                ]
                v = int(values[j])
                if op == "between":
                    val: object = [v, min(v + int(widths[j]), cardinality - 1)]
                elif op in ("in", "not in"):
                    vs = _distinct(rng, value_p, int(rng.integers(2, 6)))
                    val = [value(a, x) for x in vs]
                else:
                    val = value(a, v)
                w = float(
                    max(xi[a], noise[j] * xi[a])
                )  # Sect. 6.1: ω = max(ξ, x), x ~ N(.8ξ, .05ξ)
                preds.append({"attr": f"a{a}", "op": op, "value": val, "weight": w})
                j += 1
            d = {
                "id": f"s{i}",
                "predicates": preds,
                "alpha": float(alphas[i]),
                "point": [float(points[i, 0]), float(points[i, 1])],
            }
            fh.write(json.dumps(d, separators=(",", ":")) + "\n")
    ev_points = _points(rng, n_events, centres, popularity)
    with open(out / "events.jsonl", "w", encoding="utf-8") as fh:
        for i in range(n_events):
            n = int(
                np.clip(
                    rng.integers(event_len - 2, event_len + 3), 1, min(n_attrs, MAX_EVENT_ATTRS)
                )
            )
            attrs = {
                f"a{a}": value(a, int(rng.choice(cardinality, p=value_p)))
                for a in _distinct(rng, attr_p, n)
            }
            d = {
                "id": f"e{i}",
                "attributes": attrs,
                "point": [float(ev_points[i, 0]), float(ev_points[i, 1])],
            }
            fh.write(json.dumps(d, separators=(",", ":")) + "\n")
    return {
        "subs": str(out / "subs.jsonl"),
        "events": str(out / "events.jsonl"),
        "n_subs": n_subs,
        "n_events": n_events,
        "n_attrs": n_attrs,
        "cardinality": cardinality,
        "dist": dist,
        "alpha": alpha,
        "seed": seed,
    }


HELP = "write a top-k workload (paper 001's BE-Gen settings): subs.jsonl, events.jsonl"


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the directory to write into")
    p.add_argument("--subs", type=int, default=100_000)
    p.add_argument("--events", type=int, default=1_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--attrs", type=int, default=400, help="attributes in the workload")
    p.add_argument("--cardinality", type=int, default=100, help="values per attribute")
    p.add_argument("--sub-len", type=int, default=4, help="predicates per subscription")
    p.add_argument("--event-len", type=int, default=10, help="attributes per event")
    p.add_argument("--dist", choices=("zipf", "uniform"), default="zipf")
    p.add_argument("--alpha", default="uniform", help="uniform or normal:MEAN")


def register(sub) -> None:
    """Add ``gen-topk`` to the ``geopubsub`` commands."""
    p = sub.add_parser("gen-topk", help=HELP)
    _arguments(p)
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    info = generate_topk(
        a.subs,
        a.events,
        a.out,
        a.seed,
        n_attrs=a.attrs,
        cardinality=a.cardinality,
        sub_len=a.sub_len,
        event_len=a.event_len,
        dist=a.dist,
        alpha=a.alpha,
    )
    print(json.dumps(info))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m geopubsub.tools.gen_topk --out DIR --subs N --events N`` (``geopubsub
    gen-topk``)."""
    p = argparse.ArgumentParser(description=HELP)
    _arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
