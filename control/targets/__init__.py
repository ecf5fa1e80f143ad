"""Pipeline targets: every place the embnic pipeline can run, behind one interface
(:mod:`.base`); docs/architecture.md lists the modules."""
