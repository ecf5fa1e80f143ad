"""embnic client library: what a training job links (protocol, batches, transport); its modules
are listed in docs/architecture.md, "The parts".
"""
