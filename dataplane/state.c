/* SPDX-License-Identifier: Apache-2.0
 *
 * The message state map: rte_hash keyed by (client id, message id); the
 * value is the hash's key position, indexing a fixed array of entries.
 *
 * Only the TX stage lcore touches the hash and writes entries. The control
 * path reads the entry array (never the hash), so a dump may see an entry
 * mid-update but never freed memory. Capacity is fixed at start; an add
 * that finds it full drops the request (state_full) and counts the overflow.
 *
 * States: receiving (some request fragments forwarded) -> forwarded (all
 * frag_count forwarded) -> answered (all reply fragments forwarded).
 * receiving/forwarded entries idle for the timeout become expired (counted);
 * answered and expired entries are removed one timeout later. A request
 * with RETRANSMIT set on an answered or expired message starts a new
 * attempt. A fragment whose header contradicts the message's first-seen
 * header (docs/protocol.md, "Fragmentation") is dropped as frag_mismatch.
 */
#include <errno.h>
#include <string.h>

#include <rte_debug.h>
#include <rte_hash.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_prefetch.h>

#include "embnic_dp.h"

#define SCAN_PERIOD_NS	1000000ULL	/* expiry scan at most every 1 ms ... */
#define SCAN_SWEEP	100		/* ... covering the map in 100 scans */

struct state_entry {
	uint64_t key;
	uint64_t first_ns, last_ns, expired_ns;
	uint64_t bytes_in, bytes_out;	/* body bytes, request / reply way */
	uint32_t frames_in, frames_out;
	uint32_t msg_id, msg_len, num_keys, rep_msg_len;
	uint16_t client_id, table_id, shard_id, dim;
	uint16_t frag_count, rep_frag_count;
	uint16_t cur_in, cur_out;	/* frames of the current attempt */
	uint8_t msg_type, dtype, rep_type;
	volatile uint8_t state;
} __rte_cache_aligned;

struct embnic_state {
	struct rte_hash *h;
	struct state_entry *e;		/* [capacity] */
	uint32_t capacity;
	volatile uint32_t entries;
	uint64_t timeout_ns;
	uint64_t next_scan_ns;
	uint32_t cursor, chunk;
};

static const char *const state_names[EMBNIC_NB_STATES] = {
	[EMBNIC_ST_FREE] = "free",
	[EMBNIC_ST_RECEIVING] = "receiving",
	[EMBNIC_ST_FORWARDED] = "forwarded",
	[EMBNIC_ST_ANSWERED] = "answered",
	[EMBNIC_ST_EXPIRED] = "expired",
};

const char *
embnic_state_name(unsigned int s)
{
	return s < EMBNIC_NB_STATES ? state_names[s] : "unknown";
}

/* The key of a message: client_id << 32 | msg_id. */
static inline struct embnic_key16
state_key(const struct embnic_msg *m)
{
	return embnic_key16((uint64_t)m->client_id << 32 | m->msg_id);
}

struct embnic_state *
embnic_state_create(uint32_t size, uint32_t timeout_ms)
{
	struct rte_hash_parameters hp = {
		.name = "embnic_state",
		.entries = size,
		.key_len = sizeof(struct embnic_key16),
		.hash_func = EMBNIC_KEY16_HASH_FUNC,
		.hash_func_init_val = 0,
		.socket_id = (int)rte_socket_id(),
		.extra_flag = RTE_HASH_EXTRA_FLAGS_EXT_TABLE,
	};
	struct embnic_state *s;

	s = rte_zmalloc("embnic_state", sizeof(*s), RTE_CACHE_LINE_SIZE);
	if (s == NULL)
		return NULL;
	s->capacity = size;
	s->timeout_ns = (uint64_t)timeout_ms * 1000000ULL;
	s->chunk = (size + SCAN_SWEEP - 1) / SCAN_SWEEP;
	s->e = rte_zmalloc("embnic_state_entries",
			   (size_t)size * sizeof(s->e[0]), RTE_CACHE_LINE_SIZE);
	s->h = rte_hash_create(&hp);
	if (s->e == NULL || s->h == NULL) {
		embnic_state_free(s);
		return NULL;
	}
	RTE_VERIFY(embnic_key16_hash_ok());
	return s;
}

