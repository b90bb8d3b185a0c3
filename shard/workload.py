"""JSON Lines workload files: streaming readers that report bad lines as ``file:line: reason``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from shard.errors import ValidationError
from shard.model import Message, Subscription, message_from_dict, subscription_from_dict

T = TypeVar("T")


class WorkloadError(ValidationError):
    """A bad line under ``--strict``: ``field`` is ``file:line``."""


def json_object(text: str) -> dict:
    """One line's JSON object. Raises ValueError for text that is no JSON, another JSON value,
    or nesting too deep for the parser (which would raise RecursionError: a line of 5,000 ``[``
    must be a rejected row, not a failed job).

    >>> json_object('{"id": "a"}'), json_object("[" * 5000 + "]" * 5000)
    Traceback (most recent call last):
    ...
    ValueError: JSON nested too deeply
    """
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def iter_jsonl(
    path: str | Path,
    parse: Callable[[Any], T],
    *,
    strict: bool = False,
    errors: list[str] | None = None,
) -> Iterator[T]:
    """Stream objects parsed from a JSON Lines file (blank lines skipped).

    A bad line is appended to ``errors`` as ``path:line: reason`` and skipped, or, with ``strict``,
    raised as WorkloadError. Reads line by line: O(1) memory in the file size.
    """
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                yield parse(json_object(raw.decode("utf-8")))
            except (ValueError, ValidationError) as exc:
                reason = (
                    str(exc)
                    if not isinstance(exc, UnicodeDecodeError)
                    else f"invalid UTF-8: {exc.reason}"
                )
                text = f"{path}:{lineno}: {reason}"
                if strict:
                    raise WorkloadError(
                        f"{path}:{lineno}", raw[:80].decode("utf-8", "replace"), reason
                    ) from exc
                if errors is not None:
                    errors.append(text)


def read_subscriptions(
    path: str | Path, *, strict: bool = False, errors: list[str] | None = None
) -> Iterator[Subscription]:
    """Stream validated subscriptions from a workload file."""
    return iter_jsonl(path, subscription_from_dict, strict=strict, errors=errors)


def without_topk(
    subs: Iterable[Subscription], errors: list[str], strict: bool = False
) -> Iterator[Subscription]:
    """``subs`` without the top-k subscriptions (paper 001: ``geopubsub bench topk`` runs
    those; the matching benchmarks cannot), each reported in ``errors`` (raised with
    ``strict``)."""
    for s in subs:
        if not s.topk:
            yield s
            continue
        e = ValidationError("point", s.id, "a top-k subscription: geopubsub bench topk takes it")
        if strict:
            raise e
        errors.append(str(e))


def read_messages(
    path: str | Path, *, strict: bool = False, errors: list[str] | None = None
) -> Iterator[Message]:
    """Stream validated messages from a workload file."""
    return iter_jsonl(path, message_from_dict, strict=strict, errors=errors)


def write_jsonl(path: str | Path, dicts: Iterable[dict[str, Any]]) -> int:
    """Write one compact JSON object per line (UTF-8). Returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for d in dicts:
            fh.write(json.dumps(d, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
            n += 1
    return n
