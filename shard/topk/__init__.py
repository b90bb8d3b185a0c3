"""Top-k subscription matching for location-aware pub/sub (paper 001: Hu, Cheng, Wu, Jin, the
R^I-tree): weighted boolean predicates + a point + α per subscription, the k best subscriptions
of an event by ψ = (1 − α)·ψ_t + α·ψ_s.

* ``model``   subscriptions, events, validation, JSON Lines, the reference score (Sect. 3.1)
* ``columns`` the subscriptions as columns, interning, Table 2's intervals
* ``kernels`` compiled score, bounds (Eq. 6-8), top-k threshold with exact ties
* ``ritree``  the R^I-tree (Sect. 5)            ``tas``  the TA baseline (Sect. 4)
* ``oracle``  brute force: the compiled SCAN and the plain-Python reference

Every index: ``build(subs)``, ``subscribe``, ``unsubscribe``, ``topk(event, k)``,
``topk_batch(events, k)``; results by score descending, then id ascending.
"""

from shard.topk.oracle import BruteTopK, reference_topk
from shard.topk.ritree import RITree
from shard.topk.tas import TAS

__all__ = ["TAS", "BruteTopK", "RITree", "reference_topk"]
