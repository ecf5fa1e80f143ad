"""The network-namespace testbed: topology (namespaces, veths, the card, shards) and faults (netem)."""
