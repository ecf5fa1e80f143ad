"""The ``dpdk`` target and the DPDK processes embnic runs.

- ``target.py``: :class:`DpdkTarget` — load, program, read and unload ``embnic-dp``;
- ``process.py``: every DPDK primary process (EAL arguments, start, readiness, stop, runtime dir),
  also used by the ``p4dpdk`` target, the testbed and the benchmarks;
- ``pci.py``: the card on a real NIC — PCI addresses, driver binding, hugepages;
- ``xdp.py``: the card's ``net_af_xdp`` ports — devargs, XDP hooks, limits.
"""
