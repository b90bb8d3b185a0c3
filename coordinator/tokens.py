"""Bearer tokens: what a token is, how it is kept in Redis (hashed), and the calls that make,
list and revoke them.

A token reads ``gpst_<id>.<secret>``: ``id`` (12 hex digits) names it in ``geopubsub token
list`` and ``revoke``; ``secret`` is 32 random bytes (URL-safe base64). Redis keeps, per id, the
token's role, owner prefix, times and the SHA-256 of its secret, never the secret: one reading
Redis cannot call as anyone. (A salted slow hash is for passwords people choose; a 256-bit
random secret cannot be guessed from its SHA-256.)

Keys (``{ns}`` is ``Settings.namespace``)::

    {ns}:tokens           hash     id -> the record (JSON: role, owner, created, expires, sha256)
    {ns}:tokens:revoked   channel  an id published when its token is revoked (the coordinator
                                   drops it from its cache and ends its open streams at once)

Roles: ``admin`` (every method, every subscription, Reload, GetStats, reflection),
``publisher`` (Publish, PublishStream), ``subscriber`` (Subscribe, Unsubscribe, GetSubscription,
StreamResults, UpdateLocation, LocationStream on the ids that start with its ``owner``).

>>> text, tok = mint("subscriber", "app1/", expires_s=60, now=1000.0)
>>> parse(text) == (tok.id, text.split(".", 1)[1]), tok.expires, tok.owns("app1/alice")
(True, 1060.0, True)
>>> tok.owns("app2/bob")
False
>>> tok.valid(text.split(".", 1)[1], now=1001.0), tok.valid("guess", now=1001.0)
(True, False)
>>> Token.from_json(tok.id, tok.to_json()) == tok
True
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from dataclasses import asdict, dataclass
from typing import Any

from shard.errors import UnauthenticatedError, ValidationError

ROLES = ("admin", "publisher", "subscriber")
PREFIX = "gpst_"
ID_HEX = 12
MAX_OWNER = 128
"""Longest owner prefix (a subscription id is at most 128 characters)."""


def tokens_key(ns: str) -> str:
    return f"{ns}:tokens"


def revoked_channel(ns: str) -> str:
    return f"{ns}:tokens:revoked"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Token:
    """A token as Redis keeps it (no secret)."""

    id: str
    role: str
    owner: str
    created: float
    expires: float
    """Seconds since the epoch; ``inf``: never."""
    sha256: str

    def owns(self, sub_id: str) -> bool:
        """Whether this token may act on subscription ``sub_id`` (admin: every one)."""
        return self.role == "admin" or (self.role == "subscriber" and sub_id.startswith(self.owner))

    def expired(self, now: float) -> bool:
        return now >= self.expires

    def valid(self, secret: str, now: float) -> bool:
        """The secret is this token's (compared in constant time) and it has not expired."""
        return hmac.compare_digest(_digest(secret), self.sha256) and not self.expired(now)

    def to_json(self) -> str:
        d = asdict(self)
        del d["id"]
        d["expires"] = None if math.isinf(self.expires) else self.expires
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, token_id: str, raw: str | bytes) -> Token:
        d = json.loads(raw)
        expires = math.inf if d["expires"] is None else float(d["expires"])
        return cls(token_id, d["role"], d["owner"], float(d["created"]), expires, d["sha256"])

    def public(self) -> dict[str, Any]:
        """What ``token list`` shows: everything but the hash."""
        return {
            "id": self.id,
            "role": self.role,
            "owner": self.owner,
            "created": self.created,
            "expires": None if math.isinf(self.expires) else self.expires,
        }


def check_request(role: str, owner: str | None, expires_s: float | None) -> None:
    """What ``geopubsub token create`` is given, checked (each error names its flag)."""
    if role not in ROLES:
        raise ValidationError("--role", role, f"must be one of {', '.join(ROLES)}")
    if role == "subscriber":
        if not owner:
            raise ValidationError(
                "--owner", owner, "a subscriber token needs the prefix of the ids it owns"
            )
    elif owner:
        raise ValidationError("--owner", owner, f"only a subscriber token has one, not {role}")
    if owner is not None and (
        len(owner) > MAX_OWNER or not owner.isprintable() or any(c.isspace() for c in owner)
    ):
        raise ValidationError("--owner", owner, f"1-{MAX_OWNER} printable characters, no spaces")
    if expires_s is not None and not (0 < expires_s < math.inf):
        raise ValidationError("--expires", expires_s, "must be a number of seconds > 0")


def mint(role: str, owner: str | None, *, expires_s: float | None, now: float) -> tuple[str, Token]:
    """A new token: (the text its holder sends, the record to keep)."""
    check_request(role, owner, expires_s)
    token_id = secrets.token_hex(ID_HEX // 2)
    secret = secrets.token_urlsafe(32)
    expires = math.inf if expires_s is None else now + expires_s
    tok = Token(token_id, role, owner or "", now, expires, _digest(secret))
    return f"{PREFIX}{token_id}.{secret}", tok


def parse(text: str) -> tuple[str, str]:
    """(id, secret) of a token's text; UnauthenticatedError if it is not one."""
    if text.startswith(PREFIX):
        token_id, dot, secret = text[len(PREFIX) :].partition(".")
        if (
            dot
            and len(token_id) == ID_HEX
            and secret
            and all(c in "0123456789abcdef" for c in token_id)
        ):
            return token_id, secret
    raise UnauthenticatedError("not a geopubsub token (gpst_<id>.<secret>)")


def bearer(metadata: Any) -> str:
    """The token of a call's ``authorization: Bearer <token>`` metadata."""
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, text = (value if isinstance(value, str) else value.decode()).partition(" ")
            if scheme.lower() == "bearer" and text.strip():
                return text.strip()
            raise UnauthenticatedError("authorization metadata must be 'Bearer <token>'")
    raise UnauthenticatedError(
        "this cluster needs a token: authorization metadata 'Bearer <token>' (geopubsub token "
        "create; the CLI's --token or GEOPUBSUB_TOKEN)"
    )


# ---- the store, for the CLI (a synchronous redis-py client) ---------------------------------
def create(
    r, ns: str, role: str, owner: str | None, expires_s: float | None, now: float
) -> tuple[str, Token]:
    text, tok = mint(role, owner, expires_s=expires_s, now=now)
    r.hset(tokens_key(ns), tok.id, tok.to_json())
    return text, tok


def list_tokens(r, ns: str) -> list[Token]:
    raw = r.hgetall(tokens_key(ns))
    toks = [Token.from_json(k.decode() if isinstance(k, bytes) else k, v) for k, v in raw.items()]
    return sorted(toks, key=lambda t: (t.created, t.id))


def revoke(r, ns: str, token_id: str) -> bool:
    """Delete the token and tell every coordinator listening; False if there was none."""
    gone = bool(r.hdel(tokens_key(ns), token_id))
    r.publish(revoked_channel(ns), token_id)
    return gone
