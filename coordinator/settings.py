"""One frozen ``Settings`` for the cluster, built once at the entry point from (lowest to highest
precedence) defaults, an optional TOML file, ``GEOPUBSUB_*`` environment variables and flags;
validated there and passed down. Nothing below the entry point reads the environment.

>>> s = Settings.load(env={"GEOPUBSUB_SHARDS": "3"}, flags={"port": 0})
>>> s.shards, s.port
(3, 0)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shard.errors import ValidationError
from shard.indexes import INDEX_NAMES, RIVAL_NAMES
from shard.limits import MAX_TTL_S

ENV_PREFIX = "GEOPUBSUB_"


@dataclass(frozen=True, slots=True)
class Settings:
    shards: int = 2
    """Shard actors (one per part of the spatial partition map)."""
    host: str = "127.0.0.1"
    port: int = 50051
    """gRPC port; 0 picks a free one."""
    redis_url: str = ""
    """Empty: ``geopubsub up`` starts a private redis-server under ``data_dir``."""
    ray_address: str = ""
    """Empty: a local Ray (``ray.init()``); else the address of an existing Ray cluster."""
    data_dir: str = ".geopubsub"
    namespace: str = "gps"
    """Prefix of every Redis key."""
    batch_max: int = 512
    """Most publishes / moves in one call to a shard."""
    batch_delay_ms: float = 2.0
    """Longest a publish waits for its micro-batch to fill when no round is at the shards (while
    one is, the next round gathers until it is back or ``batch_max`` operations wait)."""
    subscribe_ack: str = "stored"
    """When a Subscribe is answered. ``"stored"``: once Redis holds it (the source of truth a
    restart rebuilds from) and its round is queued: every operation accepted after the answer
    comes after it, so a later publish reaches it; its +m for the messages live before it are
    delivered within ``subscribe_defer_ms`` (while the rounds keep up: a call that finds
    ``batch_max`` operations waiting is answered as ``"applied"``). ``"applied"``: once its
    round has been applied by the shards and delivered."""
    subscribe_defer_ms: float = 100.0
    """Longest a subscribe answered ``"stored"`` waits for its round (an operation of another
    kind takes it along at once), so that the shards take single Subscribes tens at a time: a
    shard idle for a few milliseconds pays ~0.3-0.6 ms of CPU for its next round however small
    (docs/BENCHMARKS.md). It is how late a new subscription's +m for the messages live before
    it may come."""
    queue_max: int = 100_000
    """Operations (publishes, moves, subscribes) waiting for a round, all shards together, past
    which a new one answers RESOURCE_EXHAUSTED."""
    max_ttl_s: float = 86_400.0
    """Longest ``ttl_s`` a Publish may give (a day); longer is INVALID_ARGUMENT. At most
    ``shard.limits.MAX_TTL_S`` (30 days), the ceiling of every input path."""
    max_live_messages: int = 1_000_000
    """Stored messages (ttl_s > 0) live or waiting for their round at once; a Publish that would
    pass it answers RESOURCE_EXHAUSTED. Each costs memory in the coordinator and in every shard
    it reaches until it expires."""
    redis_maxmemory_mb: int = 4096
    """``maxmemory`` of the private redis-server ``geopubsub up`` starts (policy ``noeviction``:
    a write that would pass it is refused, and the coordinator answers RESOURCE_EXHAUSTED);
    0: unlimited. Not applied to a Redis given by ``redis_url``."""
    redis_fsync: str = "everysec"
    """``appendfsync`` of the private redis-server: "everysec" (an acknowledged publish is in
    Redis and its append-only file, fsynced within a second: a killed process loses nothing, a
    power failure up to a second), "always" (fsynced before it is acknowledged: each round's
    write waits for the disk) or "no" (the OS decides)."""
    retention_max: int = 10_000
    """Deliveries kept per subscription in the Redis retention log."""
    retention_s: float = 3600.0
    """...and for at most this many seconds."""
    log_max_mb: int = 1024
    """The retention log's size in Redis: past it the oldest rounds are dropped (a resume from
    before them gets a GAP). Keep it well below Redis's ``maxmemory``."""
    stream_buffer: int = 10_000
    """Deliveries buffered per open result stream; past it the stream falls back to the log."""
    stream_buffer_bytes: int = 16 << 20
    """...and bytes (serialized deliveries) buffered per open result stream."""
    max_streams: int = 10_000
    """Result streams open at once; StreamResults past it answers RESOURCE_EXHAUSTED."""
    shard_max_restarts: int = 3
    """Ray restarts of a crashed shard actor; the coordinator then reloads it from its
    subscriptions. Past them Ray gives the actor up and the coordinator makes a new one."""
    shard_calls: str = "channel"
    """How rounds reach the shard actors: "channel", over each actor's direct connection
    (``shard.host.channel``), or "ray", one Ray call per round and shard (~1 ms of CPU each)."""
    index: str = "aptree"
    """The shards' index: "aptree" (the AP+-Tree) or a rival of the seed papers hosted with the
    same operations (``shard.indexes``: rt, rt+, rt++, mbrtrie, ptquadtree, lfilter, iqtree,
    rqtree; ``shard.rivals.hosted``), to run and measure the cluster on it."""
    metrics_port: int = 0
    """Port of the Prometheus endpoint (``coordinator.metrics``: ``http(s)://HOST:PORT/metrics``);
    0: no endpoint."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint binds: a loopback address unless TLS is on (it is then
    served over HTTPS with ``tls_cert``) or ``insecure``. It shows counts and timings only."""
    deadline_s: float = 10.0
    """Longest the coordinator waits for a shard or Redis before answering UNAVAILABLE: every
    Redis command is bounded by it (socket timeouts), every shard call by half of it (the rest
    is for the round to be answered within the caller's own wait of ``deadline_s``), a shard's
    load by more (``coordinator.shards.LOAD_S_PER_SUBSCRIPTION``). The health check pings Redis
    within it."""
    restart_max: int = 5
    """``geopubsub up`` restarts a private Redis or the coordinator that dies, until this many
    crashes of it within ``restart_window_s``; then it gives up on it (``deploy.supervise``)."""
    restart_window_s: float = 60.0
    """The window of ``restart_max``."""
    tls: str = ""
    """"auto": ``geopubsub up`` makes a local CA and a server certificate under
    ``<data_dir>/tls/`` (kept across restarts) and serves the gRPC API over TLS with them; clients
    of the local cluster find the CA through ``cluster.json``. "" (default): TLS only if
    ``tls_cert`` is given."""
    tls_cert: str = ""
    """PEM certificate (chain) of the gRPC API; with ``tls_key`` it turns TLS on."""
    tls_key: str = ""
    """PEM private key of ``tls_cert``."""
    tls_client_ca: str = ""
    """PEM CA certificate(s): mutual TLS, every client must present a certificate it signed
    (the launcher's own health checks use ``client_cert`` / ``client_key``)."""
    auth: str = "auto"
    """Bearer tokens on every call but health (``coordinator.access``; make them with
    ``geopubsub token create``): "on", "off", or "auto" (on unless ``host`` is a loopback
    address, so that local runs need no token)."""
    insecure: bool = False
    """Allow serving a non-loopback ``host`` without TLS or without auth (anyone who reaches the
    port can then read and change every subscription, a moving one's location included).
    Without it such a start is refused."""
    ca: str = ""
    """Client side: the PEM CA certificate(s) a client trusts for the coordinator's certificate
    (default for the local cluster: the one ``tls = "auto"`` made)."""
    client_cert: str = ""
    """Client side: the PEM certificate a client presents under mutual TLS."""
    client_key: str = ""
    """Client side: its private key."""
    token: str = field(default="", repr=False)
    """Client side: the bearer token a client sends (``GEOPUBSUB_TOKEN``; never logged, and
    sent only over TLS or to a loopback address)."""

    def __post_init__(self) -> None:
        _check(self.shards >= 1 and self.shards <= 1024, "shards", self.shards, "1..1024")
        _check(0 <= self.port <= 65535, "port", self.port, "0..65535")
        _check(self.batch_max >= 1, "batch_max", self.batch_max, ">= 1")
        _check(self.batch_delay_ms >= 0, "batch_delay_ms", self.batch_delay_ms, ">= 0")
        _check(
            self.subscribe_ack in ("stored", "applied"),
            "subscribe_ack",
            self.subscribe_ack,
            '"stored" or "applied"',
        )
        _check(
            0 <= self.subscribe_defer_ms <= 1000,
            "subscribe_defer_ms",
            self.subscribe_defer_ms,
            "in [0, 1000]",
        )
        _check(self.queue_max >= 1, "queue_max", self.queue_max, ">= 1")
        _check(
            0 < self.max_ttl_s <= MAX_TTL_S, "max_ttl_s", self.max_ttl_s, f"in (0, {MAX_TTL_S:.0f}]"
        )
        _check(self.max_live_messages >= 1, "max_live_messages", self.max_live_messages, ">= 1")
        _check(
            self.redis_maxmemory_mb >= 0,
            "redis_maxmemory_mb",
            self.redis_maxmemory_mb,
            ">= 0 (0: unlimited)",
        )
        _check(self.retention_max >= 1, "retention_max", self.retention_max, ">= 1")
        _check(self.retention_s > 0, "retention_s", self.retention_s, "> 0")
        _check(self.log_max_mb >= 1, "log_max_mb", self.log_max_mb, ">= 1")
        _check(self.stream_buffer >= 1, "stream_buffer", self.stream_buffer, ">= 1")
        _check(
            self.stream_buffer_bytes >= 1024,
            "stream_buffer_bytes",
            self.stream_buffer_bytes,
            ">= 1024",
        )
        _check(self.max_streams >= 1, "max_streams", self.max_streams, ">= 1")
        _check(
            self.shard_max_restarts >= -1, "shard_max_restarts", self.shard_max_restarts, ">= -1"
        )
        _check(
            self.shard_calls in ("channel", "ray"),
            "shard_calls",
            self.shard_calls,
            '"channel" or "ray"',
        )
        _check(
            self.index in INDEX_NAMES and self.index not in ("invlist", "brute"),
            "index",
            self.index,
            "aptree or a rival index: " + ", ".join(RIVAL_NAMES),
        )
        _check(0 <= self.metrics_port <= 65535, "metrics_port", self.metrics_port, "0..65535")
        _check(
            not self.metrics_port or self.metrics_port != self.port or self.port == 0,
            "metrics_port",
            self.metrics_port,
            "another port than the gRPC port",
        )
        _check(
            self.tls_on or self.insecure or _loopback(self.metrics_host),
            "metrics_host",
            self.metrics_host,
            "a loopback address unless TLS is on (the endpoint then serves HTTPS) or insecure = true",
        )
        _check(self.deadline_s > 0, "deadline_s", self.deadline_s, "> 0")
        _check(self.restart_max >= 0, "restart_max", self.restart_max, ">= 0")
        _check(self.restart_window_s > 0, "restart_window_s", self.restart_window_s, "> 0")
        _check(bool(self.namespace), "namespace", self.namespace, "non-empty")
        _check(self.tls in ("", "auto"), "tls", self.tls, '"" or "auto"')
        _check_pair(self, "tls_cert", "tls_key")
        _check(
            not (self.tls == "auto" and self.tls_cert),
            "tls_cert",
            self.tls_cert,
            'not given with tls = "auto" (which makes its own)',
        )
        _check(
            not self.tls_client_ca or bool(self.tls or self.tls_cert),
            "tls_client_ca",
            self.tls_client_ca,
            'given with TLS on (tls = "auto", or tls_cert and tls_key)',
        )
        _check_pair(self, "client_cert", "client_key")
        _check(self.auth in ("auto", "on", "off"), "auth", self.auth, '"auto", "on" or "off"')
        _check(
            (self.tls_on and self.auth_on) or self.insecure or _loopback(self.host),
            "host",
            self.host,
            "a loopback address unless TLS (tls, or tls_cert and tls_key) and auth are on: "
            "anyone who reaches the port could read and change every subscription; insecure = "
            "true accepts that",
        )
        _check(
            self.redis_fsync in ("always", "everysec", "no"),
            "redis_fsync",
            self.redis_fsync,
            '"always", "everysec" or "no"',
        )

    @property
    def auth_on(self) -> bool:
        """Whether every call but health needs a bearer token."""
        return self.auth == "on" or (self.auth == "auto" and not _loopback(self.host))

    @property
    def tls_on(self) -> bool:
        """Whether the gRPC API is served over TLS."""
        return bool(self.tls or self.tls_cert)

    def shard_options(self) -> dict[str, Any]:
        """The options every shard's ``ShardState`` is made with (``shard.host.actor``)."""
        return {} if self.index == "aptree" else {"index": self.index}

    @classmethod
    def load(
        cls,
        *,
        file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        flags: Mapping[str, Any] | None = None,
    ) -> Settings:
        """Defaults < TOML ``file`` < ``env`` (``GEOPUBSUB_<NAME>``) < ``flags`` (None = unset)."""
        values: dict[str, Any] = {}
        if file is not None:
            path = Path(file)
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ValidationError("config", str(path), str(exc)) from None
            values.update(_known(data, f"{path}"))
        for key, raw in (env or {}).items():
            if key.startswith(ENV_PREFIX):
                name = key[len(ENV_PREFIX) :].lower()
                if name in _FIELDS:
                    values[name] = _parse(name, raw, key)
        values.update(_known({k: v for k, v in (flags or {}).items() if v is not None}, "flag"))
        return cls(**values)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _known(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        if k not in _FIELDS:
            raise ValidationError(f"{where}: {k}", v, "unknown setting")
        out[k] = _parse(k, v, f"{where}: {k}")
    return out


_BOOLS = {"true": True, "1": True, "yes": True, "on": True}
_BOOLS |= {"false": False, "0": False, "no": False, "off": False}
"""The words a boolean setting takes in the environment (``GEOPUBSUB_INSECURE=false``)."""


def _parse(name: str, raw: Any, where: str) -> Any:
    kind = type(_FIELDS[name].default)
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _BOOLS:
                return _BOOLS[raw.strip().lower()]
            raise ValueError(raw)
        if isinstance(raw, kind) and not isinstance(raw, bool):
            return raw
        if kind is int and isinstance(raw, str | int) and not isinstance(raw, bool):
            return int(raw)
        if kind is float and isinstance(raw, str | int | float) and not isinstance(raw, bool):
            return float(raw)
        if kind is str:
            return str(raw)
    except ValueError:
        pass
    raise ValidationError(where, raw, f"must be {kind.__name__}")


def _loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the port on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_pair(settings: Settings, a: str, b: str) -> None:
    """Settings ``a`` and ``b`` are given both or neither; the missing one is named."""
    got_a, got_b = bool(getattr(settings, a)), bool(getattr(settings, b))
    if got_a != got_b:
        missing, other = (b, a) if got_a else (a, b)
        _check(False, missing, getattr(settings, missing), f"given together with {other}")


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValidationError(name, value, f"must be {rule}")
