"""The parameter-server shard: a UDP server holding its slice of the embedding tables.

Modules, a line each (lower ones first; none imports one above it):

- ``metrics``: the shard's Prometheus collector and per-message service times.
- ``udpio``: batched UDP system calls (``recvmmsg``/``sendmmsg``, UDP GSO) on preallocated buffers.
- ``cintake``: the C header checks and fragment grouping (``dataplane/shard/intake.c``) through ctypes.
- ``canswer``: the C answer path (``dataplane/shard/answer.c``, ``store.c``, ``send.c``) through ctypes.
- ``diskstore``: the disk tier, RocksDB behind a cache of hot rows (``embnic[disk]``).
- ``window``: the exactly-once window (every acknowledged update by id and fingerprint; polls).
- ``stores``: each table's row store (the in-memory arena or the disk tier); ``shard-<id>`` directories.
- ``durability``: the write-ahead log and checkpoints of a shard.
- ``tables_io``: ``embnic tables export``/``import`` of every shard's rows.
- ``peers``: the rows of ``--workers N`` worker processes and their sub-requests to each other.
- ``shard``: the readable reference engine (asyncio, a datagram at a time) and every protocol rule.
- ``intake``: the batch engine's header checks of a wake-up and its reassembly.
- ``replies``: the batch engine's reply builder (one transmit buffer, one ``sendmmsg`` per wake-up).
- ``engine``: the batch engine, an intake, a reply builder and the table store around one poll loop.
- ``runner``: shards on threads of this process (tests, benchmarks, in-process clusters).
- ``foreground``: a shard as its own process (``run_server``; worker processes behind one address).
- ``__main__``: ``python -m embnic.testbed.server``, what the namespace testbed starts.
"""
