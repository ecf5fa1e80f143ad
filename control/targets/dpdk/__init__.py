"""The ``dpdk`` target and the DPDK processes embnic runs (docs/architecture.md lists the modules)."""
