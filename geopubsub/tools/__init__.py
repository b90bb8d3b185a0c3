"""The tools on top of the client library: the ``geopubsub`` command and its subcommands
(``cli``, ``cluster_cli``, ``load_cli``, ``token_cli``), the demo, the gRPC traffic they share,
``register``, the oracle check, the benches (``bench*``) and the workload generators (``gen*``).

Nothing in the client library (``geopubsub.client``, ``geopubsub.convert``, ``geopubsub.v1``),
``coordinator``, ``loader``, ``deploy`` or ``shard`` imports them (the top layer of
pyproject.toml's ``[tool.importlinter]``)."""
