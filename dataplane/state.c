/* SPDX-License-Identifier: Apache-2.0
 *
 * The message state map: the TX stage's side (create, update, expire,
 * reset), then the control path's (counts, dump, per-shard statistics) and
 * the consistency check. The rules it keeps are docs/protocol.md's "The
 * card's state map"; its place in the card: README ("Design notes").
 *
 * An rte_hash keyed by (client id, message id) whose data is the index of
 * the message's entry in a fixed array; free entries are a stack (the one
 * freed last, still in cache, is the next opened). One map per partition
 * (embnic_partition), touched by its state lcore alone: no lock. The
 * control path reads the entry arrays (never a hash), so a dump may see an
 * entry mid-update but never freed memory.
 *
 * An ERROR may come before the whole request passed (a shard refusing a
 * message at its fragment 0 answers at once): the entry is then answered
 * and stays until the request's remaining fragments have passed, so that
 * they do not open an entry nobody answers; for anything else an answered
 * entry is as good as freed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_debug.h>
#include <rte_hash.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_prefetch.h>

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

#define SCAN_PERIOD_US	1000	/* expiry scan at most every 1 ms ... */
#define SCAN_SWEEP	100	/* ... covering the map in 100 scans */

/* The key of a message: client_id << 32 | msg_id. */
static inline struct embnic_key16
state_key(const struct embnic_msg *m)
{
	return embnic_key16((uint64_t)m->client_id << 32 | m->msg_id);
}

struct embnic_state *
embnic_state_create(unsigned int part, uint32_t size, uint32_t timeout_ms,
		    uint64_t tsc_hz, const uint16_t *shard_slot)
{
	char name[RTE_HASH_NAMESIZE];
	struct embnic_state *s;

	snprintf(name, sizeof(name), "embnic_state%u", part);
	s = rte_zmalloc("embnic_state", sizeof(*s), RTE_CACHE_LINE_SIZE);
	if (s == NULL)
		return NULL;
	s->capacity = size;
	s->tsc_hz = tsc_hz;
	s->ns_per_tsc = 1e9 / (double)tsc_hz;
	s->timeout_tsc = (uint64_t)timeout_ms * (tsc_hz / 1000);
	s->scan_period_tsc = tsc_hz / 1000000 * SCAN_PERIOD_US;
	s->words = (size + 63) / 64;
	s->chunk = (s->words + SCAN_SWEEP - 1) / SCAN_SWEEP;
	s->shard_slot = shard_slot;
	s->e = rte_zmalloc("embnic_state_entries",
			   (size_t)size * sizeof(s->e[0]), RTE_CACHE_LINE_SIZE);
	s->free_idx = rte_malloc("embnic_state_free",
				 (size_t)size * sizeof(s->free_idx[0]), 0);
	s->used = rte_zmalloc("embnic_state_used", (size_t)s->words * sizeof(s->used[0]),
			      RTE_CACHE_LINE_SIZE);
	s->shards = rte_zmalloc("embnic_shard_stats",
				EMBNIC_SHARD_SLOTS * sizeof(s->shards[0]),
				RTE_CACHE_LINE_SIZE);
	s->h = embnic_key16_hash_create(name, size,
					 RTE_HASH_EXTRA_FLAGS_EXT_TABLE);
	if (s->e == NULL || s->free_idx == NULL || s->used == NULL ||
	    s->shards == NULL || s->h == NULL) {
		embnic_state_free(s);
		return NULL;
	}
	embnic_state_reset(s, 0);	/* fills the free stack */
	return s;
}

void
embnic_state_free(struct embnic_state *s)
{
	if (s == NULL)
		return;
	rte_hash_free(s->h);
	rte_free(s->free_idx);
	rte_free(s->used);
	rte_free(s->shards);
	rte_free(s->e);
	rte_free(s);
}

