"""Boolean keyword expressions (``ipad AND (discount OR sale) AND NOT refurbished``) parsed into
bounded DNF.

Grammar (operators case-insensitive; NOT binds tightest, then AND, then OR; adjacent factors
mean AND)::

    expr   := and ("OR" and)*
    and    := factor ("AND"? factor)*
    factor := "NOT" factor | TERM | "(" expr ")"
    TERM   := a run of \\w characters other than the words AND, OR, NOT

A clause of the DNF is a set of literals: terms that must occur (positive) and terms that must
not (negated). ``NOT`` is pushed inward by De Morgan's laws (``NOT (a OR b)`` = ``NOT a AND NOT
b``; ``NOT (a AND b)`` = ``NOT a OR NOT b``), a clause holding a term and its negation is dropped
(it can never hold), and a clause holding another is dropped (absorption). Each remaining clause
needs at least one positive term: the indexes file a clause under its positive terms and check
the negated ones where they verify it, and a clause of negations only would match nearly every
message.
"""

from __future__ import annotations

import re

from shard.errors import ExpressionError
from shard.limits import (
    MAX_CLAUSE_NEGATIONS,
    MAX_CLAUSE_TERMS,
    MAX_CLAUSES,
    MAX_EXPR_DEPTH,
    MAX_EXPR_LEN,
    MAX_TERM_LEN,
)
from shard.terms import normalize_term

