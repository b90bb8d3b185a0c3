"""Local launcher and cluster manifests."""
