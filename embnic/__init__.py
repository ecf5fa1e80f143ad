"""embnic: a SmartNIC offload for the parameter-server traffic of embedding-table training.

Subpackages: :mod:`embnic.client_lib` (protocol, batch preparation, transport),
:mod:`embnic.control` (the ``embnic`` CLI and pipeline targets), :mod:`embnic.testbed`
(parameter-server shards, namespace testbed, training, benchmarks).
"""
__version__ = "0.1.0"
