"""Benchmarks: batch preparation (:mod:`.prep`) and the card against dpdk-testpmd (:mod:`.dataplane`)."""
