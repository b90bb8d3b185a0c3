"""Every index by the name ``--index`` and the shard setting ``index`` use.

``aptree`` (the AP-Tree, ``shard.aptree``; in a shard the AP+-Tree), ``invlist`` (the
keyword-first inverted list, static), ``brute`` (the oracle), and the rivals of the seed papers
(``shard.rivals``), each a ``RivalIndex``: ``rt``, ``rt+``, ``rt++`` (papers 003/004),
``mbrtrie``, ``ptquadtree``, ``lfilter`` (paper 000), ``iqtree``, ``rqtree`` (paper 002).
A rival's module is imported when its name is first asked for.

>>> index_class("brute").__name__
'BruteMatcher'
>>> index_class("kdtree")
Traceback (most recent call last):
...
shard.errors.ValidationError: index='kdtree': must be one of aptree, invlist, brute, rt, rt+, rt++, mbrtrie, ptquadtree, lfilter, iqtree, rqtree
"""

from __future__ import annotations

import importlib
from typing import Any

from shard.errors import ValidationError

RIVALS: dict[str, tuple[str, str]] = {
    "rt": ("shard.rivals.rtree", "RtTree"),
    "rt+": ("shard.rivals.rtree", "RtPlusTree"),
    "rt++": ("shard.rivals.rtree", "RtPlusPlusTree"),
    "mbrtrie": ("shard.rivals.mbrtrie", "MBRTrie"),
    "ptquadtree": ("shard.rivals.ptquadtree", "PTQuadtree"),
    "lfilter": ("shard.rivals.lfilter", "LFilter"),
    "iqtree": ("shard.rivals.iqtree", "IQTree"),
    "rqtree": ("shard.rivals.rqtree", "RQTree"),
}
"""Rival name -> (module, class)."""

CORE: dict[str, tuple[str, str]] = {
    "aptree": ("shard.aptree.tree", "APTree"),
    "invlist": ("shard.invlist", "InvertedList"),
    "brute": ("shard.brute", "BruteMatcher"),
}

INDEX_NAMES: tuple[str, ...] = (*CORE, *RIVALS)
RIVAL_NAMES: tuple[str, ...] = tuple(RIVALS)


def index_class(name: str) -> type:
    """The class of the index called ``name``."""
    where = CORE.get(name) or RIVALS.get(name)
    if where is None:
        raise ValidationError("index", name, f"must be one of {', '.join(INDEX_NAMES)}")
    return getattr(importlib.import_module(where[0]), where[1])


def make_index(name: str, subs=(), **options: Any):
    """An index called ``name`` over ``subs``, built in bulk with ``options``."""
    return index_class(name).build(subs, **options)