void
embnic_state_free(struct embnic_state *s)
{
	if (s == NULL)
		return;
	rte_hash_free(s->h);
	rte_free(s->e);
	rte_free(s);
}

static void
entry_init(struct state_entry *e, uint64_t key, const struct embnic_msg *m,
	   uint64_t now_ns)
{
	memset(e, 0, sizeof(*e));
	e->key = key;
	e->first_ns = now_ns;
	e->last_ns = now_ns;
	e->msg_id = m->msg_id;
	e->client_id = m->client_id;
	e->table_id = m->table_id;
	e->shard_id = m->shard_id;
	e->dim = m->dim;
	e->dtype = m->dtype;
	e->msg_type = m->msg_type;
	e->msg_len = m->msg_len;
	e->num_keys = m->num_keys;
	e->frag_count = m->frag_count;
	e->state = EMBNIC_ST_RECEIVING;
}

/* Does m contradict the request header the entry was created from? */
static inline bool
request_differs(const struct state_entry *e, const struct embnic_msg *m)
{
	return e->msg_type != m->msg_type || e->msg_len != m->msg_len ||
		e->num_keys != m->num_keys || e->dim != m->dim ||
		e->dtype != m->dtype || e->table_id != m->table_id ||
		e->shard_id != m->shard_id || e->frag_count != m->frag_count;
}

static int
on_request(struct state_entry *e, const struct embnic_msg *m, uint64_t now_ns)
{
	uint8_t st = e->state;

	if (st == EMBNIC_ST_ANSWERED || st == EMBNIC_ST_EXPIRED) {
		if (request_differs(e, m)) {
			/* msg_id reused by a new message after the old ended */
			uint64_t first = now_ns;

			entry_init(e, e->key, m, first);
		} else if (st == EMBNIC_ST_EXPIRED ||
			   (m->flags & EMBNIC_FLAG_RETRANSMIT)) {
			e->state = EMBNIC_ST_RECEIVING;	/* a new attempt */
			e->cur_in = 0;
			e->cur_out = 0;
			e->rep_type = 0;
		}
	} else if (request_differs(e, m)) {
		return EMBNIC_DROP_FRAG_MISMATCH;
	}
	e->frames_in++;
	e->bytes_in += m->frag_len;
	e->cur_in++;
	e->last_ns = now_ns;
	if (e->state == EMBNIC_ST_RECEIVING && e->cur_in >= e->frag_count)
		e->state = EMBNIC_ST_FORWARDED;
	return 0;
}

static int
on_reply(struct state_entry *e, const struct embnic_msg *m, uint64_t now_ns)
{
	if (e->rep_type == 0 || e->cur_out >= e->rep_frag_count) {
		/* the first reply fragment of this answer */
		e->rep_type = m->msg_type;
		e->rep_msg_len = m->msg_len;
		e->rep_frag_count = m->frag_count;
		e->cur_out = 0;
	} else if (e->rep_type != m->msg_type ||
		   e->rep_msg_len != m->msg_len ||
		   e->rep_frag_count != m->frag_count) {
		return EMBNIC_DROP_FRAG_MISMATCH;
	}
	e->frames_out++;
	e->bytes_out += m->frag_len;
	e->cur_out++;
	e->last_ns = now_ns;
	if (e->cur_out >= e->rep_frag_count)
		e->state = EMBNIC_ST_ANSWERED;
	return 0;
}

void
embnic_state_update_burst(struct embnic_state *s,
			  const struct embnic_msg *const *msgs, unsigned int n,
			  uint64_t now_ns, int *verdict,
			  struct embnic_lcore_stats *st)
{
	/* one entry per run of frames of one message (fragments come in a row) */
	struct embnic_key16 keys[EMBNIC_MAX_BURST];
	const void *kp[EMBNIC_MAX_BURST];
	hash_sig_t sig[EMBNIC_MAX_BURST];
	int32_t pos[EMBNIC_MAX_BURST];
	uint8_t run[EMBNIC_MAX_BURST];
	bool added = false;
	unsigned int i, u = 0;

