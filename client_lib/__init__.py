"""embnic client library: what a training job links (protocol, batches, transport).

Modules:

* ``backend`` — the backend contract (``Backend``): where rows live, a round of every table per call
* ``client`` — ``EmbeddingClient``: the shards as a backend, lookups and updates as embnic messages over UDP
* ``local`` — ``LocalBackend``: the in-process reference backend, every table whole in this process
* ``torch`` — the PyTorch / TorchRec front end (``RemoteEmbeddingBagCollection`` and its sharder; ``embnic[torch]``)
* ``torch_kjt``, ``torch_optim`` — its input checks and VBE reshaping, its checks of TorchRec's optimizer choices
* ``batch`` — batch preparation: KeyedJaggedTensor-style batches → per-table value/index/offset arrays, pooling
* ``precheck`` — the checks of a whole lookup or update round before any of it is sent or applied
* ``roundplan`` — a round's plan (``RoundPlan``): keys grouped by shard, cut into messages, the replies' layout
* ``native`` — the client's round in C (``csrc/``: the plan and the transport, built with the package) through ctypes
* ``clib`` — the package's C libraries found, loaded and checked (sources digest, protocol version)
* ``reassembly`` — reassembly of fragmented messages
* ``rtt`` — the bounds of the retransmission timeout (RFC 6298) and their check
* ``routing`` — which shard holds an id
* ``codec`` — frames encoded and decoded with numpy/struct (no Scapy on the hot path)
* ``protocol`` — the embnic v2 header as a Scapy layer
* ``consts`` — the wire protocol's constants, defined once
* ``config`` — the cluster config (one TOML file every command reads)
* ``table_numerics`` — row initialisation, SGD and row-wise Adagrad, the update rules (shared with the shards)
* ``rowstore`` — the row store: one arena and one index for a shard's tables (shared with the shards)
* ``splitmix`` — SplitMix64, the one 64-bit mixing function
* ``sockets`` — UDP socket set-up shared by the client and the shard server
* ``stats`` — one client's counters (``ClientStats``)
* ``errors`` — the client library's errors
"""
