"""The ``bmv2`` target: the P4 program (p4/, v1model) on BMv2.

- ``target.py``: :class:`Bmv2Target` — load, program, read and unload ``simple_switch``;
- ``switch.py``: compile the program, run ``simple_switch`` in its own netns, talk to it;
- ``runtime.py``: the card's runtime state — table entries in, counters and registers out;
- ``p4runtime.py``: the P4Runtime client (``simple_switch_grpc``): pipeline, table entries.
"""
