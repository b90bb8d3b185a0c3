"""``APTree``: the adaptive spatial-keyword index of the paper (Sect. 3), a Python shell over
compiled kernels and columnar subscription storage.

>>> from shard.model import Subscription, Message, Rect, Point
>>> t = APTree.build([Subscription("s1", (("ipad",),), Rect(0, 0, 1, 1))])
>>> t.match(Message("m1", ("ipad", "sale"), Point(0.5, 0.5)))
['s1']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from shard.aptree.build import (
    build_subtree,
    compact,
    init_node,
    new_tree,
    refresh_leaf_entries,
)
from shard.aptree.check import check_tree
from shard.aptree.layout import (
    C_CH,
    C_FREE,
    C_GARBAGE,
    C_LI,
    C_NODES,
    C_PROMOTIONS,
    C_REBUILDS,
    C_ROOT,
    DEFAULT_DUMMY_SHARE,
    DEFAULT_FANOUT,
    DEFAULT_GROWTH,
    DEFAULT_KEYWORD_FANOUT,
    DEFAULT_KEYWORD_ORDER,
    DEFAULT_KL_CHECK_FRACTION,
    DEFAULT_KL_MIN_FRACTION,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_SPAN,
    DEFAULT_THETA_KL,
    DEFAULT_THETA_P,
    F_CHOFF,
    F_DEPTH,
    F_LLEN,
    F_NBUILT,
    F_NCH,
    F_SIZE,
    F_TYPE,
    KNODE,
    LEAF,
    N_PARAMS,
    P_DUMMY_SHARE,
    P_FANOUT,
    P_GROWTH,
    P_KEYWORD_DP,
    P_KEYWORD_FANOUT,
    P_KL_CHECK_FRACTION,
    P_KL_MIN_SIZE,
    P_MAX_DEPTH,
    P_MAX_SPAN,
    P_MSG_SAMPLE,
    P_THETA_KL,
    P_THETA_P,
    SNODE,
    T_CNT,
    T_LI,
    T_NI,
)
from shard.aptree.maintain import delete_clauses, insert_clauses, rebuild_nodes
from shard.aptree.match import (
    DIRECT_MIN_CUTS,
    NO_LEAVES,
    PairRoom,
    direct_cuts,
    direct_leaves,
    match_kernel,
    pack_terms,
)
from shard.aptree.store import SubscriptionStore
from shard.aptree.vocab import VocabTable
from shard.errors import ValidationError
from shard.model import Message, Point, Subscription

KEYWORD_ORDERS = ("frequency", "rare-first", "alphabetical")
HOUSEKEEPING_EVERY = 64
"""Updates between two checks of pool garbage and of the KL size floor (each costs a few us)."""
COMPACT_MIN_GARBAGE = 1 << 16
"""Pool slots orphaned before a compaction is considered (it costs one pass over the tree)."""
COMPACT_GARBAGE_RATIO = 2
"""The pools are compacted once their orphaned slots outnumber the live ones this many times
(so they hold at most ``1 + COMPACT_GARBAGE_RATIO`` times what is live). Each promotion of a
wide root's dummy cut orphans the whole cut list (``maintain.promote_dummy``), so at 1 (the
first rule) a tree growing by subscribes compacted after nearly every promotion (~7 us an
insert on places); the twenty-first session's rule (garbage above *all* the used slots, which
include it) could never hold, and a tree of 200,000 grown one by one kept 39 million orphaned
cut slots (~1.1 GB). Chosen in the twenty-third session (docs/BENCHMARKS.md)."""
REBUILD_WHOLE_MIN = 1_000
REBUILD_WHOLE_MAX = 200_000
"""A tree grown by subscribes is rebuilt whole each time it has grown ``DEFAULT_GROWTH`` times
over (twice over from ``REBUILD_DOUBLING_FROM``), from ``REBUILD_WHOLE_MIN`` up to
``REBUILD_WHOLE_MAX`` subscriptions (``_whole_rebuild_due``); the shard pauses for each as long
as a whole build of that many (1.7 s for 200,000 real place names on the 2-core machine).
Beyond it, only when its root has grown so (its reconstruction, the whole tree's, is due
anyway); otherwise growth relies on the node-level maintenance."""
REBUILD_DOUBLING_FROM = 16_000
"""A tree last built whole with at least this many subscriptions is rebuilt whole at every
doubling (while it holds at most ``REBUILD_WHOLE_MAX``), not at every ``DEFAULT_GROWTH``-fold:
a tree grown fourfold since its last build matched 1.21-1.28 times as slowly as a fresh build
of the same subscriptions, twofold 1.15-1.18 (docs/BENCHMARKS.md). Smaller trees keep the
fourfold step: their builds cost mostly fixed costs (~30 ms at 5,000), and a cluster filling
up would pause for each, close together."""


_NO_DIRECT = (np.zeros(0, np.int32), -1)
LEAVES_AFTER = 64
"""A change makes the root's leaves-by-term table (``direct_leaves``) stale; it is made again
once messages numbering its terms / ``LEAVES_AFTER`` have been matched without it (making it
costs about what that many messages save), so a shard busy with subscribes does not remake it
every round."""
"""No direct table (``APTree.direct_table``)."""


@dataclass(frozen=True, slots=True)
class EncodedMessages:
    """A batch of messages as the kernels take it (CSR terms, kind 0 point / 1 rect, geometry)."""

    off: np.ndarray
    terms: np.ndarray
    kind: np.ndarray
    geom: np.ndarray

    def __len__(self) -> int:
        return int(self.kind.shape[0])


class APTree:
    """The AP-Tree over a dynamic set of subscriptions.

    Build with ``APTree.build(subs)`` (bulk path, Alg. 4), change with ``subscribe`` /
    ``unsubscribe`` (Sect. 3.3.5), query with ``match`` / ``match_batch`` (Alg. 1).
    """

    def __init__(
        self,
        *,
        fanout: int = DEFAULT_FANOUT,
        theta_p: int = DEFAULT_THETA_P,
        theta_kl: float = DEFAULT_THETA_KL,
        kl_min_fraction: float = DEFAULT_KL_MIN_FRACTION,
        keyword_partition: str = "heuristic",
        keyword_order: str | Sequence[str] = DEFAULT_KEYWORD_ORDER,
        keyword_fanout: int = DEFAULT_KEYWORD_FANOUT,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_span: int = DEFAULT_MAX_SPAN,
    ) -> None:
        if not isinstance(fanout, int) or fanout < 4:
            raise ValidationError("fanout", fanout, "must be an integer >= 4")
        if not isinstance(keyword_fanout, int) or not (keyword_fanout == 0 or keyword_fanout >= 2):
            raise ValidationError(
                "keyword_fanout", keyword_fanout, "must be 0 (unbounded) or an integer >= 2"
            )
        if not isinstance(max_span, int) or max_span < 1:
            raise ValidationError("max_span", max_span, "must be an integer >= 1")
        if not isinstance(theta_p, int) or theta_p < 1:
            raise ValidationError("theta_p", theta_p, "must be an integer >= 1")
        if not (theta_kl > 0):
            raise ValidationError("theta_kl", theta_kl, "must be > 0")
        if not (0 <= kl_min_fraction <= 1):
            raise ValidationError("kl_min_fraction", kl_min_fraction, "must be in [0, 1]")
        if keyword_partition not in ("heuristic", "optimal"):
            raise ValidationError(
                "keyword_partition", keyword_partition, "must be 'heuristic' or 'optimal'"
            )
        if isinstance(keyword_order, str) and keyword_order not in KEYWORD_ORDERS:
            raise ValidationError(
                "keyword_order",
                keyword_order,
                f"must be one of {KEYWORD_ORDERS} or a list of terms",
            )
        self.keyword_order = (
            keyword_order if isinstance(keyword_order, str) else list(keyword_order)
        )
        self.kl_min_fraction = kl_min_fraction
        self.store = SubscriptionStore()
        self._params = np.zeros(N_PARAMS)
        self._params[P_GROWTH] = DEFAULT_GROWTH
        self._params[P_DUMMY_SHARE] = DEFAULT_DUMMY_SHARE
        self._params[P_FANOUT] = fanout
        self._params[P_KEYWORD_FANOUT] = keyword_fanout
        self._params[P_THETA_P] = theta_p
        self._params[P_THETA_KL] = theta_kl
        self._params[P_KEYWORD_DP] = 1.0 if keyword_partition == "optimal" else 0.0
        self._params[P_MAX_DEPTH] = max_depth
        self._params[P_MAX_SPAN] = max_span
        self._params[P_KL_CHECK_FRACTION] = DEFAULT_KL_CHECK_FRACTION
        self._params[P_KL_MIN_SIZE] = theta_p
        self._pw = np.zeros(0)
        self._pw_new_term = 1.0
        self._spx = np.zeros(0)
        self._spy = np.zeros(0)
        self._changes = 0
        """Assignments of ``_tree``: every change of the tree's structure or leaves is one (the
        kernels that make them return the arrays, which their callers assign)."""
        self._tree = new_tree()
        self._term_stamp = np.zeros(1024, np.int64)
        self._sub_stamp = np.zeros(1024, np.int64)
        self._stamp = 0
        self._room = PairRoom()
        self._n_updates = 0
        self._built_size = 0
        self._follower: tuple[Callable, Callable] | None = None
        self._direct = _NO_DIRECT
        self._direct_key: tuple[int, int, int] | None = None
        self._leaves = NO_LEAVES
        self._leaves_at = -1  # the ``_changes`` it was made at
        self._leaves_owed = 1 << 40  # messages matched without it since it went stale (none
        # made yet: made for the first batch)
        self.verified = 0
        """Leaf entries verified by matching so far (the paper's cost measure)."""

    @property
    def _tree(self) -> tuple:
        return self._arrays

    @_tree.setter
    def _tree(self, T: tuple) -> None:
        self._arrays = T
        self._changes += 1

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        subs: Iterable[Subscription],
        *,
        message_sample: Iterable[Message] | None = None,
        **options,
    ) -> APTree:
        """Bulk-load ``subs`` (later ids replace earlier ones) and construct the tree.

        ``message_sample`` switches hit probabilities from the subscription workload to the
        sample's keyword and location frequencies. O(n log n · depth).
        """
        tree = cls(**options)
        tree.store.add_bulk(subs)
        tree.rebuild(message_sample=message_sample)
        return tree

    def rebuild(self, *, message_sample: Iterable[Message] | None = None) -> None:
        """Construct the whole tree anew from the live subscriptions (fresh keyword order too)."""
        store = self.store
        self._built_size = len(store)
        self._terms_renumbered(store.reorder_terms(self.keyword_order, self._terms_held()))
        if message_sample is not None:
            sample = list(message_sample)
            df = np.zeros(len(store.vocab_terms), np.float64)
            xs, ys = [], []
            for m in sample:
                ids = store.encode_terms(m.terms)
                df[ids] += 1.0
                x, y = _centre(m)
                xs.append(x)
                ys.append(y)
            n = max(len(sample), 1)
            self._pw = (df + 0.5) / (n + 1.0)
            self._pw_new_term = 0.5 / (n + 1.0)
            self._spx = np.asarray(xs, np.float64)
            self._spy = np.asarray(ys, np.float64)
            self._params[P_MSG_SAMPLE] = 1.0
        else:
            self._pw_new_term = 1.0
            # a term no subscription holds yet (the ids reserved for new terms) counts as one
            self._pw = np.maximum(store.term_frequencies(), 1).astype(np.float64)
            self._spx = np.zeros(0)
            self._spy = np.zeros(0)
            self._params[P_MSG_SAMPLE] = 0.0
        live = store.live_clauses()
        # let the old tree go before the new one is built: the peak is one tree, not two
        # (at 10M subscriptions 8.2 against 12.1 GB, docs/BENCHMARKS.md)
        self._tree = None
        T = new_tree(
            node_cap=max(1024, live.size // 8),
            ch_cap=max(4096, live.size // 2),
            li_cap=max(4096, 2 * live.size),
        )
        init_node(T, 0, -1, 0, 1, 1, 0, -180.0, -90.0, 180.0, 90.0)
        T, total = build_subtree(
            T, store.columns(), self._pw, self._spx, self._spy, self._params, 0, live
        )
        self._tree = T
        self._relayout()
        self._update_kl_min()
        self._ensure_stamps()

    def _relayout(self) -> None:
        """Number subscriptions and clauses in the order the leaves hold them (first occurrence),
        so that the store rows a leaf's verifications still read (long clauses, circles, the
        per-subscription stamp) are neighbours instead of random ones."""
        T, store = self._tree, self.store
        if not len(store):
            return
        pool = T[T_LI][
            : int(T[T_CNT][C_LI])
        ]  # a fresh build leaves no garbage: -1 or a live clause
        used = pool >= 0
        slots = store.cl_sub[pool[used]]
        _, first = np.unique(slots, return_index=True)
        new_of_old = store.relayout(slots[np.sort(first)])
        pool[used] = new_of_old[pool[used]]
        refresh_leaf_entries(T, store.columns())  # the records name slots: renumbered too

    def _terms_renumbered(self, new_id: np.ndarray) -> None:
        """Hook: term ids were renumbered (``new_id[old]``); the AP+-Tree rewrites its messages,
        an index built around the tree is told (``follow_terms``)."""
        if self._follower is not None:
            self._follower[0](new_id)

    def _terms_held(self) -> np.ndarray | None:
        """Hook: a mask of the term ids something besides the subscriptions holds (the AP+-Tree's
        live messages), kept by a whole rebuild although no subscription has them."""
        return None if self._follower is None else self._follower[1]()

    # ---- for an index built around the tree (``shard.naive_moving``) -------------------------
    def follow_terms(
        self, renumbered: Callable[[np.ndarray], None], held: Callable[[], np.ndarray]
    ) -> None:
        """Let something that holds term ids too (live messages) follow the tree's: a whole
        rebuild calls ``renumbered(new_id)`` with ``new_id[old]``, and keeps the ids ``held()``
        masks although no subscription has them."""
        self._follower = (renumbered, held)

    @property
    def arrays(self) -> tuple:
        """The tree's columns (``shard.aptree.layout``), for a compiled kernel to maintain and
        hand back to ``adopt``."""
        return self._tree

    @property
    def params(self) -> np.ndarray:
        """The tree's parameters (``layout.P_*``), as its kernels read them."""
        return self._params

    def reserve(self) -> None:
        """Size the per-term and per-subscription columns to the store's vocabulary and slots:
        before a compiled call that reads them for terms or subscriptions added since."""
        self._extend_pw()
        self._ensure_stamps()

    def adopt(self, T: tuple, todo: np.ndarray, updates: int = 1) -> None:
        """Take the columns a maintenance kernel returned (pools may have grown), reconstruct
        the nodes it flagged, and count ``updates`` toward housekeeping."""
        self._tree = T
        if todo.size:
            self._rebuild_nodes(todo)
        self._housekeeping(updates)

    # ---- maintenance ------------------------------------------------------------------------
    def subscribe(self, sub: Subscription) -> None:
        """Add ``sub``, replacing a subscription with the same id. O(depth + cells touched) amortised.

        >>> from shard.model import Rect
        >>> t = APTree()
        >>> t.subscribe(Subscription("a", (("x",),), Rect(0, 0, 1, 1)))
        >>> len(t)
        1
        """
        if sub.id in self.store.slot_of:
            self.unsubscribe(sub.id)
        _, clauses = self.store.add(sub)
        self._extend_pw()
        self._ensure_stamps()
        T, todo, _, _ = insert_clauses(self._tree, self.store.columns(), self._params, clauses)
        self._tree = T
        if self._whole_rebuild_due():
            self.rebuild()
        elif todo.size:
            self._rebuild_nodes(todo)
        self._housekeeping()

    def _whole_rebuild_due(self) -> bool:
        """After insertions: whether to rebuild the whole tree (``rebuild``: a fresh keyword order
        too) instead of the nodes they flagged: it holds ``P_GROWTH`` times (twice, from
        ``REBUILD_DOUBLING_FROM``) what it held at its last whole build, between
        ``REBUILD_WHOLE_MIN`` and ``REBUILD_WHOLE_MAX`` subscriptions; or, from
        ``REBUILD_WHOLE_MIN`` up at any size, its root's entries grew so, and the root's
        reconstruction, i.e. the whole tree's, is due anyway: then with a fresh order too. A tree
        grown by subscribes otherwise keeps the order of the terms' arrival (a new term goes
        last, as if it were the commonest: a clause is filed under an older, commoner term) and
        the kinds of node chosen while it was small. Amortised: g / (g - 1) whole builds over
        the growth."""
        n = len(self.store)
        if n < REBUILD_WHOLE_MIN:
            return False
        NI = self._tree[T_NI]
        root = int(self._tree[T_CNT][C_ROOT])
        # the root's entries count a clause once per s-node cell it is in: they may grow first
        g = self._params[P_GROWTH]
        if NI[root, F_SIZE] >= g * NI[root, F_NBUILT]:
            return True
        if self._built_size >= REBUILD_DOUBLING_FROM:
            g = min(g, 2.0)
        return n <= REBUILD_WHOLE_MAX and n >= g * self._built_size

    def unsubscribe(self, sub_id: str) -> None:
        """Remove the subscription ``sub_id`` (NotFoundError if unknown). O(depth + leaf size)."""
        slot = self.store.slot(sub_id)
        clauses = self.store.clauses_of(slot)
        T, todo, _ = delete_clauses(self._tree, self.store.columns(), self._params, clauses)
        self._tree = T
        if todo.size:
            self._rebuild_nodes(todo)
        self._housekeeping()
        self.store.remove(sub_id)

    def _rebuild_nodes(self, todo: np.ndarray) -> None:
        T, _ = rebuild_nodes(
            self._tree, self.store.columns(), self._pw, self._spx, self._spy, self._params, todo
        )
        self._tree = T

    @property
    def rebuilds(self) -> int:
        """Subtrees rebuilt so far (leaf splits, KL reconstructions, collapses)."""
        return int(self._tree[T_CNT][C_REBUILDS])

    def _housekeeping(self, n: int = 1) -> None:
        """After ``n`` updates: every ``HOUSEKEEPING_EVERY`` updates, compact the pools if garbage
        dominates and refresh the KL size floor (0.1 % of the entries)."""
        before = self._n_updates
        self._n_updates += n
        if self._n_updates // HOUSEKEEPING_EVERY != before // HOUSEKEEPING_EVERY:
            self._compact_if_needed()
            self._update_kl_min()

    def _compact_if_needed(self) -> None:
        CNT = self._tree[T_CNT]
        # leaf moves, rebuilds and promotions orphan pool slices (counted among the used ones);
        # copy the live ones once the garbage outgrows them (``COMPACT_GARBAGE_RATIO``)
        garbage = int(CNT[C_GARBAGE])
        live = int(CNT[C_LI] + CNT[C_CH]) - garbage
        if garbage > max(COMPACT_MIN_GARBAGE, COMPACT_GARBAGE_RATIO * live):
            self.compact_pools()

    def compact_pools(self) -> None:
        """Copy the live slices of the pools into fresh arrays now, dropping the orphaned ones
        (what housekeeping does once they outnumber the live ones ``COMPACT_GARBAGE_RATIO``
        times). Node ids do not change. O(nodes + live slots).

        >>> t = APTree(); t.compact_pools(); t.stats()["garbage_slots"]
        0
        """
        self._tree = compact(self._tree)

    def _extend_pw(self) -> None:
        v = len(self.store.vocab_terms)
        if v > self._pw.shape[0]:
            extra = np.full(
                max(v - self._pw.shape[0], self._pw.shape[0] // 2 + 16), self._pw_new_term
            )
            self._pw = np.concatenate((self._pw, extra))

    def _update_kl_min(self) -> None:
        size = int(self._tree[T_NI][int(self._tree[T_CNT][C_ROOT]), F_SIZE])
        self._params[P_KL_MIN_SIZE] = max(self._params[P_THETA_P], self.kl_min_fraction * size)

    def _ensure_stamps(self) -> None:
        v = len(self.store.vocab_terms)
        if v > self._term_stamp.shape[0]:
            self._term_stamp = np.zeros(max(v, 2 * self._term_stamp.shape[0]), np.int64)
        n = self.store.n_slots
        if n > self._sub_stamp.shape[0]:
            self._sub_stamp = np.zeros(max(n, 2 * self._sub_stamp.shape[0]), np.int64)

    def direct_table(self, n_messages: int = 0) -> tuple[np.ndarray, int, np.ndarray]:
        """(direct table, its node, its leaves by term) for the kernels
        (``shard.aptree.match``): the root's, when the root is a k-node of at least
        ``DIRECT_MIN_CUTS`` cuts. The direct table is re-made when the root, its cut slice or
        its cut count changed, or when the last match found it stale (the kernel checks it);
        the leaves by term are handed over only while nothing changed since they were made
        (the kernel trusts them), and made again once ``LEAVES_AFTER`` says (``n_messages``:
        the batch about to be matched)."""
        T = self._tree
        NI = T[T_NI]
        root = int(T[T_CNT][C_ROOT])
        key = (root, int(NI[root, F_CHOFF]), int(NI[root, F_NCH]))
        if key != self._direct_key:
            wide = NI[root, F_TYPE] == KNODE and key[2] >= DIRECT_MIN_CUTS
            self._direct = (direct_cuts(T, root), root) if wide else _NO_DIRECT
            self._direct_key = key
        table, node = self._direct
        if node < 0:
            return table, node, NO_LEAVES
        if self._leaves_at != self._changes:
            self._leaves_owed += n_messages
            if self._leaves_owed * LEAVES_AFTER < table.shape[0]:
                return table, node, NO_LEAVES
            self._leaves = direct_leaves(T, self.store.columns(), node)
            self._leaves_at = self._changes
            self._leaves_owed = 0
        return table, node, self._leaves

    def _direct_missed(self, misses: int) -> None:
        """The kernel found the direct table stale ``misses`` times: re-make it next time."""
        if misses:
            self._direct_key = None

    # ---- matching ---------------------------------------------------------------------------
    def encode(self, messages: Sequence[Message]) -> EncodedMessages:
        """Messages to kernel arrays (``encode_messages`` over this tree's vocabulary)."""
        return encode_messages(messages, self.store.vocab_table())

    def match_encoded(self, batch: EncodedMessages) -> tuple[np.ndarray, np.ndarray]:
        """(message index, subscription slot) for every match in the batch; compiled. Each
        subscription appears at most once per message."""
        self._ensure_stamps()
        out_m, out_s, self._stamp, verified, misses = match_kernel(
            self._tree,
            self.store.columns(),
            self._term_stamp,
            self._sub_stamp,
            self._stamp,
            batch.off,
            batch.terms,
            batch.kind,
            batch.geom,
            *self.direct_table(len(batch.kind)),
            self._room.room(len(batch.kind)),
        )
        self._room.saw(len(batch.kind), len(out_m))
        self.verified += int(verified)
        self._direct_missed(misses)
        return out_m, out_s

    def match_batch(self, messages: Sequence[Message]) -> list[list[str]]:
        """The ids of the subscriptions each message matches, in batch order.

        >>> APTree().match_batch([])
        []
        """
        out_m, out_s = self.match_encoded(self.encode(messages))
        return self.ids_of(len(messages), out_m, out_s)

    def ids_of(self, n: int, out_m: np.ndarray, out_s: np.ndarray) -> list[list[str]]:
        """``match_encoded``'s pairs of a batch of ``n`` messages as each message's ids."""
        return ids_by_message(self.store.ids, n, out_m, out_s)

    def match(self, message: Message) -> list[str]:
        """The ids of the subscriptions ``message`` matches (order unspecified)."""
        return self.match_batch([message])[0]

    # ---- introspection ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.store.slot_of

    def stats(self) -> dict[str, int]:
        """Node counts by type, leaf entries, depth, pool usage."""
        T = self._tree
        NI, CNT = T[T_NI], T[T_CNT]
        n = int(CNT[C_NODES])
        types = NI[:n, F_TYPE]
        live = types >= 0
        return {
            "subscriptions": len(self.store),
            "clauses": int((self.store.cl_sub[: self.store.n_clause_rows] >= 0).sum()),
            "nodes": int(live.sum()),
            "k_nodes": int((types == KNODE).sum()),
            "s_nodes": int((types == SNODE).sum()),
            "leaves": int((types == LEAF).sum()),
            "entries": int(NI[:n, F_LLEN][types == LEAF].sum()),
            "depth": int(NI[:n, F_DEPTH][live].max()) if n else 0,
            "free_nodes": int(CNT[C_FREE]),
            "child_slots": int(CNT[C_CH]),
            "leaf_slots": int(CNT[C_LI]),
            "garbage_slots": int(CNT[C_GARBAGE]),
            "rebuilds": int(CNT[C_REBUILDS]),
            "promotions": int(CNT[C_PROMOTIONS]),
        }

    def check_invariants(self) -> None:
        """Assert every structural invariant (see ``shard.aptree.check``)."""
        check_tree(self)


def encode_messages(messages: Sequence[Message], vocab: VocabTable) -> EncodedMessages:
    """Messages to kernel arrays: known term ids (``vocab``) ascending and de-duplicated,
    unknown terms dropped (they cannot match). O(terms): the batch's terms looked up in one
    compiled call (``VocabTable``), the packing compiled too. Shared by every index that takes
    ``EncodedMessages``.

    >>> from shard.model import Rect
    >>> v = VocabTable(); v.add(["b", "a"], [0, 1])
    >>> e = encode_messages([Message("m", ("b", "a", "zz"), Rect(0, 0, 1, 1))], v)
    >>> e.terms.tolist(), e.kind.tolist()
    ([0, 1], [1])
    """
    n = len(messages)
    term_lists = [m.terms for m in messages]
    lens = np.fromiter(map(len, term_lists), np.int64, n)
    ids = vocab.lookup_lists(term_lists, int(lens.sum()))
    locs = [m.location for m in messages]
    kind = np.fromiter([type(loc) is not Point for loc in locs], np.int8, n)
    geom = np.fromiter(
        chain.from_iterable(
            (loc.lon, loc.lat, loc.lon, loc.lat)
            if type(loc) is Point
            else (loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat)
            for loc in locs
        ),
        np.float64,
        4 * n,
    ).reshape(n, 4)
    off, terms = pack_terms(ids, lens)
    return EncodedMessages(off, terms, kind, geom)


def ids_by_message(
    ids: np.ndarray, n: int, out_m: np.ndarray, out_s: np.ndarray
) -> list[list[str]]:
    """(message index ascending, slot) pairs as the id lists of ``n`` messages, ``ids`` the
    slots' ids (an object array). Shared by every index that matches ``EncodedMessages``.

    >>> ids_by_message(np.array(["a", "b", "c"], object), 3, np.array([0, 0, 2]), np.array([2, 0, 1]))
    [['c', 'a'], [], ['b']]
    """
    names = ids[out_s].tolist()
    bounds = np.searchsorted(out_m, np.arange(n + 1)).tolist()
    return [names[bounds[i] : bounds[i + 1]] for i in range(n)]


def _centre(m: Message) -> tuple[float, float]:
    loc = m.location
    if isinstance(loc, Point):
        return loc.lon, loc.lat
    return (loc.min_lon + loc.max_lon) / 2.0, (loc.min_lat + loc.max_lat) / 2.0
