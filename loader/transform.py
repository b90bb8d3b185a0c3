"""The loader's transform: pure functions over rows and records, no Spark, no I/O.

Spark runs them per partition (``loader.job``); tests call them directly. Validation,
normalization and expression parsing are the core's ``shard.model.subscription_from_dict``, the
encoding is ``shard.metadata_codec``, placement is ``shard.partition_map`` with
``shard.residual.index_box`` -- the very functions the coordinator uses online.

A *row* is ``(file, block, payload)``: ``block`` is the byte offset where the row's input split
starts (Spark's ``_metadata.file_block_start``); rows of one block come in file order. Each
partition yields *records*, plain tuples (cheap to pickle between Spark stages):

    (OK, id, position, sub_json, bbox, terms)   a valid subscription
    (BAD, file, block, index, reason)           an invalid row
    (BLOCK, file, block, rows)                  how many rows a block held
    (SUMMARY, hashes, centres)                  per partition: the OK records' ``id_hash``
                                                 and region-box centres, as arrays

``position`` = (file, block, index in block) orders the rows of the input; for an id given
twice the later row wins (``later``). Finding repeated ids needs no shuffle of the records: the
driver looks for repeated hashes among the SUMMARY arrays (8 bytes a record), and only records
with such a hash are compared by id (``repeated_hashes``, ``final_records``). ``line_offsets`` turns the block counts into the number of
rows before each block, so a reject is reported as ``file:line`` (JSON Lines, CSV: lines counted
from 1 as an editor does, blank ones included) or ``file:row`` (Parquet: rows from 1).
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import numpy as np

from shard import model
from shard.errors import ValidationError
from shard.metadata_codec import encode_subscription
from shard.partition_map import PartitionMap, bbox_centre
from shard.residual import index_box
from shard.workload import json_object

OK, BAD, BLOCK, SUMMARY = 0, 1, 2, 3

Position = tuple[str, int, int]
Record = tuple

CSV_COLUMNS = (
    "id",
    "keywords",
    "expr",
    "min_lon",
    "min_lat",
    "max_lon",
    "max_lat",
    "lon",
    "lat",
    "radius_m",
    "moving",
    "polygon",
    "predicates",
    "threshold",
    "alpha",
    "weights",
)
"""The CSV layout, in this order (a first line equal to ``CSV_HEADER`` is skipped):
``keywords`` separated by spaces (or ``expr`` instead); a rectangle in ``min_lon..max_lat``, a
circle in ``lon, lat, radius_m`` or a ``polygon`` as the JSON text of its rings (leave the
others empty); ``moving`` true/false or empty; ``predicates`` the JSON text of the list (or
empty); a ranked subscription's ``threshold``, ``alpha`` (numbers) and ``weights`` (the JSON
text of ``{keyword: weight}``), empty otherwise. One subscription a line: no line breaks inside a
field. A row of the first 11 columns only (the layout before these) is read as before."""
CSV_HEADER = ",".join(CSV_COLUMNS)
_CSV_OLD = CSV_COLUMNS[:11]

PARQUET_COLUMNS = (
    "id", "keywords", "expr", "rect", "circle", "moving", "polygon", "predicates", "threshold",
    "alpha", "weights",
)  # fmt: skip
"""The Parquet layout mirrors the JSON form: ``id`` string, ``keywords`` list<string>, ``expr``
string, ``rect`` list<double> (min_lon, min_lat, max_lon, max_lat), ``circle`` list<double>
(lon, lat, radius_m), ``moving`` boolean, ``polygon`` list<list<list<double>>> (rings of [lon,
lat]), ``predicates`` string (the JSON text of the list: a predicate's value is a number, a
string or a list), ``threshold`` / ``alpha`` double, ``weights`` map<string, double>; null (or a
missing column) means absent. Other columns are refused."""

MAX_REASON = 300
"""Longest reason kept for a reject (a value in it is already cut to 80 characters)."""


# ---- payload -> workload dict (one per input format) ------------------------------------------
def jsonl_payload(line: str) -> Any:
    """A JSON Lines row: the parsed object, or None for a blank line (skipped, as
    ``shard.workload.iter_jsonl`` does)."""
    if not line.strip():
        return None
    return json_object(line)


def csv_payload(line: str) -> Any:
    """A CSV row (layout ``CSV_COLUMNS``) as the workload form; None for a blank line or the
    header. Cells are handed on as given where they are not numbers, so the core's validator
    names the field and the bad value."""
    if not line.strip() or line.strip() in (CSV_HEADER, ",".join(_CSV_OLD)):
        return None
    try:
        cells = next(csv.reader([line]))
    except csv.Error as exc:  # a bare carriage return, say: a rejected row, not a failed job
        raise ValueError(f"not a CSV row: {exc}") from None
    if len(cells) not in (len(CSV_COLUMNS), len(_CSV_OLD)):
        raise ValueError(f"expected {len(CSV_COLUMNS)} columns ({CSV_HEADER}), got {len(cells)}")
    c = dict(zip(CSV_COLUMNS, cells, strict=False))
    d: dict[str, Any] = {"id": c["id"]}
    if c["keywords"] != "":
        d["keywords"] = c["keywords"].split()
    if c["expr"] != "":
        d["expr"] = c["expr"]
    rect = [c[k] for k in ("min_lon", "min_lat", "max_lon", "max_lat")]
    circle = [c[k] for k in ("lon", "lat", "radius_m")]
    if any(v != "" for v in rect):
        d["rect"] = [_number(v) for v in rect]
    if any(v != "" for v in circle):
        d["circle"] = [_number(v) for v in circle]
    moving = c["moving"].strip().lower()
    if moving != "":
        d["moving"] = {"true": True, "false": False}.get(moving, c["moving"])
    for k in ("polygon", "predicates", "weights"):
        if c.get(k, "") != "":
            d[k] = _json_cell(k, c[k])
    for k in ("threshold", "alpha"):
        if c.get(k, "") != "":
            d[k] = _number(c[k])
    return d


def _json_cell(field: str, text: str) -> Any:
    """A cell holding JSON text (a polygon's rings, the predicates)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValidationError(field, text, f"not JSON: {exc}") from None


def parquet_payload(row: Sequence[Any]) -> Any:
    """A Parquet row (values in ``PARQUET_COLUMNS`` order) as the workload form; nulls dropped."""
    d = {k: v for k, v in zip(PARQUET_COLUMNS, row, strict=False) if v is not None}
    for k in ("keywords", "rect", "circle"):
        if k in d:
            d[k] = list(d[k])
    if "polygon" in d:
        d["polygon"] = [[list(p) for p in ring] for ring in d["polygon"]]
    if "predicates" in d:
        d["predicates"] = _json_cell("predicates", d["predicates"])
    if "weights" in d:
        d["weights"] = dict(d["weights"])
    return d


PAYLOADS: dict[str, Callable[[Any], Any]] = {
    "jsonl": jsonl_payload,
    "csv": csv_payload,
    "parquet": parquet_payload,
}


def _number(cell: str) -> Any:
    try:
        return float(cell)
    except ValueError:
        return cell  # the validator reports it: "must be a number"


# ---- validation -------------------------------------------------------------------------------
def validate_rows(
    rows: Iterable[tuple[str, int, Any]], payload: Callable[[Any], Any]
) -> Iterator[Record]:
    """Validate rows ``(file, block, payload)`` of one partition with the core's
    ``subscription_from_dict``; yield an OK or BAD record per row (none for blank lines), a
    BLOCK record per block and, last, one SUMMARY record. O(rows · terms).

    >>> recs = list(validate_rows([("f", 0, '{"id": "a", "keywords": ["X"], "rect": [0, 0, 1, 1]}'),
    ...                            ("f", 0, '{"id": "b"}')], jsonl_payload))
    >>> [r[0] for r in recs], recs[0][1], recs[1][4]
    ([0, 1, 2, 3], 'a', "keywords=None: give exactly one of 'keywords' and 'expr'")
    """
    current: tuple[str, int] | None = None
    index = 0
    hashes: list[int] = []
    centres: list[tuple[float, float]] = []
    for file, block, raw in rows:
        if (file, block) != current:
            if current is not None:
                yield (BLOCK, current[0], current[1], index)
            current, index = (file, block), 0
        try:
            d = payload(raw)
            if d is not None:
                sub = model.subscription_from_dict(d)
                bbox = index_box(sub)
                terms = tuple(sorted({t for clause in sub.clauses for t in clause}))
                yield (OK, sub.id, (file, block, index), encode_subscription(sub), bbox, terms)
                hashes.append(id_hash(sub.id))
                centres.append(bbox_centre(bbox))
        except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
            yield (BAD, file, block, index, _reason(exc))
        index += 1
    if current is not None:
        yield (BLOCK, current[0], current[1], index)
    yield (
        SUMMARY,
        np.array(hashes, np.uint64),
        np.array(centres, np.float64).reshape(-1, 2),
    )


def _reason(exc: Exception) -> str:
    text = f"invalid UTF-8: {exc.reason}" if isinstance(exc, UnicodeDecodeError) else str(exc)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def id_hash(sub_id: str) -> int:
    """A stable 64-bit hash of an id (the same in every process, unlike ``hash``).

    >>> id_hash("s1") == id_hash("s1") != id_hash("s2")
    True
    """
    return int.from_bytes(hashlib.blake2b(sub_id.encode(), digest_size=8).digest(), "little")


# ---- duplicate ids ----------------------------------------------------------------------------
def repeated_hashes(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From the id hashes of every OK record: the hashes that occur more than once (ids given
    twice, or, about never, two ids sharing a hash) and a mask of the records whose hash occurs
    once, which need no look at the others. O(n log n) on 8 bytes a record, on the driver.

    >>> rep, once = repeated_hashes(np.array([5, 7, 5, 9], np.uint64))
    >>> rep.tolist(), once.tolist()
    ([5], [False, True, False, True])
    """
    uniq, inverse, counts = np.unique(hashes, return_inverse=True, return_counts=True)
    return uniq[counts > 1], counts[inverse] == 1


def later(a: Position, b: Position) -> Position:
    """Of two positions of one id, the later row's (by file, block, index): it wins."""
    return a if a > b else b


def final_records(
    records: Iterable[Record], repeated: frozenset[int], winners: Mapping[str, Position]
) -> Iterator[Record]:
    """The OK records that go to Redis: each id once, at the position ``winners`` names for the
    ids whose hash is ``repeated``. O(records)."""
    for r in records:
        if r[0] != OK:
            continue
        if repeated and id_hash(r[1]) in repeated and winners.get(r[1]) != r[2]:
            continue
        yield r


# ---- sources of rejects -----------------------------------------------------------------------
def line_offsets(blocks: Iterable[Sequence]) -> dict[tuple[str, int], int]:
    """Rows before each block of a file, from ``(file, block, rows, ...)`` of every block.
    O(blocks log blocks).

    >>> line_offsets([("f", 100, 3), ("f", 0, 5), ("g", 0, 1)])
    {('f', 0): 0, ('f', 100): 5, ('g', 0): 0}
    """
    out: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    for file, block, rows, *_ in sorted(blocks):
        out[(file, block)] = seen.get(file, 0)
        seen[file] = seen.get(file, 0) + rows
    return out


def reject_line(record: Record, offsets: Mapping[tuple[str, int], int]) -> str:
    """A BAD record as ``file:line: reason`` (the workload reader's form).

    >>> reject_line((BAD, "f", 100, 2, "id=None: must be a string"), {("f", 100): 5})
    'f:8: id=None: must be a string'
    """
    _, file, block, index, reason = record
    return f"{file}:{offsets[(file, block)] + index + 1}: {reason}"


# ---- placement --------------------------------------------------------------------------------
def keyword_counts(records: Iterable[Record]) -> dict[str, int]:
    """Subscriptions per term over OK records (the AP-Tree's keyword frequencies). O(terms)."""
    out: dict[str, int] = {}
    for r in records:
        for t in r[5]:
            out[t] = out.get(t, 0) + 1
    return out


def place(
    records: Iterable[Record], pm: PartitionMap, chunk: int = 2000
) -> Iterator[tuple[str, str, tuple]]:
    """``(id, sub_json, shards)`` for OK records: every part its region's box meets, as the
    coordinator's engine places a subscription (``PartitionMap.overlapping``, here
    ``overlapping_many`` on ``chunk`` records at a time). O(records · parts)."""
    it = iter(records)
    while batch := list(islice(it, chunk)):
        where = pm.overlapping_many(np.array([r[4] for r in batch], np.float64))
        for r, shards in zip(batch, where, strict=True):
            yield r[1], r[3], tuple(shards)


def merge_counts(parts: Iterable[Mapping[Any, int]]) -> dict[Any, int]:
    """Sum of count dicts (the per-partition statistics of the load)."""
    out: dict[Any, int] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0) + v
    return out
