"""embnic: a SmartNIC offload for the parameter-server traffic of embedding-table training.

Subpackages: :mod:`embnic.client_lib` (protocol, batch preparation, transport),
:mod:`embnic.control` (pipeline targets and the control library), :mod:`embnic.testbed`
(parameter-server shards, namespace testbed, training, benchmarks), :mod:`embnic.cli` (the
``embnic`` command line).
"""
__version__ = "0.1.0"
