"""The network-namespace testbed and its faults; its modules, one job each: docs/architecture.md
(namespaces and veth pairs themselves are made by :mod:`embnic.control.netns`)."""
