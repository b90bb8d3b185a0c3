"""``geopubsub gen``: a deterministic synthetic workload modelled on the paper's Sect. 5.1.1.

Locations are skewed and clustered (Zipf-popular clusters of different spreads, plus uniform
background noise); terms follow a Zipf law over a synthetic vocabulary, with each cluster boosting
its own topical words, so keyword and spatial distributions differ between regions. Messages carry
about 9 terms. A subscription takes 1-5 terms of a freshly sampled message and a rectangle centred
at its location with area uniform in [min-area, max-area] of the data space (or an equal-area
circle, or a DNF expression of 2-5 terms as in the paper).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from geopubsub.tools.gen_moving import write_events
from geopubsub.tools.gen_places import generate_places
from geopubsub.tools.gen_shapes import (
    NO_CONDITIONS,
    ConditionShares,
    add_conditions,
    check_shapes,
    dnf_text,
    message_attributes,
)
from shard.errors import ValidationError
from shard.limits import EARTH_RADIUS_M, MAX_RADIUS_M

CHUNK = 100_000
"""Rows generated per vectorised chunk."""

TOPIC_WORDS = 1000
"""Words each cluster favours."""

TOPIC_SHARE = 0.2
"""Share of a message's terms drawn from its cluster's topical words."""

NOISE_SHARE = 0.05
"""Share of locations drawn uniformly over the space instead of from a cluster."""

DEFAULT_STOPWORDS = 100
"""Ranks at the head of the Zipf law that real keyword pipelines drop as stopwords (the, a, of,
...): the vocabulary's words follow Zipf ranks ``stopwords + 1 ...``, so the commonest generated word
occurs in about 1 % of messages, as content words do in tweets, instead of in half of them."""
"""Share of locations drawn uniformly over the space instead of from a cluster."""

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def word(rank: int) -> str:
    """A pronounceable, unique lowercase word for a vocabulary rank.

    >>> word(0), word(1), word(70)
    ('ba', 'be', 'baba')
    """
    n = len(_SYLLABLES)
    parts = []
    r = rank
    while True:
        parts.append(_SYLLABLES[r % n])
        r //= n
        if r == 0:
            break
        r -= 1
    return "".join(reversed(parts))


class WorkloadModel:
    """The random model; ``messages(n)`` / ``subscriptions(n)`` draw columns in chunks."""

    def __init__(
        self,
        *,
        seed: int,
        vocab: int,
        zipf: float,
        clusters: int,
        space: tuple[float, float, float, float],
        msg_terms: float,
        stopwords: int = DEFAULT_STOPWORDS,
    ) -> None:
        self.rng = np.random.default_rng(seed)
        rng = self.rng
        self.space = space
        self.vocab = vocab
        self.msg_terms = msg_terms
        x0, y0, x1, y1 = space
        p = 1.0 / np.arange(stopwords + 1, stopwords + vocab + 1) ** zipf
        self.term_p = p / p.sum()
        self.term_cdf = np.cumsum(self.term_p)
        # cluster centres: a few "continents" hold most clusters, so centres are themselves skewed
        k = max(1, clusters)
        hubs = rng.uniform((x0, y0), (x1, y1), size=(max(1, k // 20), 2))
        hub = rng.integers(0, len(hubs), k)
        spread = np.array([(x1 - x0) * 0.05, (y1 - y0) * 0.05])
        self.centres = np.clip(hubs[hub] + rng.normal(0, 1, (k, 2)) * spread, (x0, y0), (x1, y1))
        self.spread = rng.uniform(0.2, 3.0, k) * min(1.0, (x1 - x0) / 360.0 * 2)
        cp = 1.0 / np.arange(1, k + 1)
        self.cluster_cdf = np.cumsum(cp / cp.sum())
        self.topics = rng.integers(0, vocab, (k, min(TOPIC_WORDS, vocab)))

    def locations(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = self.rng
        x0, y0, x1, y1 = self.space
        c = np.minimum(np.searchsorted(self.cluster_cdf, rng.random(n)), len(self.cluster_cdf) - 1)
        xy = self.centres[c] + rng.normal(0, 1, (n, 2)) * self.spread[c, None]
        noise = rng.random(n) < NOISE_SHARE
        xy[noise] = rng.uniform((x0, y0), (x1, y1), size=(int(noise.sum()), 2))
        xy[:, 0] = np.clip(xy[:, 0], x0, x1)
        xy[:, 1] = np.clip(xy[:, 1], y0, y1)
        return np.round(xy[:, 0], 6), np.round(xy[:, 1], 6), c

    def terms(self, clusters: np.ndarray) -> list[np.ndarray]:
        """About ``msg_terms`` distinct term ranks per row (at least 1)."""
        rng = self.rng
        n = clusters.shape[0]
        counts = np.maximum(1, rng.poisson(self.msg_terms, n))
        width = int(counts.max()) + 4
        zipf = np.minimum(np.searchsorted(self.term_cdf, rng.random((n, width))), self.vocab - 1)
        topical = self.topics[clusters[:, None], rng.integers(0, self.topics.shape[1], (n, width))]
        pick = rng.random((n, width)) < TOPIC_SHARE
        draws = np.where(pick, topical, zipf)
        out = []
        for i in range(n):
            row = list(dict.fromkeys(draws[i].tolist()))[: counts[i]]
            out.append(row)
        return out


def generate(
    n_subs: int,
    n_msgs: int,
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab: int = 200_000,
    zipf: float = 1.0,
    clusters: int = 200,
    dnf_share: float = 0.0,
    circle_share: float = 0.0,
    region_msg_share: float = 0.0,
    moving_share: float = 0.0,
    msg_terms: float = 9.0,
    stopwords: int = DEFAULT_STOPWORDS,
    min_area: float = 0.0001,
    max_area: float = 0.01,
    space: tuple[float, float, float, float] = (-180.0, -90.0, 180.0, 90.0),
    conditions: ConditionShares = NO_CONDITIONS,
) -> dict:
    """Write ``subs.jsonl`` and ``msgs.jsonl`` under ``out_dir``; deterministic for a seed.
    ``conditions``: shares of subscriptions with NOT, a polygon, predicates (drawn from a
    random stream of their own, so a workload without them is the same as before them).
    O(n_subs + n_msgs). Returns counts and paths.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> generate(10, 5, d, seed=1)["subs"]
    10
    """
    _check_args(
        n_subs,
        n_msgs,
        stopwords,
        vocab,
        zipf,
        clusters,
        dnf_share,
        circle_share,
        region_msg_share,
        moving_share,
        msg_terms,
        min_area,
        max_area,
        space,
    )
    conditions.check()
    crng = np.random.default_rng([seed, 27])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = WorkloadModel(
        seed=seed,
        vocab=vocab,
        zipf=zipf,
        clusters=clusters,
        space=space,
        msg_terms=msg_terms,
        stopwords=stopwords,
    )
    rng = model.rng
    x0, y0, x1, y1 = space
    space_area = (x1 - x0) * (y1 - y0)
    words: dict[int, str] = {}

    def w(rank: int) -> str:
        s = words.get(rank)
        if s is None:
            s = words[rank] = word(rank)
        return s

    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    counts = {"dnf": 0, "circle": 0, "moving": 0, "region_msgs": 0}
    with open(out / "msgs.jsonl", "w", encoding="utf-8") as fh:
        for start in range(0, n_msgs, CHUNK):
            n = min(CHUNK, n_msgs - start)
            xs, ys, cl = model.locations(n)
            terms = model.terms(cl)
            region = rng.random(n) < region_msg_share
            area = rng.uniform(0.000001, 0.0001, n) * space_area
            lines = []
            for i in range(n):
                d: dict = {"id": f"m{start + i}", "keywords": [w(t) for t in terms[i]]}
                if region[i]:
                    half = math.sqrt(area[i]) / 2
                    d["rect"] = [
                        round(max(x0, xs[i] - half), 6),
                        round(max(y0, ys[i] - half), 6),
                        round(min(x1, xs[i] + half), 6),
                        round(min(y1, ys[i] + half), 6),
                    ]
                    counts["region_msgs"] += 1
                else:
                    d["point"] = [float(xs[i]), float(ys[i])]
                if conditions.messages_have_attributes:
                    d["attributes"] = message_attributes(crng)
                lines.append(dumps(d))
            fh.write("\n".join(lines) + "\n" if lines else "")
    with open(out / "subs.jsonl", "w", encoding="utf-8") as fh:
        for start in range(0, n_subs, CHUNK):
            n = min(CHUNK, n_subs - start)
            xs, ys, cl = model.locations(n)
            terms = model.terms(cl)
            k = rng.integers(1, 6, n)
            area = rng.uniform(min_area, max_area, n) * space_area
            aspect = rng.uniform(0.5, 2.0, n)
            kind = rng.random((n, 3))
            lines = []
            for i in range(n):
                row = terms[i]
                chosen = [
                    w(t)
                    for t in (
                        row if len(row) <= k[i] else rng.choice(row, k[i], replace=False).tolist()
                    )
                ]
                d = {"id": f"s{start + i}"}
                if kind[i, 0] < dnf_share and len(chosen) >= 2:
                    d["expr"] = dnf_text(rng, chosen)
                    counts["dnf"] += 1
                else:
                    d["keywords"] = chosen
                if kind[i, 1] < circle_share:
                    # equal area on the sphere at this latitude: deg^2 -> m^2
                    m_per_deg = math.pi / 180 * EARTH_RADIUS_M
                    a_m2 = area[i] * m_per_deg**2 * max(math.cos(math.radians(ys[i])), 0.01)
                    r = min(MAX_RADIUS_M, max(1.0, math.sqrt(a_m2 / math.pi)))
                    d["circle"] = [float(xs[i]), float(ys[i]), round(r, 1)]
                    counts["circle"] += 1
                else:
                    wdt = math.sqrt(area[i] * aspect[i])
                    hgt = area[i] / wdt
                    d["rect"] = [
                        round(max(x0, xs[i] - wdt / 2), 6),
                        round(max(y0, ys[i] - hgt / 2), 6),
                        round(min(x1, xs[i] + wdt / 2), 6),
                        round(min(y1, ys[i] + hgt / 2), 6),
                    ]
                if kind[i, 2] < moving_share:
                    d["moving"] = True
                    counts["moving"] += 1
                if conditions.any:
                    others = [w(t) for t in row]
                    add_conditions(crng, d, conditions, others, counts)
                lines.append(dumps(d))
            fh.write("\n".join(lines) + "\n" if lines else "")
    return {"subs": n_subs, "msgs": n_msgs, "dir": str(out), **counts}


def _check_args(
    n_subs, n_msgs, stopwords, vocab, zipf, clusters, dnf, circle, region, moving, msg_terms,
    min_area, max_area, space,
) -> None:  # fmt: skip
    check_shapes(
        n_subs,
        n_msgs,
        dnf_share=dnf,
        circle_share=circle,
        region_msg_share=region,
        moving_share=moving,
        min_area=min_area,
        max_area=max_area,
    )
    if stopwords < 0:
        raise ValidationError("--stopwords", stopwords, "must be >= 0")
    if vocab < 1:
        raise ValidationError("--vocab", vocab, "must be >= 1")
    if clusters < 1:
        raise ValidationError("--clusters", clusters, "must be >= 1")
    if not zipf >= 0:
        raise ValidationError("--zipf", zipf, "must be >= 0")
    if not msg_terms >= 1:
        raise ValidationError("--msg-terms", msg_terms, "must be >= 1")
    x0, y0, x1, y1 = space
    if not (-180 <= x0 < x1 <= 180 and -90 <= y0 < y1 <= 90):
        raise ValidationError(
            "--space",
            space,
            "need -180 <= min_lon < max_lon <= 180, -90 <= min_lat < max_lat <= 90",
        )


def _space(text: str) -> tuple[float, float, float, float]:
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--space {text!r}: expected min_lon,min_lat,max_lon,max_lat"
        ) from None
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"--space {text!r}: expected 4 numbers")
    return parts  # type: ignore[return-value]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gen", help="write a synthetic workload (subs.jsonl, msgs.jsonl)")
    p.add_argument("--subs", type=int, required=True)
    p.add_argument("--msgs", type=int, help="messages (with --moving: steps x --msgs-per-step)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--text",
        choices=("synthetic", "places"),
        default="synthetic",
        help="synthetic: the Zipf model below; places: real place names (GeoNames, "
        "geopubsub/tools/gen_places.py; --vocab, --zipf, --clusters, --msg-terms, --stopwords, "
        "--space do not apply)",
    )
    p.add_argument("--vocab", type=int, default=200_000)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--clusters", type=int, default=200)
    p.add_argument("--dnf-share", type=float, default=0.0)
    p.add_argument("--circle-share", type=float, default=0.0)
    p.add_argument("--region-msg-share", type=float, default=0.0)
    p.add_argument("--moving-share", type=float, default=0.0)
    p.add_argument("--msg-terms", type=float, default=9.0)
    c = p.add_argument_group("conditions beyond terms in a region ([2.7]; docs/LIMITS.md)")
    c.add_argument("--not-share", type=float, default=0.0, help="subscriptions with AND NOT a term")
    c.add_argument(
        "--polygon-share", type=float, default=0.0, help="rectangles drawn as star polygons"
    )
    c.add_argument(
        "--predicate-share",
        type=float,
        default=0.0,
        help="subscriptions with 1-2 predicates on price / category / rating",
    )
    c.add_argument(
        "--ranked-share",
        type=float,
        default=0.0,
        help="subscriptions ranked by similarity (threshold / alpha; paper 004 Sect. 6)",
    )
    c.add_argument(
        "--attributes",
        action="store_true",
        help="messages carry price / category / rating (always with --predicate-share)",
    )
    p.add_argument(
        "--stopwords",
        type=int,
        default=DEFAULT_STOPWORDS,
        help="Zipf head ranks dropped as stopwords (0: keep the whole law)",
    )
    p.add_argument("--min-area", type=float, default=0.0001)
    p.add_argument("--max-area", type=float, default=0.01)
    p.add_argument("--space", type=_space, default=(-180.0, -90.0, 180.0, 90.0))
    m = p.add_argument_group(
        "moving (--moving writes events.jsonl; defaults after the paper's Table 3)"
    )
    m.add_argument("--moving", action="store_true", help="every subscriber moves; write events")
    m.add_argument("--steps", type=int, default=100)
    m.add_argument("--step-s", type=float, default=30.0, help="seconds per step")
    m.add_argument(
        "--mobility", type=float, default=0.2, help="share of subscribers moving per step"
    )
    m.add_argument("--velocity-kmh", type=float, default=50.0)
    m.add_argument("--msgs-per-step", type=int, default=1000)
    m.add_argument("--lifetime-steps", type=float, default=10.0, help="message ttl in steps")
    p.set_defaults(func=run)


def run(args) -> int:
    t0 = time.perf_counter()
    if args.moving:
        args.moving_share = 1.0
        if args.msgs is None:
            args.msgs = args.steps * args.msgs_per_step
    elif args.msgs is None:
        raise ValidationError("--msgs", None, "is required (or give --moving)")
    shapes = {  # the options both generators take
        "seed": args.seed,
        "dnf_share": args.dnf_share,
        "circle_share": args.circle_share,
        "region_msg_share": args.region_msg_share,
        "moving_share": args.moving_share,
        "min_area": args.min_area,
        "max_area": args.max_area,
        "conditions": ConditionShares(
            args.not_share,
            args.polygon_share,
            args.predicate_share,
            args.attributes,
            args.ranked_share,
        ),
    }
    if args.text == "places":
        summary = generate_places(args.subs, args.msgs, args.out, **shapes)
    else:
        summary = generate(
            args.subs,
            args.msgs,
            args.out,
            vocab=args.vocab,
            zipf=args.zipf,
            clusters=args.clusters,
            msg_terms=args.msg_terms,
            stopwords=args.stopwords,
            space=args.space,
            **shapes,
        )
    dt = time.perf_counter() - t0
    extra = "".join(
        f", {summary[k]:,} {k}"
        for k in ("not", "polygon", "predicates", "ranked")
        if summary.get(k)
    )
    print(
        f"wrote {summary['subs']:,} subscriptions ({summary['dnf']:,} DNF, {summary['circle']:,} circles, "
        f"{summary['moving']:,} moving{extra}) and {summary['msgs']:,} messages ({summary['region_msgs']:,} regions) "
        f"to {summary['dir']} in {dt:.1f} s"
    )
    if args.moving:
        ev = write_events(
            Path(args.out),
            seed=args.seed,
            steps=args.steps,
            step_s=args.step_s,
            mobility=args.mobility,
            velocity_kmh=args.velocity_kmh,
            lifetime_steps=args.lifetime_steps,
        )
        print(
            f"wrote events.jsonl: {ev['publishes']:,} publishes, {ev['moves']:,} moves "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    return 0
