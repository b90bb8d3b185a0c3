"""IQ-Tree (paper 002, Sect. 3.1 and Fig. 4a; its ref. [6]): a spatial-first index. A Quadtree
whose cells hold ranked-key posting lists: each DNF clause is attached to one or several cells
by a cost model that balances matching and update costs, and within a cell sits on the list of
its least frequent term. A message visits the cells its location meets and, in each, verifies
the lists of its own terms (filtering and refinement).

The cells, the cost model, the lists and the maintenance are ``shard.rivals.iq_quadtree``'s
(shared with RQ-Tree, which puts the keyword first); its docstring follows the paper step by
step and lists, under "Where the paper is ambiguous", every choice made.

>>> from shard.model import Message, Point, Rect, Subscription
>>> ix = IQTree.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
>>> ix.match_batch([Message("m", ("sale", "ipad", "x"), Point(0.5, 0.5))])
[['s']]
>>> ix.unsubscribe("s"); ix.match_batch([Message("m", ("sale", "ipad"), Point(0.5, 0.5))])
[[]]
"""

from __future__ import annotations

from shard.rivals.iq_quadtree import QuadCellIndex


class IQTree(QuadCellIndex):
    """IQ-Tree: one Quadtree over the data space; each cell keeps a posting list per key term
    (Sect. 3.1, Fig. 4a). Options: ``cell_capacity``, ``max_depth``, ``messages_per_update``
    (``options_doc``)."""

    name = "iqtree"
    forest = False
