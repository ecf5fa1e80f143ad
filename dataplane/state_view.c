/* SPDX-License-Identifier: Apache-2.0
 *
 * The state map as the control path reads it, without a lock: its entry
 * array only, never its hash (except embnic_state_check, the consistency
 * walk fuzz-card runs after every burst while the TX stage does not).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_hash.h>

#include "embnic_dp.h"
#include "embnic_state.h"

static const char *const state_names[EMBNIC_NB_STATES] = {
	[EMBNIC_ST_FREE] = "free",
	[EMBNIC_ST_RECEIVING] = "receiving",
	[EMBNIC_ST_FORWARDED] = "forwarded",
	[EMBNIC_ST_REPLYING] = "replying",
};

const char *
embnic_state_name(unsigned int s)
{
	return s < EMBNIC_NB_STATES ? state_names[s] : "unknown";
}

void
embnic_state_count(const struct embnic_state *s,
		   struct embnic_state_summary *sum)
{
	memset(sum, 0, sizeof(*sum));
	sum->capacity = s->capacity;
	sum->entries = s->entries;
}

void
embnic_state_summarise(const struct embnic_state *s,
		       struct embnic_state_summary *sum)
{
	uint32_t i;

	embnic_state_count(s, sum);
	for (i = 0; i < s->capacity; i++) {
		uint8_t st = s->e[i].state;

		if (st < EMBNIC_NB_STATES)
			sum->by_state[st]++;
	}
}

unsigned int
embnic_state_dump(const struct embnic_state *s, struct embnic_state_view *out,
		  unsigned int max)
{
	unsigned int n = 0;
	uint32_t i;

	for (i = 0; i < s->capacity && n < max; i++) {
		const struct state_entry *e = &s->e[i];
		struct embnic_state_view *v = &out[n];

		v->state = e->state;
		if (v->state == EMBNIC_ST_FREE || v->state >= EMBNIC_NB_STATES)
			continue;
		v->client_id = e->client_id;
		v->msg_id = e->msg_id;
		v->shard_id = e->shard_id;
		v->num_tables = e->num_tables;
		v->msg_type = e->msg_type;
		v->rep_type = e->rep_type;
		v->msg_len = e->msg_len;
		v->num_keys = entry_num_keys(e);
		v->value_len = e->value_len;
		v->frag_count = e->frag_count;
		v->rep_frag_count = e->rep_frag_count;
		v->frags_in = e->frags_in;
		v->frags_out = e->frags_out;
		v->frames_in = e->frames_in;
		v->frames_out = e->frames_out;
		v->bytes_in = e->bytes_in;
		v->bytes_out = e->bytes_out;
		v->first_tsc = e->first_tsc;
		v->last_tsc = e->last_tsc;
		n++;
	}
	return n;
}

const struct embnic_shard_stats *
embnic_state_shard_stats(const struct embnic_state *s)
{
	return s->shards;
}

static unsigned int
bits_set(const uint64_t *b)
{
	unsigned int i, n = 0;

	for (i = 0; i < BITMAP_WORDS; i++)
		n += (unsigned int)__builtin_popcountll(b[i]);
	return n;
}

/* Is every bit of b at or past n clear? */
static bool
bits_below(const uint64_t *b, unsigned int n)
{
	unsigned int i;

	for (i = n; i < EMBNIC_MAX_FRAGS; i++)
		if (b[i >> 6] & (1ULL << (i & 63)))
			return false;
	return true;
}

/*
 * Do bytes (body bytes counted for the distinct fragments marked in b, frags
 * of them, of a message of n fragments and len bytes whose last fragment
 * is last_len bytes) and the geometry agree? The fragment size P fixed by
 * last_len; every fragment but the last P bytes; all n: exactly len.
 */
static bool
bytes_fit(const uint64_t *b, uint16_t n, uint16_t frags, uint32_t len,
	  uint16_t last_len, uint32_t bytes)
{
	uint64_t p, want;
	bool has_last;

	if (n == 1)
		return last_len == len && bytes == (frags ? len : 0);
	if (last_len == 0 || last_len > len ||
	    (len - last_len) % (uint32_t)(n - 1) != 0)
		return false;
	p = (len - last_len) / (uint32_t)(n - 1);
	if (last_len > p)
		return false;
	has_last = (b[(n - 1) >> 6] >> ((n - 1) & 63)) & 1;
	want = (uint64_t)(frags - has_last) * p + (has_last ? last_len : 0);
	return bytes == want && bytes <= len && (frags < n || bytes == len);
}

