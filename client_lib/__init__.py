"""embnic client library: what a training job links (protocol, batches, transport)."""
