"""Generated code of the ``geopubsub.v1`` gRPC API (``protos/generate.py``; do not edit by hand)."""
