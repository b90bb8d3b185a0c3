"""Expression parser and tokenizer."""

from __future__ import annotations

import itertools
import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard.errors import ExpressionError
from shard.expr import format_condition, format_dnf, parse_condition, parse_expr
from shard.limits import MAX_EXPR_DEPTH, MAX_EXPR_LEN
from shard.terms import _terms, ascii_keyword_terms, message_terms, normalize_term, tokenize


def test_normalization_and_tokenizer():
    assert normalize_term("ＩＰＡＤ") == "ipad"
    assert normalize_term("Straße") == "strasse"
    assert tokenize("iPad, iPad; discount-50% café") == ["ipad", "discount", "50", "café"]
    assert message_terms(["Sale", "sale"], "IPAD sale") == ("ipad", "sale")


@pytest.mark.parametrize(
    ("text", "dnf"),
    [
        ("ipad", (("ipad",),)),
        ("ipad discount", (("discount", "ipad"),)),
        ("ipad AND (discount OR sale)", (("discount", "ipad"), ("ipad", "sale"))),
        ("a or b and c", (("a",), ("b", "c"))),
        ("a (b OR c)", (("a", "b"), ("a", "c"))),
        ("(a OR b) (c OR d)", (("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"))),
        ("a OR a b", (("a",),)),
        ("A And B", (("a", "b"),)),
        ("((a))", (("a",),)),
    ],
)
def test_parse(text, dnf):
    assert parse_expr(text) == dnf


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("a AND", "end of expression"),
        ("OR b", "position 0"),
        ("a AND OR b", "position 6"),
        ("()", "empty parentheses"),
        ("(a", "unclosed"),
        ("a)", "unexpected ')'"),
        ("a & b", "'&' at position 2"),
        ("NOT a", "'NOT a' has no positive term"),
        ("a OR NOT b", "'NOT b' has no positive term"),
        ("NOT (a b)", "no positive"),
        ("a AND NOT a", "can never hold"),
        ("a NOT", "end of expression"),
        ("a " + " ".join(f"NOT n{i}" for i in range(17)), "more than 16 negated terms"),
        (" ".join(f"(x{i} OR y{i})" for i in range(7)), "64 DNF clauses"),
        (" ".join(f"t{i}" for i in range(17)), "more than 16 terms"),
        ("a" * 5000, "longer than 4096"),
    ],
)
def test_parse_errors(text, needle):
    with pytest.raises(ExpressionError) as e:
        parse_condition(text)
    assert e.value.field == "expr" and needle in str(e.value)


def test_nesting_deeper_than_the_limit_is_an_error_not_a_recursion_error():
    deep = "(" * 400 + "a" + ")" * 400  # a RecursionError (gRPC INTERNAL) before the limit
    for text in (deep, "(" * 4000, "a AND " + "(" * (MAX_EXPR_DEPTH + 1) + "b"):
        assert len(text) <= MAX_EXPR_LEN
        with pytest.raises(ExpressionError) as e:
            parse_expr(text)
        assert e.value.field == "expr" and e.value.value == text
        at = text.index("(" * (MAX_EXPR_DEPTH + 1)) + MAX_EXPR_DEPTH
        assert f"nested more than {MAX_EXPR_DEPTH} deep at position {at}" in str(e.value)
    at_limit = "(" * MAX_EXPR_DEPTH + "a" + ")" * MAX_EXPR_DEPTH
    assert parse_expr(at_limit) == (("a",),)
    assert parse_expr(" ".join(["(a)"] * 500)) == (("a",),)  # depth 1, many times


