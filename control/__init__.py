"""The embnic control library: the pipeline targets and the library the CLI (:mod:`embnic.cli`) and the testbed share.

Rooms (each package's docstring lists its modules):

- ``targets/``: where the pipeline runs — the ``Target`` interface and registry, and one package
  per target (``dpdk``, ``bmv2``, ``p4dpdk``) with its process runner and runtime helpers.

Library modules shared by the CLI's commands, the targets and the testbed (none of them knows click):

- ``errors.py``: errors by category (usage, operational, needs-root, missing-dependency);
- ``settings.py``: a command's settings resolved: default < ``[control]`` < ``EMBNIC_*`` < flag;
- ``runstate.py``: the run directory, state files and pid checks of loaded pipelines;
- ``netns.py``: network namespaces and veth pairs (create, wire, address, run in, tear down);
- ``ctlsock.py``: the client of the card's control socket (embnic-dp, embnic-swx);
- ``buildinfo.py``: the build info embedded in the card binary (ELF reader);
- ``pcap.py``: the one pcap writer and reader;
- ``card_metrics.py``: Prometheus metrics of the card (``embnic exporter``) and the metrics HTTP server;
- ``plan.py``: capacity planning of a cluster config (``embnic plan``);
- ``wireshark.py`` (with ``wireshark.lua``): the Wireshark dissector generated from the field table
  (``embnic dissector``).
"""
