"""The shard's process edge: what hosts the pure core (``shard.state``) in a process of its own.

``actor`` (the Ray actor, a thin shell over ``ShardState``), ``channel`` (the authenticated TCP
connection rounds travel over), ``warmup`` (the kernels compiled before the first request), and
the process tuning every long-lived process of the cluster uses: ``heap`` (the garbage
collector), ``runtime`` (the GIL hand-over). Only ``actor`` imports Ray; the core imports none of
these (``lint-imports``).
"""
