"""The embnic control library: the pipeline targets (``targets/``) and the library the CLI
(:mod:`embnic.cli`) and the testbed share; docs/architecture.md lists its modules."""
