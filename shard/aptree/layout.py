"""Array layout of the AP-Tree: node fields, pool indices and the tuning defaults.

The tree lives in a handful of numpy arrays (a "tree tuple") so that numba kernels can build,
walk and mutate it without Python objects per node:

* ``NI[node, field]`` int64 node fields (below), ``NF[node, 0:4]`` the node's region;
* ``CH`` child node per cut/cell, ``CLO``/``CHI`` the keyword interval of each k-node cut,
  ``WOLD``/``WCUR`` the weight of each cut/cell at construction / now (for KL divergence),
  all four aligned with ``CH``;
* ``BND`` the s-node grid boundaries (``NX + 1`` x values then ``NY + 1`` y values);
* ``LI`` the s-lists of the leaves (clause ids), each leaf a ``[LOFF, LOFF + LCAP)`` slice;
* ``LB`` each leaf entry's record, aligned with ``LI``: the clause's exact box, its subscription
  slot, region kind and terms (the ``LB_*`` columns below), so that verifying an entry reads
  its leaf's slice and not the subscription store (float64: boxes exact, ids exact below 2^53);
* ``FREE`` recycled node ids; ``CNT`` counters (below).
"""

from __future__ import annotations

# ---- node types -------------------------------------------------------------------------
LEAF = 0
KNODE = 1
SNODE = 2
FREED = -1

# ---- NI fields --------------------------------------------------------------------------
F_TYPE = 0
# the fields a match visit reads come first, so that a visit touches one or two cache lines
F_L = 1  # keyword offset: a k-node partitions on each clause's term number L (0-based)
F_LOFF = 2
F_LLEN = 3
F_DUMMY = 4  # dummy cut / dummy cell child, -1 when absent
F_CHOFF = 5
F_NCH = 6
F_BOFF = 7
F_NX = 8
F_NY = 9
F_KP = 10  # may this subtree still partition by keyword?
F_SP = 11  # ... by space?
F_PARENT = 12
F_SIZE = 13  # leaf entries in the subtree (a clause replicated over cells counts per cell)
F_LCAP = 14
F_WD_OLD = 15  # dummy weight at construction
F_WD_CUR = 16  # dummy weight now
F_NUPD = 17  # updates routed through the node since its last KL check
F_DEPTH = 18
F_NBUILT = 19  # F_SIZE when the node was (re)built
N_FIELDS = 20

# ---- LB: one leaf entry's record --------------------------------------------------------
# LB is float64 [slots, LB_WIDTH]: columns 0-3 the clause's exact box; the rest is read as int32
# through ``LB.view(np.int32)`` (twice as many columns), from int32 column LBI_SLOT on.
LB_X0, LB_Y0, LB_X1, LB_Y1 = 0, 1, 2, 3  # the clause's box (its subscription's region box)
LB_WIDTH = 8
LBI_SLOT = 8  # the subscription's slot in the store
LBI_KIND = 9  # its region kind (shard.geometry.KIND_*) | LBK_MULTI
LBK_KIND = 0xFF  # the LBI_KIND bits holding the region kind
LBK_MULTI = 1 << 8  # the subscription has several clauses (shard.aptree.match: the stamp)
LBI_NT = 10  # the clause's number of terms
LBI_T = 11  # its first term id; LB_INLINE_TERMS of them (a longer clause: the store's)
LB_INLINE_TERMS = 2 * LB_WIDTH - LBI_T

# ---- tree tuple indices -----------------------------------------------------------------
T_NI, T_NF, T_CH, T_CLO, T_CHI, T_WOLD, T_WCUR, T_BND, T_LI, T_FREE, T_CNT, T_LB = range(12)

# ---- CNT counters -----------------------------------------------------------------------
C_NODES = 0  # node ids handed out (high-water mark)
C_CH = 1  # used length of CH/CLO/CHI/WOLD/WCUR
C_BND = 2
C_LI = 3
C_FREE = 4  # ids on the FREE stack
C_ROOT = 5
C_GARBAGE = 6  # pool slots orphaned by rebuilds and leaf moves
C_REBUILDS = 7  # KL-triggered subtree reconstructions
C_SPLITS = 8  # leaf splits
C_COLLAPSES = 9
C_PROMOTIONS = 10  # k-node dummies promoted to cuts instead of rebuilding the k-node
N_COUNTERS = 11

# ---- parameter vector indices (float64 array handed to the kernels) --------------------
P_FANOUT = 0
P_THETA_P = 1
P_THETA_KL = 2
P_KL_MIN_SIZE = 3  # absolute entry count below which a node is never KL-rebuilt
P_KEYWORD_DP = 4  # 1.0: optimal DP keyword partition (Alg. 2), 0.0: heuristic (Alg. 3)
P_MAX_DEPTH = 5
P_MSG_SAMPLE = 6  # 1.0: hit probabilities come from a message sample
P_KL_CHECK_FRACTION = 7
P_MAX_SPAN = 8  # an s-node sends a region meeting more cells than this to its dummy cell
P_GAP_TO_DUMMY = 9  # 1.0: an inserted clause whose L-th keyword lies between cuts goes to the
# dummy cut instead of widening the cut before it. The AP+-Tree needs this: a message's path never
# changes after it was stored, so a widened cut would miss the messages stored before.
P_MOVE_COST = 10  # 1.0: add the moving penalty Cslu + Circ (Eq. 9, 13) to s-node costs
P_MSG_RATE = 11  # r_m, messages per second (Eq. 7), when P_MOVE_COST is on
P_KEYWORD_FANOUT = 12  # cuts per k-node at most; 0: one cut per distinct keyword
P_GROWTH = 13  # a k-node grown this many times its size at construction is reconstructed whole
P_DUMMY_SHARE = 14  # a one-cut-per-keyword k-node promotes its dummy once this share of its cut
# count (at least θp) of clauses went there since it was built or last promoted
N_PARAMS = 15

