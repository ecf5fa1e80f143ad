/* SPDX-License-Identifier: Apache-2.0
 *
 * The state map's layout, shared by state.c and state_view.c alone;
 * everyone else holds a struct embnic_state * through embnic_dp.h.
 */
#ifndef EMBNIC_STATE_H
#define EMBNIC_STATE_H

#include <stdint.h>

#include <rte_common.h>
#include <rte_hash.h>

#include "embnic_dp.h"

#define BITMAP_WORDS	(EMBNIC_MAX_FRAGS / 64)

/*
 * One message in flight. The first cache line is all a single-fragment
 * message touches; the bitmaps of the second are read and written only for
 * messages of several fragments.
 */
struct state_entry {
	uint64_t first_tsc;		/* the request's first frame */
	uint64_t last_tsc;		/* the last frame either way */
	uint32_t msg_id;
	uint32_t msg_len;		/* request */
	uint32_t value_len;		/* row bytes: of a lookup's reply, of an
					 * update's gradients (num_keys is not
					 * kept: msg_len, the type, num_tables
					 * and value_len fix it, entry_num_keys) */
	uint32_t bytes_in, bytes_out;	/* body bytes of distinct fragments */
	uint16_t client_id, shard_id, num_tables;
	uint16_t frag_count, rep_frag_count;
	/* the fragment size each way, as its first-seen fragment implies it
	 * (embnic_frag_last_len: the last fragment's length) */
	uint16_t last_len, rep_last_len;
	uint16_t frags_in, frags_out;	/* distinct fragments seen */
	uint16_t frames_in, frames_out;	/* frames passed, duplicates too
					 * (saturating) */
	uint8_t msg_type, rep_type;	/* the reply's from its first fragment */
	volatile uint8_t state;		/* enum embnic_msg_state */
	/* second cache line */
	uint64_t seen_in[BITMAP_WORDS] __rte_cache_aligned;
	uint64_t seen_out[BITMAP_WORDS];
} __rte_cache_aligned;
static_assert(offsetof(struct state_entry, seen_in) == RTE_CACHE_LINE_SIZE,
	      "a single-fragment message touches one cache line");
static_assert(EMBNIC_MAX_FRAGS % 64 == 0, "bitmap of whole words");

struct embnic_state {
	struct rte_hash *h;		/* key -> entry index (as the key's data) */
	struct state_entry *e;		/* [capacity] */
	uint32_t *free_idx;		/* [capacity]: a stack of free entries */
	uint32_t nb_free;
	uint64_t *used;			/* [words]: a bit per entry in use, so
					 * the expiry scan reads only those */
	uint32_t words;
	struct embnic_shard_stats *shards;	/* [EMBNIC_SHARD_SLOTS] */
	const uint16_t *shard_slot;	/* shard id -> slot (app) */
	uint32_t capacity;
	volatile uint32_t entries;
	uint64_t timeout_tsc;
	uint64_t tsc_hz;
	double ns_per_tsc;
	uint64_t next_scan_tsc, scan_period_tsc;
	uint32_t cursor, chunk;		/* in words of used[] */
};

/* The key of the message an entry holds: client_id << 32 | msg_id. */
static inline struct embnic_key16
entry_key(const struct state_entry *e)
{
	return embnic_key16((uint64_t)e->client_id << 32 | e->msg_id);
}

/*
 * Body bytes of the entry's reply: not kept, as a reply's msg_len is its
 * type's formula of value_len alone (checked by the parser; a LOOKUP_REPLY's
 * value_len against the request's by on_reply) or of nothing.
 */
static inline uint32_t
rep_msg_len(const struct state_entry *e)
{
	return (uint32_t)embnic_expected_msg_len(e->rep_type, 0, 0,
						 e->value_len);
}

/*
 * The request's num_keys, not kept: msg_len is the type's formula of
 * num_tables, num_keys and value_len, which the entry keeps.
 */
static inline uint32_t
entry_num_keys(const struct state_entry *e)
{
	uint64_t dir = (uint64_t)EMBNIC_DIR_ENTRY * e->num_tables;

	switch (e->msg_type) {
	case EMBNIC_LOOKUP_REQ:
		return (uint32_t)((e->msg_len - dir) / EMBNIC_KEY_SIZE);
	case EMBNIC_UPDATE_REQ:
		return (uint32_t)((e->msg_len - dir - e->value_len) /
				  EMBNIC_KEY_SIZE);
	case EMBNIC_SIZE_REQ:
		return e->msg_len / EMBNIC_SIZE_ENTRY;
	default:
		return 0;
	}
}

#endif /* EMBNIC_STATE_H */
