"""The ``p4dpdk`` target: the P4 program for PNA (p4/pna/) in DPDK's SWX pipeline.

- ``target.py``: :class:`P4DpdkTarget` — load, program, read and unload ``embnic-swx``;
- ``swx.py``: build the SWX pipeline (p4c-dpdk, codegen, gcc), run ``embnic-swx``, talk to it.
"""
