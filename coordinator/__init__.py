"""The coordinator: asyncio gRPC server routing messages and location updates to shards."""
