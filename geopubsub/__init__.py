"""geopubsub: the Python client library (``client``, ``convert``, the generated gRPC code in
``v1``) and, in ``geopubsub.tools``, the ``geopubsub`` command and the tools built on it."""