static inline void
entry_init(struct state_entry *e, const struct embnic_msg *m, uint64_t now)
{
	e->first_tsc = now;
	e->last_tsc = now;
	e->msg_id = m->msg_id;
	e->msg_len = m->msg_len;
	e->value_len = m->value_len;
	e->bytes_in = 0;
	e->bytes_out = 0;
	e->client_id = m->client_id;
	e->shard_id = m->shard_id;
	e->num_tables = m->num_tables;
	e->frag_count = m->frag_count;
	e->rep_frag_count = 0;
	e->last_len = embnic_frag_last_len(m);
	e->rep_last_len = 0;
	e->frags_in = 0;
	e->frags_out = 0;
	e->frames_in = 0;
	e->frames_out = 0;
	e->msg_type = m->msg_type;
	e->rep_type = 0;
	if (m->frag_count > 1)
		memset(e->seen_in, 0, sizeof(e->seen_in));
	e->state = EMBNIC_ST_RECEIVING;
}

/*
 * Mark fragment i of n in bitmap b; true if it is the first time. A
 * message of one fragment needs no bitmap: seen says whether it was.
 */
static inline bool
mark(uint64_t *b, uint16_t i, uint16_t n, uint16_t seen)
{
	uint64_t bit;

	if (n == 1)
		return seen == 0;
	bit = 1ULL << (i & 63);
	if (b[i >> 6] & bit)
		return false;
	b[i >> 6] |= bit;
	return true;
}

static inline uint16_t
sat_inc(uint16_t v)
{
	return v == UINT16_MAX ? v : v + 1;
}

/*
 * Does request frame m contradict the request the entry was opened by: its
 * header, or where its fragments lie (cut at another fragment size, it
 * would overlap another fragment or leave a gap)?
 */
static inline bool
request_differs(const struct state_entry *e, const struct embnic_msg *m)
{
	return e->msg_type != m->msg_type || e->msg_len != m->msg_len ||
		e->value_len != m->value_len || e->num_tables != m->num_tables ||
		e->shard_id != m->shard_id || e->frag_count != m->frag_count ||
		e->last_len != embnic_frag_last_len(m);
}


/*
 * Has the whole reply passed while some request fragments have not
 * (answered: the shard refused the message with an ERROR before the whole
 * request came)? Such an entry waits only for the rest of its request.
 */
static inline bool
entry_answered(const struct state_entry *e)
{
	return e->state == EMBNIC_ST_REPLYING &&
		e->frags_out == e->rep_frag_count;
}

/*
 * Request frame m of an answered entry that is not one of the fragments
 * still to come (one already seen, or one contradicting the entry): a new
 * message with the same ids (a client re-sending), as if the entry had
 * been freed when its reply passed.
 */
static inline bool
answered_reopens(const struct state_entry *e, const struct embnic_msg *m)
{
	return request_differs(e, m) ||
		(e->seen_in[m->frag_index >> 6] >> (m->frag_index & 63)) & 1;
}

/* 0 to send; a drop reason; 1 to send and free the entry (the last
 * fragment of an answered entry's request). */
static inline int
on_request(struct state_entry *e, const struct embnic_msg *m, uint64_t now)
{
	if (unlikely(request_differs(e, m)))
		return EMBNIC_DROP_FRAG_MISMATCH;
	if (mark(e->seen_in, m->frag_index, e->frag_count, e->frags_in)) {
		e->frags_in++;
		e->bytes_in += m->frag_len;
		if (e->frags_in == e->frag_count) {
			/* one fragment size: every byte once */
			RTE_ASSERT(e->bytes_in == e->msg_len);
			if (e->state == EMBNIC_ST_RECEIVING)
				e->state = EMBNIC_ST_FORWARDED;
			else if (unlikely(entry_answered(e)))
				return 1;
		}
	}
	e->frames_in = sat_inc(e->frames_in);
	e->last_tsc = now;
	return 0;
}

/* Does reply type r answer request type q? */
static inline bool
answers(uint8_t q, uint8_t r)
{
	return r == EMBNIC_ERROR ||
		(q == EMBNIC_LOOKUP_REQ && r == EMBNIC_LOOKUP_REPLY) ||
		(q == EMBNIC_UPDATE_REQ && (r == EMBNIC_UPDATE_ACK || r == EMBNIC_UPDATE_NACK)) ||
		(q == EMBNIC_SIZE_REQ && r == EMBNIC_SIZE_ACK);
}

