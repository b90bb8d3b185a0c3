"""The shard: the index core (AP-Tree, domain model, brute-force oracle) and, later, its Ray actor.

Everything under ``shard`` except the actor module is pure: no I/O, no ray/grpc/pyspark/redis.
"""
