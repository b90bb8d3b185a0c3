"""Convert a JSON Lines workload to the loader's Parquet or CSV layout (``loader.extract``), with
Spark: ``python -m loader.convert subs.jsonl subs.parquet [--format parquet|csv]``.

For benchmarks and tests of the other input formats; rows are not validated here (the loader
does that), fields outside the layout are dropped.
"""

from __future__ import annotations

import argparse
import sys

from loader.job import spark_session
from loader.transform import CSV_COLUMNS

JSON_SCHEMA = (
    "id string, keywords array<string>, expr string, rect array<double>, "
    "circle array<double>, moving boolean, polygon array<array<array<double>>>, "
    "predicates string, threshold double, alpha double, weights map<string,double>"
)
"""``predicates`` is read as text: Spark keeps the JSON of a list in a string column."""


def convert(spark, src: str, dst: str, fmt: str = "parquet", partitions: int | None = None) -> int:
    """Write ``src`` (JSON Lines) to ``dst`` as a Spark Parquet or CSV directory; returns the
    number of rows."""
    from pyspark.sql import functions as F

    df = spark.read.schema(JSON_SCHEMA).json(src)
    if partitions:
        df = df.coalesce(partitions)
    if fmt == "parquet":
        df.write.mode("overwrite").parquet(dst)
    elif fmt == "csv":
        rect = [F.col("rect")[i].alias(c) for i, c in enumerate(CSV_COLUMNS[3:7])]
        circle = [F.col("circle")[i].alias(c) for i, c in enumerate(CSV_COLUMNS[7:10])]
        flat = df.select(
            "id",
            F.array_join("keywords", " ").alias("keywords"),
            "expr",
            *rect,
            *circle,
            F.col("moving").cast("string").alias("moving"),
            F.when(F.col("polygon").isNotNull(), F.to_json("polygon")).alias("polygon"),
            "predicates",
            "threshold",
            "alpha",
            F.when(F.col("weights").isNotNull(), F.to_json("weights")).alias("weights"),
        )
        # RFC 4180 quoting (a quote doubled), as the loader reads CSV (Spark escapes with a backslash)
        flat.write.mode("overwrite").option("header", True).option("escape", '"').csv(dst)
    else:
        raise ValueError(f"format must be parquet or csv, not {fmt!r}")
    return spark.read.parquet(dst).count() if fmt == "parquet" else df.count()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loader.convert", description=__doc__)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv"))
    p.add_argument("--master", default="local[*]")
    p.add_argument("--partitions", type=int, help="output files (default: Spark's)")
    args = p.parse_args(argv)
    spark = spark_session(args.master)
    try:
        n = convert(spark, args.src, args.dst, args.format, args.partitions)
    finally:
        spark.stop()
    print(f"wrote {n:,} rows to {args.dst} ({args.format})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
