"""Benchmarks: batch preparation (:mod:`.prep`), the client's round (:mod:`.client_round`), a shard
serving (:mod:`.shard_serving`, :mod:`.shard_rounds`, its disk tier :mod:`.shard_disk`; their load
generator :mod:`.loadgen`), the card against dpdk-testpmd (:mod:`.dataplane`, :mod:`.testpmd`);
all merge into ``bench.json`` (:mod:`.results`).
"""
