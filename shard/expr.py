"""Boolean keyword expressions (``ipad AND (discount OR sale)``) parsed into bounded DNF.

Grammar (operators case-insensitive; AND binds tighter than OR; adjacent terms mean AND)::

    expr   := and ("OR" and)*
    and    := factor ("AND"? factor)*
    factor := TERM | "(" expr ")"
    TERM   := a run of \\w characters other than the words AND, OR, NOT
"""

from __future__ import annotations

import re

from shard.errors import ExpressionError
from shard.limits import (
    MAX_CLAUSE_TERMS,
    MAX_CLAUSES,
    MAX_EXPR_DEPTH,
    MAX_EXPR_LEN,
    MAX_TERM_LEN,
)
from shard.terms import normalize_term

DNF = tuple[tuple[str, ...], ...]
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
            if up == "NOT":
                raise ExpressionError("expr", text, f"NOT (position {start}) is not supported yet")
            if up in ("AND", "OR"):
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


def _absorb(clauses: set[frozenset[str]]) -> set[frozenset[str]]:
    """Drop clauses that are supersets of another clause (they can never add a match)."""
    ordered = sorted(clauses, key=len)
    kept: list[frozenset[str]] = []
    for c in ordered:
        if not any(k <= c for k in kept):
            kept.append(c)
    return set(kept)


def parse_expr(text: str) -> DNF:
    """Parse ``text`` into DNF: sorted clauses of sorted unique normalized terms.

    Raises ExpressionError (field ``expr``) naming the problem and its position; parentheses
    nest at most ``MAX_EXPR_DEPTH`` deep.

    >>> parse_expr("ipad AND (discount OR sale)")
    (('discount', 'ipad'), ('ipad', 'sale'))
    >>> parse_expr("a b OR a")
    (('a',),)
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

    def bound(clauses: set[frozenset[str]]) -> set[frozenset[str]]:
        clauses = _absorb(clauses)
        if len(clauses) > MAX_CLAUSES:
            raise fail(f"expands to more than {MAX_CLAUSES} DNF clauses")
        return clauses

    def parse_or() -> set[frozenset[str]]:
        nonlocal pos
        result = parse_and()
        while (t := peek()) is not None and t[0] == "OR":
            pos += 1
            result = bound(result | parse_and())
        return result

    def parse_and() -> set[frozenset[str]]:
        nonlocal pos
        result = parse_factor()
        while (t := peek()) is not None and t[0] in ("AND", "TERM", "("):
            if t[0] == "AND":
                pos += 1
            rhs = parse_factor()
            product: set[frozenset[str]] = set()
            for a in result:
                for b in rhs:
                    c = a | b
                    if len(c) > MAX_CLAUSE_TERMS:
                        raise fail(f"a clause has more than {MAX_CLAUSE_TERMS} terms")
                    product.add(c)
                    if len(product) > MAX_CLAUSES * 4:
                        raise fail(f"expands to more than {MAX_CLAUSES} DNF clauses")
            result = bound(product)
        return result

    def parse_factor() -> set[frozenset[str]]:
        nonlocal pos
        t = peek()
        if t is None:
            raise fail("expected a term or '(' at end of expression")
        if t[0] == "TERM":
            pos += 1
            return {frozenset([t[1]])}
        if t[0] == "(":
            pos += 1
            if (u := peek()) is not None and u[0] == ")":
                raise fail(f"empty parentheses at position {t[2]}")
            inner = parse_or()
            if (u := peek()) is None or u[0] != ")":
                raise fail(f"unclosed '(' at position {t[2]}")
            pos += 1
            return inner
        raise fail(f"expected a term or '(' at {where()}, found {t[1]!r}")

    clauses = parse_or()
    if pos != len(toks):
        t = toks[pos]
        raise fail(f"unexpected {t[1]!r} at position {t[2]}")
    return tuple(sorted(tuple(sorted(c)) for c in clauses))


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
