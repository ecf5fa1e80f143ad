"""The parameter-server shard: a UDP server holding its slice of the embedding tables (:mod:`.shard`)."""