DNF = tuple[tuple[str, ...], ...]
Negated = tuple[tuple[str, ...], ...] | None
"""Per clause of a DNF, the terms that must not occur (aligned with the clauses); None when the
condition has no NOT."""
Literal = tuple[str, bool]  # (term, positive)
Clause = frozenset[Literal]
_TOKEN = re.compile(r"\s*(?:(\()|(\))|(\w+)|(\S))")


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, value, position) with kind in ( ) AND OR TERM."""
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # only trailing whitespace is left
            break
        lp, rp, word, other = m.groups()
        start = m.start(m.lastindex)
        if other is not None:
            raise ExpressionError(
                "expr", text, f"unexpected character {other!r} at position {start}"
            )
        if lp:
            out.append(("(", lp, start))
        elif rp:
            out.append((")", rp, start))
        else:
            up = word.upper()
            if up in ("AND", "OR", "NOT"):
                out.append((up, word, start))
            else:
                term = normalize_term(word)
                if len(term) > MAX_TERM_LEN:
                    raise ExpressionError(
                        "expr",
                        text,
                        f"term at position {start} longer than {MAX_TERM_LEN} characters",
                    )
                out.append(("TERM", term, start))
        pos = m.end()
    return out


def _check_depth(text: str, toks: list[tuple[str, str, int]]) -> None:
    """Reject parentheses nested deeper than ``MAX_EXPR_DEPTH`` before the recursive parser
    sees them (chains of AND / OR are parsed in loops and need no bound). O(tokens)."""
    depth = 0
    for kind, _, start in toks:
        if kind == "(":
            depth += 1
            if depth > MAX_EXPR_DEPTH:
                raise ExpressionError(
                    "expr",
                    text,
                    f"parentheses nested more than {MAX_EXPR_DEPTH} deep at position {start}",
                )
        elif kind == ")" and depth:
            depth -= 1


def _absorb(clauses: set[Clause]) -> set[Clause]:
    """Drop clauses that are supersets of another clause (they can never add a match)."""
    ordered = sorted(clauses, key=len)
    kept: list[Clause] = []
    for c in ordered:
        if not any(k <= c for k in kept):
            kept.append(c)
    return set(kept)


def parse_expr(text: str) -> DNF:
    """Parse a condition without NOT into DNF: sorted clauses of sorted unique normalized terms
    (``parse_condition`` for one that may hold NOT).

    >>> parse_expr("ipad AND (discount OR sale)")
    (('discount', 'ipad'), ('ipad', 'sale'))
    >>> parse_expr("a b OR a")
    (('a',),)
    """
    clauses, negated = parse_condition(text)
    if negated is not None:
        raise ExpressionError("expr", text, "NOT here is not supported (parse_condition)")
    return clauses


def parse_condition(text: str) -> tuple[DNF, Negated]:
    """Parse ``text`` into DNF: (the clauses' positive terms, sorted clauses of sorted unique
    normalized terms; per clause the negated terms, or None when the expression has no NOT).
    Clauses are ordered by (positive, negated) terms; two clauses may share their positive
    terms when their negations differ.

    Raises ExpressionError (field ``expr``) naming the problem and its position; parentheses
    nest at most ``MAX_EXPR_DEPTH`` deep. O(tokens · clauses²), the clauses bounded.

    >>> parse_condition("coffee AND NOT starbucks")
    ((('coffee',),), (('starbucks',),))
    >>> parse_condition("(a OR b) AND NOT (c OR d)")
    ((('a',), ('b',)), (('c', 'd'), ('c', 'd')))
    >>> parse_condition("a AND NOT (b AND c)")
    ((('a',), ('a',)), (('b',), ('c',)))
    """
    if not isinstance(text, str):
        raise ExpressionError("expr", text, "must be a string")
    if len(text) > MAX_EXPR_LEN:
        raise ExpressionError("expr", text, f"longer than {MAX_EXPR_LEN} characters")
    toks = _tokens(text)
    if not toks:
        raise ExpressionError("expr", text, "empty expression")
    _check_depth(text, toks)
    pos = 0

    def peek() -> tuple[str, str, int] | None:
        return toks[pos] if pos < len(toks) else None

    def fail(reason: str) -> ExpressionError:
        return ExpressionError("expr", text, reason)

    def where() -> str:
        t = peek()
        return f"position {t[2]}" if t else "end of expression"

    def bound(clauses: set[Clause]) -> set[Clause]:
        clauses = _absorb(clauses)
        if len(clauses) > MAX_CLAUSES:
            raise fail(f"expands to more than {MAX_CLAUSES} DNF clauses")
        return clauses

    def product(left: set[Clause], right: set[Clause]) -> set[Clause]:
        """AND of two DNFs: every pair of clauses joined, contradictions dropped."""
        out: set[Clause] = set()
        for a in left:
            for b in right:
                c = a | b
                pos_n = sum(1 for _, positive in c if positive)
                if pos_n > MAX_CLAUSE_TERMS:
                    raise fail(f"a clause has more than {MAX_CLAUSE_TERMS} terms")
                if len(c) - pos_n > MAX_CLAUSE_NEGATIONS:
                    raise fail(f"a clause has more than {MAX_CLAUSE_NEGATIONS} negated terms")
                if any((term, not positive) in c for term, positive in c):
                    continue  # t AND NOT t: never holds
                out.add(c)
                if len(out) > MAX_CLAUSES * 4:
                    raise fail(f"expands to more than {MAX_CLAUSES} DNF clauses")
        return bound(out)

    def negate(dnf: set[Clause]) -> set[Clause]:
        """NOT of a DNF, by De Morgan: the AND over its clauses of the OR of their negated
        literals, expanded back to DNF."""
        result: set[Clause] = {frozenset()}  # true
        for clause in sorted(dnf, key=sorted):
            result = product(result, {frozenset([(t, not p)]) for t, p in clause})
        return result

    def parse_or() -> set[Clause]:
        nonlocal pos
        result = parse_and()
        while (t := peek()) is not None and t[0] == "OR":
            pos += 1
            result = bound(result | parse_and())
        return result

    def parse_and() -> set[Clause]:
        nonlocal pos
        result = parse_factor()
        while (t := peek()) is not None and t[0] in ("AND", "TERM", "(", "NOT"):
            if t[0] == "AND":
                pos += 1
            result = product(result, parse_factor())
        return result

    def parse_factor() -> set[Clause]:
        nonlocal pos
        negations = 0
        while (t := peek()) is not None and t[0] == "NOT":  # a chain of NOTs: no recursion
            negations += 1
            pos += 1
        if t is None:
            raise fail("expected a term or '(' at end of expression")
        if t[0] == "TERM":
            pos += 1
            inner: set[Clause] = {frozenset([(t[1], True)])}
        elif t[0] == "(":
            pos += 1
            if (u := peek()) is not None and u[0] == ")":
                raise fail(f"empty parentheses at position {t[2]}")
            inner = parse_or()
            if (u := peek()) is None or u[0] != ")":
                raise fail(f"unclosed '(' at position {t[2]}")
            pos += 1
        else:
            raise fail(f"expected a term or '(' at {where()}, found {t[1]!r}")
        return negate(inner) if negations % 2 else inner

    clauses = parse_or()
    if pos != len(toks):
        t = toks[pos]
        raise fail(f"unexpected {t[1]!r} at position {t[2]}")
    if not clauses:
        raise fail("can never hold (every clause holds a term and its negation)")
    rows = []
    for c in clauses:
        positive = tuple(sorted(t for t, p in c if p))
        negative = tuple(sorted(t for t, p in c if not p))
        if not positive:
            shown = " AND ".join(f"NOT {t}" for t in negative) or "an empty clause"
            raise fail(
                f"the DNF clause '{shown}' has no positive term: each clause needs at least "
                "one term that must occur"
            )
        rows.append((positive, negative))
    rows.sort()
    negated = tuple(n for _, n in rows) if any(n for _, n in rows) else None
    return tuple(p for p, _ in rows), negated


def format_condition(clauses: DNF, negated: Negated = None) -> str:
    """A DNF with its negations back to text (``parse_condition`` of it gives them back).

    >>> format_condition((("a",), ("b", "c")), (("d",), ()))
    '(a AND NOT d) OR (b AND c)'
    """
    parts = []
    for i, c in enumerate(clauses):
        lits = list(c) + [f"NOT {t}" for t in (negated[i] if negated else ())]
        body = " AND ".join(lits)
        parts.append(f"({body})" if len(lits) > 1 and len(clauses) > 1 else body)
    return " OR ".join(parts)


def format_dnf(clauses: DNF) -> str:
    """DNF back to text.

    >>> format_dnf((("a", "b"), ("c",)))
    '(a AND b) OR c'
    """
    parts = []
    for c in clauses:
        body = " AND ".join(c)
        parts.append(f"({body})" if len(c) > 1 and len(clauses) > 1 else body)
    return " OR ".join(parts)
