"""Parameter-server shards, namespace testbed, training job and benchmarks."""