/* Latency histogram bucket of ns (docs/control-socket.md). */
static inline unsigned int
lat_bucket(uint64_t ns)
{
	uint64_t us = ns / 1000;
	unsigned int b;

	if (us == 0)
		return 0;
	b = 64 - (unsigned int)__builtin_clzll(us);
	return b < EMBNIC_LAT_BUCKETS ? b : EMBNIC_LAT_BUCKETS - 1;
}

static inline struct embnic_shard_stats *
shard_stats(struct embnic_state *s, uint16_t shard_id)
{
	return &s->shards[__atomic_load_n(&s->shard_slot[shard_id],
					  __ATOMIC_ACQUIRE)];
}

/* 0 to send; a drop reason; 1 when the reply is complete (send; free the
 * entry unless it is an ERROR and request fragments are still to come:
 * answered). */
static inline int
on_reply(struct embnic_state *s, struct state_entry *e,
	 const struct embnic_msg *m, uint64_t now)
{
	struct embnic_shard_stats *ss;
	uint64_t ns;

	if (unlikely(entry_answered(e)))	/* as if freed */
		return EMBNIC_DROP_UNSOLICITED_REPLY;
	if (unlikely(e->shard_id != m->shard_id))
		return EMBNIC_DROP_WRONG_SHARD_REPLY;
	if (unlikely(!answers(e->msg_type, m->msg_type)))
		return EMBNIC_DROP_WRONG_REPLY_TYPE;
	/* a lookup's rows are as long as its request announced */
	if (unlikely(m->msg_type == EMBNIC_LOOKUP_REPLY &&
		     m->value_len != e->value_len))
		return EMBNIC_DROP_BAD_REPLY_LEN;
	if (e->frags_out == 0 && e->state != EMBNIC_ST_REPLYING) {
		/* the first reply fragment: what the whole reply is (its
		 * msg_len follows from its type: rep_msg_len) */
		e->rep_type = m->msg_type;
		e->rep_frag_count = m->frag_count;
		e->rep_last_len = embnic_frag_last_len(m);
		if (m->frag_count > 1)
			memset(e->seen_out, 0, sizeof(e->seen_out));
		e->state = EMBNIC_ST_REPLYING;
	} else if (unlikely(e->rep_type != m->msg_type ||
			    e->rep_frag_count != m->frag_count ||
			    e->rep_last_len != embnic_frag_last_len(m))) {
		return EMBNIC_DROP_FRAG_MISMATCH;
	}
	if (mark(e->seen_out, m->frag_index, e->rep_frag_count,
		 e->frags_out)) {
		e->frags_out++;
		e->bytes_out += m->frag_len;
	}
	e->frames_out = sat_inc(e->frames_out);
	e->last_tsc = now;
	if (e->frags_out < e->rep_frag_count)
		return 0;
	RTE_ASSERT(e->bytes_out == rep_msg_len(e));
	/* the whole reply passed: count what the message leaves behind */
	ns = (uint64_t)((double)(now - e->first_tsc) * s->ns_per_tsc);
	ss = shard_stats(s, e->shard_id);
	ss->completed[e->rep_type]++;
	ss->latency_sum_ns += ns;
	ss->latency_hist[lat_bucket(ns)]++;
	return 1;
}

/* Open an entry for key k: its index, or -1 when the map is full. */
static inline int32_t
entry_open(struct embnic_state *s, const struct embnic_key16 *k,
	   hash_sig_t sig)
{
	uint32_t idx;

	if (unlikely(s->nb_free == 0))
		return -1;
	idx = s->free_idx[s->nb_free - 1];
	if (unlikely(rte_hash_add_key_with_hash_data(s->h, k, sig,
			(void *)(uintptr_t)idx) < 0))
		return -1;
	s->nb_free--;
	s->entries++;
	s->used[idx >> 6] |= 1ULL << (idx & 63);
	return (int32_t)idx;
}

