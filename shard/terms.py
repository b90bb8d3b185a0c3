"""Term normalization and tokenization, the same for subscriptions and messages."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from shard.errors import ValidationError
from shard.limits import MAX_MESSAGE_TERMS, MAX_TERM_LEN

_WORD = re.compile(r"\w+")
_SEP = "\x1f"


def normalize_term(s: str) -> str:
    """NFKC, then casefold (NFKC again: casefolding can leave non-normalized text), stripped.

    >>> normalize_term("ＩＰＡＤ")
    'ipad'
    >>> normalize_term("Straße")
    'strasse'
    """
    if s.isascii():  # NFKC leaves ASCII as it is, and casefolds it to lower case
        return s.lower().strip()
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold()).strip()


def tokenize(text: str) -> list[str]:
    """Runs of ``\\w`` in ``text``, normalized, de-duplicated, in order of first occurrence. O(len).

    >>> tokenize("iPad, iPad; discount-50%")
    ['ipad', 'discount', '50']
    """
    out: dict[str, None] = {}
    for tok in _WORD.findall(unicodedata.normalize("NFKC", text)):
        t = normalize_term(tok)
        if t:
            out.setdefault(t, None)
    return list(out)


def check_term(field: str, term: str) -> str:
    if len(term) > MAX_TERM_LEN:
        raise ValidationError(field, term, f"term longer than {MAX_TERM_LEN} characters")
    return term


def message_terms(keywords: Iterable[str], text: str | None) -> tuple[str, ...]:
    """A message's terms: normalized keywords plus the tokens of its text, de-duplicated, sorted.

    >>> message_terms(["Sale"], "iPad sale today")
    ('ipad', 'sale', 'today')
    """
    if not text and isinstance(keywords, tuple | list) and keywords:
        fast = ascii_keyword_terms(keywords)
        if fast is not None:
            return fast
    return _terms(keywords, text)


def _terms(keywords: Iterable[str], text: str | None) -> tuple[str, ...]:
    """``message_terms`` by the general rules, each keyword checked and named."""
    terms: set[str] = set()
    for i, kw in enumerate(keywords):
        if not isinstance(kw, str):
            raise ValidationError(f"keywords[{i}]", kw, "must be a string")
        t = normalize_term(kw)
        if not t:
            raise ValidationError(f"keywords[{i}]", kw, "empty after normalization")
        if len(t) > MAX_TERM_LEN:
            check_term(f"keywords[{i}]", t)
        terms.add(t)
    if text:
        for t in tokenize(text):
            terms.add(check_term("text", t))
    if len(terms) > MAX_MESSAGE_TERMS:
        raise ValidationError(
            "keywords", len(terms), f"more than {MAX_MESSAGE_TERMS} distinct terms"
        )
    return tuple(sorted(terms))


def ascii_keyword_terms(keywords: Sequence[str]) -> tuple[str, ...] | None:
    """``message_terms(keywords, None)`` for ASCII keywords that are all valid, in a few calls
    over the joined keywords (the publish and subscribe paths' common case: a subscription's
    keywords are normalized the same way, ``shard.model.validate_keywords``); None for anything
    else, which the general path then checks and names."""
    try:
        joined = _SEP.join(keywords)
    except TypeError:  # a keyword that is not a string
        return None
    if not joined.isascii() or joined.count(_SEP) != len(keywords) - 1:
        return None
    terms = {t.strip() for t in joined.lower().split(_SEP)}
    if "" in terms or len(terms) > MAX_MESSAGE_TERMS or max(map(len, terms)) > MAX_TERM_LEN:
        return None
    return tuple(sorted(terms))
