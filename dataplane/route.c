/* SPDX-License-Identifier: Apache-2.0
 *
 * The route table (shard id -> peer) and the client table (client id ->
 * peer): one implementation, two instances.
 *
 * An rte_hash with lock-free readers (RW_CONCURRENCY_LF): the TX stage
 * looks up from its lcore while the main lcore adds and deletes. Each key's
 * data is a pointer to an immutable struct embnic_peer. A changed entry is
 * replaced by a new peer, and an old peer is freed only after every reader
 * has passed a quiescent state (RCU QSBR; for deletes through the hash's
 * own integration, rte_hash_rcu_qsbr_add in SYNC mode). Readers never lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_debug.h>
#include <rte_hash.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_rcu_qsbr.h>

#include "embnic_dp.h"

/*
 * The TX stage looks up the distinct ids of a burst: a handful (shards,
 * clients). Up to this many, one lookup each costs less than the bulk
 * lookup's fixed work (measured: the two lookups of a burst took a quarter
 * of the TX stage's time).
 */
#define SINGLE_LOOKUPS_MAX	8

struct embnic_table {
	struct rte_hash *h;
	struct rte_rcu_qsbr *qsbr;
	uint32_t size;
};

static void
peer_free(void *p __rte_unused, void *key_data)
{
	rte_free(key_data);
}

struct embnic_table *
embnic_table_create(const char *name, uint32_t size, struct rte_rcu_qsbr *qsbr)
{
	struct rte_hash_rcu_config rcu = {
		.v = qsbr,
		.mode = RTE_HASH_QSBR_MODE_SYNC,
		.free_key_data_func = peer_free,
	};
	struct embnic_table *t;

	t = rte_zmalloc(name, sizeof(*t), RTE_CACHE_LINE_SIZE);
	if (t == NULL)
		return NULL;
	t->size = size;
	t->qsbr = qsbr;
	t->h = embnic_key16_hash_create(name, size,
					RTE_HASH_EXTRA_FLAGS_RW_CONCURRENCY_LF |
					RTE_HASH_EXTRA_FLAGS_EXT_TABLE);
	if (t->h == NULL) {
		rte_free(t);
		return NULL;
	}
	rcu.key_data_ptr = t;
	if (rte_hash_rcu_qsbr_add(t->h, &rcu) != 0) {
		rte_hash_free(t->h);
		rte_free(t);
		return NULL;
	}
	return t;
}

void
embnic_table_free(struct embnic_table *t)
{
	const void *key;
	void *data;
	uint32_t next = 0;

	if (t == NULL)
		return;
	/* readers are gone: free the peers, then the hash */
	while (rte_hash_iterate(t->h, &key, &data, &next) >= 0)
		rte_free(data);
	rte_hash_free(t->h);
	rte_free(t);
}

int
embnic_table_add(struct embnic_table *t, const struct embnic_peer *p)
{
	struct embnic_peer *n;
	void *old = NULL;
	struct embnic_key16 key = embnic_key16(p->id);
	int ret;

	if (rte_hash_lookup_data(t->h, &key, &old) < 0) {
		old = NULL;
		if ((uint32_t)rte_hash_count(t->h) >= t->size)
			return -ENOSPC;
	}
	n = rte_malloc("embnic_peer", sizeof(*n), 0);
	if (n == NULL)
		return -ENOMEM;
	*n = *p;
	ret = rte_hash_add_key_data(t->h, &key, n);
	if (ret < 0) {
		rte_free(n);
		return ret;
	}
	if (old != NULL) {
		/* readers may still hold the old peer: wait them out */
		rte_rcu_qsbr_synchronize(t->qsbr, RTE_QSBR_THRID_INVALID);
		rte_free(old);
	}
	return 0;
}

int
embnic_table_del(struct embnic_table *t, uint32_t id)
{
	struct embnic_key16 key = embnic_key16(id);
	int32_t ret = rte_hash_del_key(t->h, &key);

	return ret < 0 ? ret : 0;
}

void
embnic_table_lookup_bulk(struct embnic_table *t, const uint32_t *ids,
			 unsigned int n, const struct embnic_peer **out)
{
	struct embnic_key16 k[EMBNIC_MAX_BURST];
	const void *keys[EMBNIC_MAX_BURST];
	hash_sig_t sig[EMBNIC_MAX_BURST];
	void *data[EMBNIC_MAX_BURST];
	uint64_t hits = 0;
	unsigned int i;

	if (n == 0)
		return;
	for (i = 0; i < n; i++) {
		k[i] = embnic_key16(ids[i]);
		keys[i] = &k[i];
		sig[i] = embnic_key16_hash(&k[i]);
	}
	if (n <= SINGLE_LOOKUPS_MAX) {
		for (i = 0; i < n; i++)
			out[i] = rte_hash_lookup_with_hash_data(t->h, keys[i],
					sig[i], &data[i]) >= 0 ? data[i] : NULL;
		return;
	}
	rte_hash_lookup_with_hash_bulk_data(t->h, keys, sig, n, &hits, data);
	for (i = 0; i < n; i++)
		out[i] = (hits >> i) & 1 ? data[i] : NULL;
}

static int
peer_cmp(const void *a, const void *b)
{
	const struct embnic_peer *x = a, *y = b;

	return (x->id > y->id) - (x->id < y->id);
}

unsigned int
embnic_table_copy(struct embnic_table *t, struct embnic_peer *out,
		  unsigned int max)
{
	const void *key;
	void *data;
	uint32_t next = 0;
	unsigned int n = 0;

	while (n < max && rte_hash_iterate(t->h, &key, &data, &next) >= 0)
		out[n++] = *(const struct embnic_peer *)data;
	qsort(out, n, sizeof(*out), peer_cmp);
	return n;
}

uint32_t
embnic_table_count(const struct embnic_table *t)
{
	int32_t n = rte_hash_count(t->h);

	return n < 0 ? 0 : (uint32_t)n;
}

uint32_t
embnic_table_size(const struct embnic_table *t)
{
	return t->size;
}