int
embnic_state_check(const struct embnic_state *s, char *err, size_t errlen)
{
	uint32_t i, live = 0;
	int32_t hn = rte_hash_count(s->h);
	uint8_t *seen;

	for (i = 0; i < s->capacity; i++) {
		const struct state_entry *e = &s->e[i];
		struct embnic_key16 key;
		void *data;

		if (e->state == EMBNIC_ST_FREE) {
			if (s->used[i >> 6] & (1ULL << (i & 63))) {
				snprintf(err, errlen, "free entry %u is marked "
					 "in use", i);
				return -1;
			}
			continue;
		}
		live++;
		if (e->state >= EMBNIC_NB_STATES)
			goto bad;
		key = entry_key(e);
		data = NULL;
		if (rte_hash_lookup_data(s->h, &key, &data) < 0 ||
		    (uintptr_t)data != i || !(s->used[i >> 6] & (1ULL << (i & 63)))) {
			snprintf(err, errlen, "entry %u (client %u msg %u): the "
				 "hash maps its key to %ld, in-use bit %d", i,
				 e->client_id, e->msg_id, (long)(uintptr_t)data,
				 (int)(s->used[i >> 6] >> (i & 63) & 1));
			return -1;
		}
		if (e->frag_count == 0 || e->frag_count > EMBNIC_MAX_FRAGS ||
		    e->frags_in > e->frag_count || e->frags_in == 0 ||
		    e->frames_in < e->frags_in ||
		    (e->frag_count > 1 && (bits_set(e->seen_in) != e->frags_in ||
		     !bits_below(e->seen_in, e->frag_count))) ||
		    (e->state == EMBNIC_ST_RECEIVING) !=
		    (e->frags_in < e->frag_count && e->frags_out == 0) ||
		    e->bytes_in > e->msg_len ||
		    (e->state == EMBNIC_ST_FORWARDED &&
		     e->bytes_in != e->msg_len) ||
		    !bytes_fit(e->seen_in, e->frag_count, e->frags_in,
			       e->msg_len, e->last_len, e->bytes_in))
			goto bad;
		if (e->state == EMBNIC_ST_REPLYING) {
			if (e->rep_frag_count == 0 ||
			    e->rep_frag_count > EMBNIC_MAX_FRAGS ||
			    e->frags_out == 0 ||
			    e->frags_out > e->rep_frag_count ||
			    /* answered: only while request fragments are
			     * still to come */
			    (e->frags_out == e->rep_frag_count &&
			     e->frags_in == e->frag_count) ||
			    e->frames_out < e->frags_out ||
			    (e->rep_frag_count > 1 &&
			     (bits_set(e->seen_out) != e->frags_out ||
			      !bits_below(e->seen_out, e->rep_frag_count))) ||
			    e->bytes_out > rep_msg_len(e) ||
			    !bytes_fit(e->seen_out, e->rep_frag_count,
				       e->frags_out, rep_msg_len(e),
				       e->rep_last_len, e->bytes_out))
				goto bad;
		} else if (e->frags_out != 0 || e->frames_out != 0) {
			goto bad;
		}
		continue;
bad:
		snprintf(err, errlen, "entry %u (client %u msg %u) is "
			 "inconsistent: state %u, request %u/%u fragments "
			 "(%u frames, %u of %u bytes, last %u), reply %u/%u "
			 "fragments (%u frames, %u of %u bytes, last %u)", i,
			 e->client_id, e->msg_id, e->state, e->frags_in,
			 e->frag_count, e->frames_in, e->bytes_in, e->msg_len,
			 e->last_len, e->frags_out, e->rep_frag_count,
			 e->frames_out, e->bytes_out, rep_msg_len(e),
			 e->rep_last_len);
		return -1;
	}
	if (live != s->entries || hn < 0 || (uint32_t)hn != live ||
	    s->nb_free + live != s->capacity) {
		snprintf(err, errlen, "%u live entries, count says %u, hash "
			 "holds %d, %u free of %u", live, s->entries, hn,
			 s->nb_free, s->capacity);
		return -1;
	}
	/* the free stack: distinct entries, each free */
	seen = calloc(s->capacity, 1);
	if (seen == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (i = 0; i < s->nb_free; i++) {
		uint32_t k = s->free_idx[i];

		if (k >= s->capacity || s->e[k].state != EMBNIC_ST_FREE ||
		    (s->used[k >> 6] & (1ULL << (k & 63))) || seen[k]) {
			snprintf(err, errlen, "free stack slot %u holds entry "
				 "%u, which is not free or is there twice",
				 i, k);
			free(seen);
			return -1;
		}
		seen[k] = 1;
	}
	free(seen);
	return 0;
}
