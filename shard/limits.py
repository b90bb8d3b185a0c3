"""Explicit limits on every input, documented in docs/LIMITS.md; validation enforces them."""

MAX_ID_LEN = 128
"""Subscription and message ids: 1-128 printable characters."""

MAX_KEYWORDS = 16
"""Terms in a ``keywords`` condition (all must occur)."""

MAX_CLAUSES = 64
"""DNF clauses an ``expr`` may expand to."""

MAX_CLAUSE_TERMS = 16
"""Terms in one DNF clause (the positive ones: those the indexes file it under)."""

MAX_CLAUSE_NEGATIONS = 16
"""Negated terms (``NOT x``) in one DNF clause, checked where the clause is verified."""

MAX_EXPR_LEN = 4096
"""Characters of an ``expr``."""

MAX_EXPR_DEPTH = 32
"""Parentheses nested in an ``expr``. The parser recurses three Python frames per level, so an
unbounded depth hits Python's recursion limit (1,000 frames) at about 330 levels (a
RecursionError, not an error naming the field). 32 keeps the parser far from it; a level that is
not redundant needs an OR inside and another factor beside it, so one within ``MAX_CLAUSE_TERMS``
and ``MAX_CLAUSES`` rarely nests half as deep."""

MAX_TERM_LEN = 64
"""Characters of one normalized term."""

MAX_MESSAGE_TERMS = 256
"""Distinct terms of a message after normalization (keywords plus text tokens)."""

MAX_TEXT_LEN = 16384
"""Characters of a message's ``text``."""

MAX_TTL_S = 30 * 86_400.0
"""Longest ``ttl`` of a stored message, seconds (30 days). A live message holds memory in the
coordinator and in every shard it reaches until it expires, and no restart keeps it
(docs/LIMITS.md), so a ttl of years (1e308 was accepted) only pins memory; 30 days is a generous
ceiling for a geo-tagged message. A cluster sets a lower one (``max_ttl_s``, a day by default)."""

MAX_RADIUS_M = 20_000_000.0
"""Largest circle radius, metres (about half the earth's circumference)."""

BBOX_MARGIN_DEG = 1e-7
"""Circles and polygons are indexed by a bounding box widened by this many degrees (about 1 cm),
so that rounding in the box arithmetic (a circle's box, a moved polygon's offset) can never
exclude a point the exact test accepts."""

EARTH_RADIUS_M = 6_371_008.8
"""Mean earth radius of the sphere on which circle distances are measured (haversine)."""

MAX_SUBSCRIBE_BATCH = 1_000
"""Subscriptions in one SubscribeRequest's ``subscriptions`` (ids in one UnsubscribeRequest's
``ids``). A batch is written to Redis in one transaction, which holds Redis for every other
client while it runs: ~2 commands a subscription, a few ms at this size."""

MAX_PUBLISH_BATCH = 10_000
"""Messages in one PublishRequest's ``messages``."""

MAX_MOVE_BATCH = 10_000
"""Moves in one UpdateLocationRequest's ``moves``."""

MAX_POLYGON_VERTICES = 1024
"""Positions of a subscription's polygon, over all its rings, closing positions included. Each
exact test of a message against it walks every edge (~1 ns an edge, compiled: ~1 us at this
size), and validation at subscribe time runs GEOS over the whole polygon (~0.1 ms at 1,000
positions for a plain outline, ~1.5 ms for a very spiky one)."""

MAX_POLYGON_RINGS = 64
"""Rings of a subscription's polygon: its exterior and up to 63 holes."""

MAX_TOP_K = 1000
"""The largest k of a top-k publish (``PublishRequest.top_k``; paper 001)."""
