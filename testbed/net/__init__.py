"""The network-namespace testbed and its faults.

- :mod:`.model` — the declared topology (nodes, links) from a cluster config;
- :mod:`.netns` — namespaces, commands and processes in them, the testbed's errors;
- :mod:`.state` — the state file ``RUN_DIR/testbed-NAME.json`` and dead-node reports;
- :mod:`.toml_writer` — the effective config it writes; :mod:`.probe` — what readiness probes ask;
- :mod:`.topology` — the lifecycle: up (namespaces, links, shards, card, probe), down, status;
- :mod:`.netem` / :mod:`.netem_helper` — loss, reordering, duplicates on the links (tc netem or
  a user-space helper per link).
"""
