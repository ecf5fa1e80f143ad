"""Benchmarks: batch preparation (:mod:`.prep`), the shard (:mod:`.server`), the card against
dpdk-testpmd (:mod:`.dataplane`, :mod:`.testpmd`); all merge into ``bench.json`` (:mod:`.results`).
"""
