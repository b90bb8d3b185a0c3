"""RQ-Tree (paper 002, Sect. 3.2.1 footnote 4 and Sect. 5.1.1): the keyword-prioritized variant
of IQ-Tree. It "first employs ranked-key Inverted List [6,46] to partition subscriptions into
the posting lists according to their least frequent keywords. Then for subscriptions on each
posting list, we build a Quadtree for spatial filtering purpose where the cost model in [6] is
also adopted." A message walks, for each of its terms, that term's Quadtree over the cells its
location meets, and verifies the entries there.

The cells, the cost model, the lists and the maintenance are ``shard.rivals.iq_quadtree``'s
(shared with IQ-Tree; here one tree per key term, each cell one list); its docstring follows the
paper step by step and lists, under "Where the paper is ambiguous", every choice made.

>>> from shard.model import Message, Point, Rect, Subscription
>>> ix = RQTree.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
>>> ix.match_batch([Message("m", ("sale", "ipad", "x"), Point(0.5, 0.5))])
[['s']]
>>> ix.unsubscribe("s"); ix.match_batch([Message("m", ("sale", "ipad"), Point(0.5, 0.5))])
[[]]
"""

from __future__ import annotations

from shard.rivals.iq_quadtree import QuadCellIndex


class RQTree(QuadCellIndex):
    """RQ-Tree: a Quadtree per key term (the ranked-key list of that term, partitioned in
    space; Sect. 5.1.1). Options: ``cell_capacity``, ``max_depth``, ``messages_per_update``
    (``options_doc``)."""

    name = "rqtree"
    forest = True
