"""The ``p4dpdk`` target: the P4 program for PNA (p4/pna/) in DPDK's SWX pipeline
(docs/architecture.md lists the modules)."""
