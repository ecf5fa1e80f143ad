"""Pipeline targets: every place the embnic pipeline can run, behind one interface.

- ``base.py``: the :class:`Target` interface, the registry of targets by name, the route and client
  table entries (from the config, or from flags and the config);
- ``p4program.py``: the P4 program's source as data (constants, tables, includes of ``p4/``), for
  the P4 targets and the tests;
- ``dpdk/``: the ``dpdk`` target — ``embnic-dp`` (dataplane/) as a process;
- ``bmv2/``: the ``bmv2`` target — the P4 program (v1model) on BMv2's ``simple_switch``;
- ``p4dpdk/``: the ``p4dpdk`` target — the P4 program (PNA) in DPDK's SWX pipeline (``embnic-swx``).
"""
