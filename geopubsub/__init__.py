"""geopubsub command-line tools: workload generator (`gen`) and benchmarks (`bench`)."""