static inline void
entry_free(struct embnic_state *s, struct state_entry *e,
	   const struct embnic_key16 *k, hash_sig_t sig)
{
	uint32_t idx = (uint32_t)(e - s->e);

	rte_hash_del_key_with_hash(s->h, k, sig);
	e->state = EMBNIC_ST_FREE;
	s->used[idx >> 6] &= ~(1ULL << (idx & 63));
	s->free_idx[s->nb_free++] = idx;
	s->entries--;
}

void
embnic_state_update_burst(struct embnic_state *s,
			  const struct embnic_msg *const *msgs, unsigned int n,
			  uint64_t now, int *verdict,
			  struct embnic_lcore_stats *st)
{
	/*
	 * One slot per distinct message of the burst: its key, signature and
	 * position, kept current as entries are opened and freed, so a
	 * request, its reply and a new request with the same ids may share a
	 * burst.
	 */
	struct embnic_key16 keys[EMBNIC_MAX_BURST];
	const void *kp[EMBNIC_MAX_BURST];
	hash_sig_t sig[EMBNIC_MAX_BURST];
	int32_t pos[EMBNIC_MAX_BURST];
	uint8_t slot[EMBNIC_MAX_BURST];
	uint8_t first[EMBNIC_MAX_BURST];	/* a slot's first frame */
	uint8_t fresh[EMBNIC_MAX_BURST];	/* opened above, not yet set */
	uint64_t seen[4] = { 0 };	/* a 256-bit filter of the slots' sigs */
	void *data[EMBNIC_MAX_BURST];
	uint64_t hits = 0;
	unsigned int i, k, u = 0;

	if (n == 0)
		return;
	for (i = 0; i < n; i++) {
		struct embnic_key16 key = state_key(msgs[i]);
		hash_sig_t h;
		uint64_t bit;

		/* fragments of one message come in a row: try the last one */
		if (u > 0 && keys[u - 1].lo == key.lo) {
			slot[i] = (uint8_t)(u - 1);
			continue;
		}
		h = embnic_key16_hash(&key);
		bit = 1ULL << (h & 63);
		if (seen[(h >> 6) & 3] & bit) {	/* maybe seen: look */
			for (k = 0; k + 1 < u && keys[k].lo != key.lo; k++)
				;
			if (k + 1 < u) {
				slot[i] = (uint8_t)k;
				continue;
			}
		}
		seen[(h >> 6) & 3] |= bit;
		keys[u] = key;
		kp[u] = &keys[u];
		sig[u] = h;
		first[u] = (uint8_t)i;
		slot[i] = (uint8_t)u++;
	}
	rte_hash_lookup_with_hash_bulk_data(s->h, kp, sig, u, &hits, data);
	/*
	 * Open the entries of messages whose first frame in the burst is a
	 * request now, and fetch every entry's line before the frames are
	 * handled, so that misses overlap instead of being waited for one at
	 * a time. A failed open (full map) is retried in order below.
	 */
	for (k = 0; k < u; k++) {
		pos[k] = (hits >> k) & 1 ? (int32_t)(uintptr_t)data[k] : -1;
		fresh[k] = 0;
		if (pos[k] < 0 && embnic_is_request(msgs[first[k]]->msg_type)) {
			pos[k] = entry_open(s, &keys[k], sig[k]);
			fresh[k] = pos[k] >= 0;
		}
		if (pos[k] >= 0)
			rte_prefetch0(&s->e[pos[k]]);
	}

