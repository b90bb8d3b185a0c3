"""The names under which the coordinator's grpc.health.v1 service reports: overall (``""`` and
``SERVICE``), Redis and each shard. The server sets them (``coordinator.server``); the launcher's
``status`` and ``bench chaos`` ask them, without importing the server and all it brings (the
shards' index, numba)."""

from __future__ import annotations

from geopubsub.v1 import geopubsub_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["GeoPubSub"].full_name
"""The GeoPubSub service's name: its health is the overall one, as ``""``'s."""
REDIS_HEALTH = f"{SERVICE}/redis"
"""Health service name: NOT_SERVING while Redis does not answer a PING within ``deadline_s``."""


def shard_health_name(k: int) -> str:
    """Health service name of shard ``k``: NOT_SERVING while it is down (being reloaded).

    >>> shard_health_name(1)
    'geopubsub.v1.GeoPubSub/shard-1'
    """
    return f"{SERVICE}/shard-{k}"
