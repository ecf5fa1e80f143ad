"""The parameter-server shard: a UDP server holding its slice of the embedding tables.

Its modules, lower ones first (none imports one above it), are listed in docs/architecture.md
("The parts"); the serving loop is ``engine``, its state and rules ``shard_state``, a shard as a
process of its own ``foreground`` (``python -m embnic.testbed.server``), shards on threads
``runner``. The readable reference shard and the numpy oracle of the C path are test oracles:
``tests/testbed/reference_shard.py``, ``tests/testbed/shard_oracle.py``.
"""