	for (i = 0; i < n; i++) {
		const struct embnic_msg *m = msgs[i];
		unsigned int r = slot[i];
		struct state_entry *e;
		int32_t p = pos[r];
		int v;

		if (!embnic_is_request(m->msg_type)) {
			if (p < 0) {
				verdict[i] = EMBNIC_DROP_UNSOLICITED_REPLY;
				continue;
			}
			e = &s->e[p];
			v = on_reply(s, e, m, now);
			if (v == 1) {
				st->completed[e->rep_type]++;
				if (likely(e->frags_in == e->frag_count ||
					   e->rep_type != EMBNIC_ERROR)) {
					entry_free(s, e, &keys[r], sig[r]);
					pos[r] = -1;
				}
				v = 0;
			}
			verdict[i] = v;
			continue;
		}
		if (fresh[r]) {
			fresh[r] = 0;
			entry_init(&s->e[p], m, now);
		} else if (p < 0) {
			p = entry_open(s, &keys[r], sig[r]);
			if (unlikely(p < 0)) {
				st->state_overflow++;
				verdict[i] = EMBNIC_DROP_STATE_FULL;
				continue;
			}
			pos[r] = p;
			entry_init(&s->e[p], m, now);
		} else if (unlikely(entry_answered(&s->e[p])) &&
			   answered_reopens(&s->e[p], m)) {
			entry_init(&s->e[p], m, now);
		}
		e = &s->e[p];
		v = on_request(e, m, now);
		if (unlikely(v == 1)) {
			/* an answered entry's request is whole: free it */
			entry_free(s, e, &keys[r], sig[r]);
			pos[r] = -1;
			v = 0;
		}
		verdict[i] = v;
	}
}

void
embnic_state_expire_step(struct embnic_state *s, uint64_t now,
			 struct embnic_lcore_stats *st)
{
	uint32_t k;

	if (now < s->next_scan_tsc)
		return;
	s->next_scan_tsc = now + s->scan_period_tsc;
	for (k = 0; k < s->chunk; k++) {
		uint32_t w = s->cursor;
		uint64_t bits = s->used[w];

		if (++s->cursor >= s->words)
			s->cursor = 0;
		while (bits != 0) {
			uint32_t idx = w * 64 + (uint32_t)__builtin_ctzll(bits);
			struct state_entry *e = &s->e[idx];
			struct embnic_key16 key;

			bits &= bits - 1;
			if (now - e->last_tsc <= s->timeout_tsc)
				continue;
			st->state_expired++;
			shard_stats(s, e->shard_id)->expired++;
			key = entry_key(e);
			entry_free(s, e, &key, embnic_key16_hash(&key));
		}
	}
}

void
embnic_state_reset(struct embnic_state *s, uint32_t nb_slots)
{
	rte_hash_reset(s->h);
	memset(s->e, 0, (size_t)s->capacity * sizeof(s->e[0]));
	memset(s->shards, 0, RTE_MIN(nb_slots, (uint32_t)EMBNIC_SHARD_SLOTS) *
	       sizeof(s->shards[0]));
	memset(s->used, 0, (size_t)s->words * sizeof(s->used[0]));
	for (s->nb_free = 0; s->nb_free < s->capacity; s->nb_free++)
		s->free_idx[s->nb_free] = s->capacity - 1 - s->nb_free;
	s->entries = 0;
	s->cursor = 0;
	s->next_scan_tsc = 0;
}

/*
 * ---- the map as the control path reads it, without a lock: its entry
 * array only, never its hash (except embnic_state_check, the consistency
 * walk fuzz-card runs after every burst while the TX stage does not) ----
 */

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
embnic_state_summarise(const struct embnic_state *s, bool by_state,
		       struct embnic_state_summary *sum)
{
	uint32_t i;

	memset(sum, 0, sizeof(*sum));
	sum->capacity = s->capacity;
	sum->entries = s->entries;
	for (i = 0; by_state && i < s->capacity; i++) {
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
		uint8_t st = e->state;

		if (st == EMBNIC_ST_FREE || st >= EMBNIC_NB_STATES)
			continue;
		out[n++] = (struct embnic_state_view){
			.state = st, .client_id = e->client_id, .msg_id = e->msg_id,
			.shard_id = e->shard_id, .num_tables = e->num_tables,
			.msg_type = e->msg_type, .rep_type = e->rep_type, .msg_len = e->msg_len,
			.num_keys = entry_num_keys(e), .value_len = e->value_len,
			.frag_count = e->frag_count, .rep_frag_count = e->rep_frag_count,
			.frags_in = e->frags_in, .frags_out = e->frags_out,
			.frames_in = e->frames_in, .frames_out = e->frames_out,
			.bytes_in = e->bytes_in, .bytes_out = e->bytes_out,
			.first_tsc = e->first_tsc, .last_tsc = e->last_tsc };
	}
	return n;
}

