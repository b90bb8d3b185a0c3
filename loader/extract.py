"""The loader's extract: input files as Spark rows ``(file, block, payload)``.

Formats (``FORMATS``), each read from any path Spark reads -- local files, directories, globs,
``hdfs://``, ``s3a://`` once the Hadoop S3A connector and credentials are configured (e.g.
``--conf spark.jars.packages=org.apache.hadoop:hadoop-aws:3.3.4`` with ``spark-submit``):

- ``jsonl``: the workload format of the README (one subscription object a line, UTF-8); read as
  text lines (``sc.textFile``: also comma-free globs and directories), split across tasks at
  block boundaries. Invalid UTF-8 is decoded with U+FFFD.
- ``csv``: one subscription a line in the layout ``loader.transform.CSV_COLUMNS``
  (``id,keywords,expr,min_lon,min_lat,max_lon,max_lat,lon,lat,radius_m,moving``); a first line
  equal to that header is skipped. Read as text lines too, so rejects name the exact line.
- ``parquet``: columns ``loader.transform.PARQUET_COLUMNS`` (the JSON form: ``id`` string,
  ``keywords`` list<string>, ``expr`` string, ``rect`` / ``circle`` list<double>, ``moving``
  boolean; missing columns count as null); any other column is refused before the job runs.

``block`` is the start offset of the row's input split (text: the Hadoop split of the
partition; Parquet: ``_metadata.file_block_start``); ``loader.transform`` numbers rows within
blocks and blocks within files, which gives each reject its line or row.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from loader.transform import PARQUET_COLUMNS
from shard.errors import ValidationError

FORMATS = ("jsonl", "parquet", "csv")
_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".csv": "csv",
}
_PARQUET_TYPES = {
    "id": "string",
    "keywords": "array<string>",
    "expr": "string",
    "rect": "array<double>",
    "circle": "array<double>",
    "moving": "boolean",
    "polygon": "array<array<array<double>>>",
    "predicates": "string",
    "threshold": "double",
    "alpha": "double",
    "weights": "map<string,double>",
}


def guess_format(paths: Sequence[str]) -> str:
    """The format named by the first input's extension (a directory: of the files in it);
    ``jsonl`` when nothing tells.

    >>> guess_format(["subs.parquet"]), guess_format(["a.csv"]), guess_format(["x"])
    ('parquet', 'csv', 'jsonl')
    """
    first = paths[0].rstrip("/")
    suffix = Path(urlsplit(first).path).suffix.lower()
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    local = Path(first)
    if local.is_dir():
        for child in sorted(local.iterdir()):
            if child.suffix.lower() in _EXTENSIONS:
                return _EXTENSIONS[child.suffix.lower()]
    return "jsonl"


def display_path(uri: str) -> str:
    """A file URI as the user would write it: ``file:///tmp/a b.jsonl`` -> ``/tmp/a b.jsonl``.

    >>> display_path("file:///tmp/a%20b.jsonl"), display_path("s3a://bucket/x.jsonl")
    ('/tmp/a b.jsonl', 's3a://bucket/x.jsonl')
    """
    parts = urlsplit(uri)
    return unquote(parts.path) if parts.scheme == "file" else uri


def read_rows(spark, paths: Sequence[str], fmt: str):
    """An RDD of ``(file, block, payload)``: the text line for ``jsonl`` / ``csv``, the tuple of
    ``PARQUET_COLUMNS`` values for ``parquet``. Lazy (nothing is read until an action)."""
    from pyspark.sql import functions as F

    if fmt not in FORMATS:
        raise ValidationError("format", fmt, f"must be one of {', '.join(FORMATS)}")
    if not paths:
        raise ValidationError("inputs", list(paths), "give at least one input path")
    if fmt in ("jsonl", "csv"):
        return _text_rows(spark.sparkContext, paths)
    df = spark.read.parquet(*paths)
    unknown = sorted(set(df.columns) - set(PARQUET_COLUMNS))
    if unknown:
        raise ValidationError(
            "parquet columns", unknown, f"unknown; the layout is {', '.join(PARQUET_COLUMNS)}"
        )
    payload = F.struct(
        *(
            F.col(c).cast(_PARQUET_TYPES[c]).alias(c)
            if c in df.columns
            else F.lit(None).cast(_PARQUET_TYPES[c]).alias(c)
            for c in PARQUET_COLUMNS
        )
    )
    rows = df.select(
        F.col("_metadata.file_path").alias("file"),
        F.col("_metadata.file_block_start").alias("block"),
        payload.alias("payload"),
    )
    return rows.rdd.map(lambda r: (display_path(r[0]), r[1], r[2]))


def _text_rows(sc, paths: Sequence[str]):
    """Text lines with their split: ``sc.textFile`` streams lines to Python as plain strings
    (a DataFrame's rows would be pickled one by one), and its partition i is the Hadoop split
    i, whose file and start the driver reads off the JVM partitions."""
    lines = sc.textFile(",".join(paths))
    splits = []
    for p in lines._jrdd.rdd().partitions():
        split = p.inputSplit().value()
        splits.append((display_path(split.getPath().toString()), int(split.getStart())))

    def tag(i: int, it):
        file, block = splits[i]
        return ((file, block, line) for line in it)

    return lines.mapPartitionsWithIndex(tag, preservesPartitioning=True)
