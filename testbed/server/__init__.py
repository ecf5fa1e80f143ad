"""The parameter-server shard: a UDP server holding its slice of the embedding tables.

Modules, a line each (lower ones first; none imports one above it):

- ``shard_metrics``: the shard's Prometheus collector and per-message service times.
- ``udpio``: batched UDP system calls (``recvmmsg``/``sendmmsg``, UDP GSO) on preallocated buffers.
- ``rowcache``, ``fsdirs``, ``diskstore``, ``disktable``: the disk tier, RocksDB behind a cache of hot rows (``embnic[disk]``).
- ``window``: the exactly-once window (every acknowledged update by id and fingerprint; polls).
- ``stores``: each table's row store (the in-memory arena or the disk tier); ``shard-<id>`` directories.
- ``durability``: the write-ahead log and checkpoints of a shard.
- ``tables_io``: ``embnic tables export``/``import`` of every shard's rows.
- ``worker_hub``: the rows of ``--workers N`` worker processes and their sub-requests to each other.
- ``shard_state``: the shard's state and every protocol rule (``ShardState``: stores, window, log,
  counters; header, table and gradient checks, exactly once, rows), held by the serving loop.
- ``canswer``: the C intake and answer path (``csrc/intake.c``, ``answer.c``, ``store.c``,
  ``send.c``) through ctypes: header checks, grouping of fragments, lookups, reply frames, sending.
- ``intake``: the serving loop's reassembly of messages across wake-ups.
- ``engine``: the serving loop (``BatchShardServer``): a state, an intake and the answer path
  around one poll loop.
- ``runner``: shards on threads of this process (tests, benchmarks, in-process clusters).
- ``foreground``: a shard as its own process (``run_server``; worker processes behind one address).
- ``__main__``: ``python -m embnic.testbed.server``, what the namespace testbed starts.

The readable one-datagram-at-a-time reference shard and the numpy oracle of the C path are
test oracles: ``tests/testbed/reference_shard.py``, ``tests/testbed/shard_oracle.py``.
"""
