"""The ``embnic`` commands: one module per CLI noun, registered by :mod:`embnic.cli.main`.

Only these modules and ``cli.py`` know click; each parses its arguments and calls library code
(settings: :mod:`embnic.control.settings`; targets: :mod:`embnic.control.targets`).

- ``options.py``: shared click options, parameter types and command decorators, defined once;
- ``pipeline.py``: ``embnic pipeline load|unload|status``;
- ``peers.py``: ``embnic route add|del|list`` and ``embnic client add|del|list`` (the card's peer
  table: a shard's route, a client; one group built twice);
- ``status.py``: ``embnic status`` (counters, drops, rings, state-map summary);
- ``state.py``: ``embnic state dump|summary|ring`` (the card's message state map);
- ``inspect.py``: ``embnic inspect BINARY`` (the card binary's build info);
- ``exporter.py``: ``embnic exporter`` (Prometheus metrics of the card);
- ``config.py``: ``embnic config check|show``;
- ``plan.py``: ``embnic plan`` (capacity planning);
- ``server.py``: ``embnic server`` (one parameter-server shard);
- ``train.py``: ``embnic train``;
- ``tables.py``: ``embnic tables export|import`` (trained embedding tables);
- ``testbed.py``: ``embnic testbed up|down|status|netem``;
- ``trace.py``: ``embnic trace record|replay`` (and ``embnic replay``, the alias of ``trace replay``);
- ``bench.py``: ``embnic bench ...`` (benchmarks);
- ``demo.py``: ``embnic demo``;
- ``dissector.py``: ``embnic dissector`` (the Wireshark plug-in).
"""
