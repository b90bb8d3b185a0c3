"""Local launcher and cluster manifests (issue [3/4])."""
