"""The network-namespace testbed and its faults (namespaces and veth pairs themselves are made
by :mod:`embnic.control.netns`).

- :mod:`.wiring` — the declared topology: nodes, links, names, MACs and addresses from a cluster config;
- :mod:`.procs` — the testbed's errors, its root check, stopping recorded processes, log tails;
- :mod:`.statefile` — the state file ``RUN_DIR/testbed-NAME.json`` and dead-node reports;
- :mod:`.toml_writer` — the effective config the testbed writes for every node;
- :mod:`.probe` — the key a readiness probe asks each shard for;
- :mod:`.topology` — the lifecycle: up (namespaces, links, shards, card, probe), status;
- :mod:`.teardown` — down: everything a testbed made, from its state file alone;
- :mod:`.netem` — loss, reordering, duplicates on the links (tc netem, XDP or a helper per link);
- :mod:`.netem_helper` — the user-space impairment helper process of one link;
- :mod:`.bpf_loss` — the ``bpf`` netem backend: in-kernel random loss by an XDP program per link end.
"""