def test_long_chains_of_and_or_parse_without_recursion():
    for op in (" AND ", " OR ", " "):
        text = op.join(["a"] * (MAX_EXPR_LEN // (len(op) + 1)))
        assert len(text) <= MAX_EXPR_LEN
        assert parse_expr(text) == (("a",),)
    ors = " OR ".join(f"t{i % 64}" for i in range(600))
    assert len(ors) <= MAX_EXPR_LEN and len(parse_expr(ors)) == 64


def test_sixty_four_clauses_is_the_limit():
    text = " ".join(f"(x{i} OR y{i})" for i in range(6))
    assert len(parse_expr(text)) == 64


def test_format_dnf_round_trip():
    d = parse_expr("a (b OR c) OR d")
    assert parse_expr(format_dnf(d)) == d


TERMS = ["a", "b", "c", "d"]


@st.composite
def expressions(draw, depth=0, negations=False):
    if depth > 2 or draw(st.booleans()):
        term = draw(st.sampled_from(TERMS))
        return f"NOT {term}" if negations and draw(st.integers(0, 3)) == 0 else term
    op = draw(st.sampled_from([" AND ", " OR ", " "]))
    parts = draw(
        st.lists(expressions(depth=depth + 1, negations=negations), min_size=2, max_size=3)
    )
    out = "(" + op.join(parts) + ")"
    return "NOT " + out if negations and draw(st.integers(0, 4)) == 0 else out


def evaluate(text: str, present: set[str]) -> bool:
    """Independent evaluator: rewrite to a Python boolean expression."""
    toks = re.findall(r"\(|\)|\w+", text)
    out = []
    for i, t in enumerate(toks):
        if t in ("AND", "OR"):
            out.append(t.lower())
            continue
        if i and toks[i - 1] not in ("AND", "OR", "(", "NOT") and t != ")":
            out.append("and")
        out.append("not" if t == "NOT" else t if t in "()" else str(t in present))
    return eval(" ".join(out))  # noqa: S307 - test-only, tokens are ours


@given(expressions())
def test_dnf_is_equivalent(text):
    dnf = parse_expr(text)
    for r in range(len(TERMS) + 1):
        for present in itertools.combinations(TERMS, r):
            s = set(present)
            assert any(set(c) <= s for c in dnf) == evaluate(text, s), (text, dnf, s)


@given(expressions(negations=True))
def test_dnf_with_not_is_equivalent_or_refused_for_a_clause_without_a_positive_term(text):
    """NOT pushed inward: the DNF with its negations holds exactly where the expression does.
    It is refused for a clause without a positive term exactly when the expression holds on a
    message with none of the terms (such a clause is what holds there), and as never holding
    exactly when it holds nowhere."""
    try:
        clauses, negated = parse_condition(text)
    except ExpressionError as e:
        if "no positive term" in str(e):
            assert evaluate(text, set()), text
        else:
            assert "can never hold" in str(e), e
            assert not any(
                evaluate(text, set(p))
                for r in range(len(TERMS) + 1)
                for p in itertools.combinations(TERMS, r)
            )
        return
    assert not evaluate(text, set())
    neg = negated or ((),) * len(clauses)
    for r in range(len(TERMS) + 1):
        for present in itertools.combinations(TERMS, r):
            s = set(present)
            got = any(set(c) <= s and s.isdisjoint(n) for c, n in zip(clauses, neg, strict=True))
            assert got == evaluate(text, s), (text, clauses, negated, s)
    assert parse_condition(format_condition(clauses, negated)) == (clauses, negated)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=20))
def test_normalize_term_ascii_shortcut_equals_the_unicode_rules(s):
    full = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold()).strip()
    assert normalize_term(s) == full


_KEYWORD = st.text(alphabet=st.characters(max_codepoint=0x24F), max_size=8)
_ODD = st.sampled_from(["a\x1fb", " ", "\t", "X" * 70, "ipad", "IPAD", " Sale "])


@given(st.lists(_KEYWORD | _ODD, max_size=6))
def test_message_terms_keyword_shortcut_equals_the_general_rules(keywords):
    fast = ascii_keyword_terms(keywords)
    if fast is not None:  # it answers only what the general rules accept, and identically
        assert fast == _terms(keywords, None)
    elif keywords and all(
        k.isascii() and k.strip() and len(k) <= 64 and "\x1f" not in k for k in keywords
    ):
        raise AssertionError(f"valid ASCII keywords not taken by the shortcut: {keywords!r}")