const struct embnic_shard_stats *
embnic_state_shard_stats(const struct embnic_state *s)
{
	return s->shards;
}

/*
 * Does one side of an entry add up: n fragments (1..EMBNIC_MAX_FRAGS) of len
 * body bytes in all, the last last_len bytes; frags distinct ones seen (1..n:
 * an entry's side exists from its first fragment on), each bit of b below n
 * (n > 1) one of them, in frames frames, bytes body bytes? The fragment size
 * P fixed by last_len; every fragment but the last P bytes; all n: exactly len.
 */
static bool
side_ok(const uint64_t *b, uint16_t n, uint16_t frags, uint16_t frames, uint32_t len,
	uint16_t last_len, uint32_t bytes)
{
	unsigned int i, set = 0;
	uint64_t p, want;
	bool has_last;

	if (n == 0 || n > EMBNIC_MAX_FRAGS || frags == 0 || frags > n || frames < frags)
		return false;
	if (n == 1)
		return last_len == len && bytes == len;
	for (i = 0; i < EMBNIC_MAX_FRAGS; i++)
		if ((b[i >> 6] >> (i & 63) & 1) && (i >= n || ++set > frags))
			return false;
	if (set != frags || last_len == 0 || last_len > len || (len - last_len) % (n - 1u) != 0)
		return false;
	p = (len - last_len) / (n - 1u);
	has_last = (b[(n - 1) >> 6] >> ((n - 1) & 63)) & 1;
	want = (uint64_t)(frags - has_last) * p + (has_last ? last_len : 0);
	return last_len <= p && bytes == want && bytes <= len && (frags < n || bytes == len);
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
				snprintf(err, errlen, "free entry %u is marked in use", i);
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
			snprintf(err, errlen, "entry %u (client %u msg %u): the hash maps its key "
				 "to %ld, in-use bit %d", i, e->client_id, e->msg_id,
				 (long)(uintptr_t)data, (int)(s->used[i >> 6] >> (i & 63) & 1));
			return -1;
		}
		if (!side_ok(e->seen_in, e->frag_count, e->frags_in, e->frames_in, e->msg_len,
			     e->last_len, e->bytes_in) ||
		    (e->state == EMBNIC_ST_RECEIVING) !=
		    (e->frags_in < e->frag_count && e->frags_out == 0) ||
		    (e->state == EMBNIC_ST_FORWARDED && e->bytes_in != e->msg_len))
			goto bad;
		if (e->state == EMBNIC_ST_REPLYING) {
			/* answered: only while request fragments are still to come */
			if ((e->frags_out == e->rep_frag_count && e->frags_in == e->frag_count) ||
			    !side_ok(e->seen_out, e->rep_frag_count, e->frags_out, e->frames_out,
				     rep_msg_len(e), e->rep_last_len, e->bytes_out))
				goto bad;
		} else if (e->frags_out != 0 || e->frames_out != 0) {
			goto bad;
		}
		continue;
bad:
		snprintf(err, errlen, "entry %u (client %u msg %u) is inconsistent: state %u, "
			 "request %u/%u fragments (%u frames, %u of %u bytes, last %u), reply "
			 "%u/%u fragments (%u frames, %u of %u bytes, last %u)", i, e->client_id,
			 e->msg_id, e->state, e->frags_in, e->frag_count, e->frames_in, e->bytes_in,
			 e->msg_len, e->last_len, e->frags_out, e->rep_frag_count, e->frames_out,
			 e->bytes_out, rep_msg_len(e), e->rep_last_len);
		return -1;
	}
	if (live != s->entries || hn < 0 || (uint32_t)hn != live ||
	    s->nb_free + live != s->capacity) {
		snprintf(err, errlen, "%u live entries, count says %u, hash holds %d, %u free "
			 "of %u", live, s->entries, hn, s->nb_free, s->capacity);
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
			snprintf(err, errlen, "free stack slot %u holds entry %u, which is not "
				 "free or is there twice", i, k);
			free(seen);
			return -1;
		}
		seen[k] = 1;
	}
	free(seen);
	return 0;
}