MOVE_SIM_STEPS = 32
"""T_max of Alg. 8: update intervals simulated ahead when estimating TΔ."""

# ---- defaults ---------------------------------------------------------------------------
DEFAULT_FANOUT = 200
"""f, cells per s-node (s-nodes use a floor(sqrt f) square grid), and cuts per k-node when
``keyword_fanout`` is set to it. The paper's tuned value (Sect. 5.1.2, Fig. 10a)."""

DEFAULT_KEYWORD_FANOUT = 0
"""Cuts per k-node at most; 0 (the default): unbounded, one cut per distinct keyword, which
Eq. 1 always prefers (a cut's cost w(B) p(B) only falls when it is split). The paper bounds both
kinds of node by f; bounded k-nodes put the clauses of many keywords behind one cut, and every
message term that falls in the cut's interval then visits them. Measured in docs/BENCHMARKS.md:
at 1M subscriptions the kernel took 2.9x less time on real place names, 1.6x less on
a Zipf workload, 1.2x less on the default one."""

DEFAULT_KEYWORD_ORDER = "rare-first"
"""The global keyword order (k-nodes partition on a clause's l-th keyword in it): increasing
frequency, so that the first partition files each clause under its rarest keyword, as the
keyword-first inverted list does. The paper's default is decreasing frequency (Sect. 5.1.1),
which files a clause under its commonest keyword; measured in docs/BENCHMARKS.md."""

DEFAULT_THETA_P = 160
"""θp, a node with fewer subscriptions is a leaf. The paper's value is 40 (Sect. 5.1.2, Fig.
10b); with leaf entries carrying their records and the kernel loading leaves ahead
(``shard.aptree.match``), visiting a node costs several verifications, and 160 matched faster
on every 1M workload measured: kernel −10 % on places, −13 % on Zipf, level to −10 % on the
default workload; 80, 120 and 240 in between or level; 20 slower; inserts one by one +20 %
(docs/BENCHMARKS.md, twenty-third session; docs/APTREE.md, departure 15)."""

DEFAULT_THETA_KL = 0.001
"""θKL, KL-divergence of a node's cut/cell weights that triggers its reconstruction (paper)."""

DEFAULT_KL_MIN_FRACTION = 0.001
"""Only subtrees holding at least this share of all entries (0.1 %) are KL-checked."""

DEFAULT_KL_CHECK_FRACTION = 0.05
"""A node's KL divergence is recomputed after updates amounting to this share of its size
(at least θp updates): the check costs O(f), so this amortises it to O(f / (0.05 size)) per update."""

DEFAULT_MAX_SPAN = 4
"""An s-node stores a subscription in every cell its region meets, unless it meets more than this
many cells: then it goes to the dummy cell with the regions that contain the node (and is
partitioned by keyword only below). Matching stays exact since leaves verify every region; the
bound keeps replication, memory and update cost in check (see docs/BENCHMARKS.md)."""

DEFAULT_DUMMY_SHARE = 1.0 / 1024
"""A k-node with one cut per keyword promotes its dummy cut (``maintain.promote_dummy``) once
clauses numbering this share of its cuts (θp at least) have gone to the dummy since it was built
or last promoted. Every message visits the dummy (a space-only subtree), so a dummy left to grow
is paid by every message: 20,000 real place names added to a tree of 180,000 left 5,313 clauses
in the root's dummy and the grown tree verified 6.7x the entries a fresh one does. A promotion
copies the k-node's cut list: the share bounds that copy to ~1/share cuts per clause added."""

DEFAULT_GROWTH = 4.0
"""A tree grown by subscribes is rebuilt whole (fresh keyword order) each time it has grown this
many times over (``APTree._whole_rebuild_due``), and a k-node that has is reconstructed whole
instead of promoting its dummy (``maintain._promotable``). 4 rather than 2: half the insert
cost (22 against 44 us in process, places grown from 100 to 200,000) for the same matching
speed of the grown tree (docs/BENCHMARKS.md)."""

DEFAULT_MAX_DEPTH = 32
"""Safety bound on tree depth; a node this deep is a leaf whatever the cost model says."""

DEFAULT_DP_MAX_KEYWORDS = 2048
"""The optimal keyword partition (Alg. 2) costs O(f |V|^2); at nodes with more distinct keywords
than this the heuristic (Alg. 3) is used instead."""

DEFAULT_SPATIAL_CANDIDATES = 512
"""The spatial heuristic tries at most this many boundary positions per boundary and pass."""