	if (n == 0)
		return;
	for (i = 0; i < n; i++) {
		struct embnic_key16 k = state_key(msgs[i]);

		if (u > 0 && keys[u - 1].lo == k.lo) {
			run[i] = (uint8_t)(u - 1);
			continue;
		}
		keys[u] = k;
		kp[u] = &keys[u];
		sig[u] = embnic_key16_hash(&keys[u]);
		run[i] = (uint8_t)u++;
	}
	rte_hash_lookup_with_hash_bulk(s->h, kp, sig, u, pos);
	for (i = 0; i < u; i++)
		if (pos[i] >= 0)
			rte_prefetch0(&s->e[pos[i]]);

	for (i = 0; i < n; i++) {
		const struct embnic_msg *m = msgs[i];
		unsigned int r = run[i];
		struct state_entry *e;
		int32_t p = pos[r];

		if (p < 0 && added)	/* added by an earlier run of the burst? */
			p = pos[r] = rte_hash_lookup_with_hash(s->h, &keys[r],
							       sig[r]);
		if (p < 0 && !embnic_is_request(m->msg_type)) {
			verdict[i] = 0;	/* a reply to an untracked message */
			continue;
		}
		if (p < 0) {
			p = rte_hash_add_key_with_hash(s->h, &keys[r], sig[r]);
			if (p < 0 || (uint32_t)p >= s->capacity) {
				if (p >= 0)
					rte_hash_del_key_with_hash(s->h,
								   &keys[r],
								   sig[r]);
				st->state_overflow++;
				verdict[i] = EMBNIC_DROP_STATE_FULL;
				continue;
			}
			pos[r] = p;
			added = true;
			entry_init(&s->e[p], keys[r].lo, m, now_ns);
			s->entries++;
		}
		e = &s->e[p];
		verdict[i] = embnic_is_request(m->msg_type) ?
			on_request(e, m, now_ns) : on_reply(e, m, now_ns);
	}
}

void
embnic_state_expire_step(struct embnic_state *s, uint64_t now_ns,
			 struct embnic_lcore_stats *st)
{
	uint32_t k;

	if (now_ns < s->next_scan_ns)
		return;
	s->next_scan_ns = now_ns + SCAN_PERIOD_NS;
	for (k = 0; k < s->chunk; k++) {
		struct state_entry *e = &s->e[s->cursor];
		bool remove = false;

		if (++s->cursor >= s->capacity)
			s->cursor = 0;
		switch (e->state) {
		case EMBNIC_ST_RECEIVING:
		case EMBNIC_ST_FORWARDED:
			if (now_ns - e->last_ns > s->timeout_ns) {
				e->state = EMBNIC_ST_EXPIRED;
				e->expired_ns = now_ns;
				st->state_expired++;
			}
			break;
		case EMBNIC_ST_EXPIRED:
			remove = now_ns - e->expired_ns > s->timeout_ns;
			break;
		case EMBNIC_ST_ANSWERED:
			remove = now_ns - e->last_ns > s->timeout_ns;
			break;
		default:
			break;
		}
		if (remove) {
			struct embnic_key16 k = embnic_key16(e->key);

			rte_hash_del_key_with_hash(s->h, &k,
						   embnic_key16_hash(&k));
			e->state = EMBNIC_ST_FREE;
			s->entries--;
		}
	}
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
		v->table_id = e->table_id;
		v->shard_id = e->shard_id;
		v->msg_type = e->msg_type;
		v->frames_in = e->frames_in;
		v->frames_out = e->frames_out;
		v->bytes_in = e->bytes_in;
		v->bytes_out = e->bytes_out;
		v->first_ns = e->first_ns;
		v->last_ns = e->last_ns;
		n++;
	}
	return n;
}
