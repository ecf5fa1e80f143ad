"""The testbed, in rooms by role.

- :mod:`embnic.testbed.server` — the parameter-server shard (a part users deploy);
- :mod:`embnic.testbed.net` — the network-namespace topology and fault injection (netem);
- :mod:`embnic.testbed.traces` — trace record and replay;
- :mod:`embnic.testbed.training` — Criteo data, model, training loop, the demo and its report;
- :mod:`embnic.testbed.bench` — benchmarks.
"""
