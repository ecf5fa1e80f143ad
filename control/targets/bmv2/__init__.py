"""The ``bmv2`` target: the P4 program (p4/, v1model) on BMv2 (docs/architecture.md lists the modules)."""
