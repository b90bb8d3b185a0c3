"""Ranked subscriptions in the cluster (``shard.ranking``): the term weights the cluster gives
them, and the score a delivery carries.

* **Weights.** The coordinator counts, over the subscriptions it holds, how many name each term
  (``TermCounts``, kept by the router as subscriptions come and go, rebuilt from Redis at
  start). A ranked subscription subscribed without ``weights`` gets each term's smoothed idf
  then (``shard.ranking.idf_weight``), and keeps them (they are written to Redis with it).
* **Scores.** A delivery (ADD) to a ranked subscription carries ψ(s, m), computed here from the
  subscription as the coordinator holds it when the delivery is built (a moving one where it
  was last moved to) and the message: the same ``shard.ranking.score`` the shards decide with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain

from geopubsub.convert import from_proto_message
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.brute import ranked_score
from shard.errors import ValidationError
from shard.model import Point, Subscription
from shard.ranking import idf_weight
from shard.topk.hosted import as_event, as_topk
from shard.topk.model import score as topk_score


class TermCounts:
    """How many of the held subscriptions name each term (any clause, counted once each).

    Changes are queued and counted in bulk, additions and removals in two counters that only
    grow (``collections.Counter`` counts an iterable in C; subtracting one counter from another
    loops in Python), when a count is read or once ``FOLD_AFTER`` wait: counting each
    subscription as it came cost 8 % of the coordinator's CPU in batched Subscribes (py-spy,
    docs/BENCHMARKS.md), for the ranked subscriptions that need it."""

    FOLD_AFTER = 512
    """Folded this often: the cost a change is the same at any size, but one fold is a pause of
    the coordinator (4,096 took 2.7 ms in process; the single Subscribes of ``bench subscribe``
    that met one waited up to 14 ms behind it)."""

    def __init__(self) -> None:
        self._in: Counter[str] = Counter()
        self._out: Counter[str] = Counter()
        self._added: list[Subscription] = []
        self._removed: list[Subscription] = []
        self.n = 0

    @staticmethod
    def _terms(sub: Subscription) -> Iterable[str]:
        clauses = sub.clauses
        if len(clauses) == 1:  # (a clause's terms are distinct already)
            return clauses[0]
        return {t for clause in clauses for t in clause}

    def add(self, sub: Subscription) -> None:
        self.n += 1
        self._added.append(sub)
        if len(self._added) >= self.FOLD_AFTER:
            self._fold()

    def remove(self, sub: Subscription) -> None:
        self.n -= 1
        self._removed.append(sub)
        if len(self._removed) >= self.FOLD_AFTER:
            self._fold()

    def _fold(self) -> None:
        terms = self._terms
        if self._added:
            self._in.update(chain.from_iterable(map(terms, self._added)))
            self._added = []
        if self._removed:
            self._out.update(chain.from_iterable(map(terms, self._removed)))
            self._removed = []

    def count(self, term: str) -> int:
        """How many held subscriptions name ``term``."""
        self._fold()
        return self._in[term] - self._out[term]

    @property
    def df(self) -> Counter[str]:
        """Every term's count (a copy; O(terms ever counted): for inspection)."""
        self._fold()
        out = self._in.copy()
        out.subtract(self._out)
        return out

    def weights(self, sub: Subscription) -> Subscription:
        """``sub`` with idf weights if it is ranked and has none (else ``sub`` itself).

        >>> from shard.model import Rect
        >>> tc = TermCounts()
        >>> for i in range(9):
        ...     tc.add(Subscription(f"p{i}", (("common",),), Rect(0, 0, 1, 1)))
        >>> r = tc.weights(Subscription("r", (("common", "rare"),), Rect(0, 0, 1, 1), threshold=0.8))
        >>> [round(w, 3) for w in r.weights]
        [1.0, 3.303]
        """
        if sub.threshold is None or sub.weights is not None:
            return sub
        count = self.count
        w = tuple(idf_weight(self.n, max(count(t), 0)) for t in sub.clauses[0])
        return Subscription(
            sub.id, sub.clauses, sub.region, sub.moving, sub.keywords, sub.expr, sub.negated,
            sub.predicates, sub.threshold, sub.alpha, w,
        )  # fmt: skip


def delivery_score(sub: Subscription | None, message: pb.Message) -> float | None:
    """ψ(s, m) for an ADD of ``message`` to ``sub`` if ``sub`` is ranked (``shard.ranking``)
    or a top-k subscription (paper 001's score, ``shard.topk.model.score``, the floats the
    shards ranked with), else None."""
    if sub is None or (sub.threshold is None and not sub.topk):
        return None
    try:  # (a delivery made before the subscription was replaced by another kind may not fit)
        msg = from_proto_message(message, default_id=message.id or "m", need_terms=False)
    except ValidationError:
        return None
    if sub.topk:
        if type(msg.location) is not Point:
            return None
        return topk_score(as_topk(sub), as_event(msg))
    if not msg.terms:
        return None
    return ranked_score(sub, msg)
