/* SPDX-License-Identifier: Apache-2.0
 *
 * The client's round from start to end (round.h): the caller's message
 * table loaded into a round, the first messages of every shard sent, then
 * the wait for answers, recovery and timers until every message is
 * answered, a shard gives up or answers ERROR, or a signal comes (the round
 * is then kept in the context and resumed by the next call).
 */
#include "round.h"

static void
round_free(struct ec_round *r)
{
	for (int i = 0; i < r->n; i++) {
		free(r->m[i].own);
		free(r->m[i].kidx);
		free(r->m[i].kso);
	}
	free(r->m);
	free(r->pend);
	free(r->hash);
	free(r->qhead);		/* the per-shard int arrays (round_alloc) */
	free(r->inflight);	/* the per-shard int64 arrays */
	free(r->done);
}

/* Drop the round a signal interrupted (its caller gave up on it). */
void
embnic_client_abort(struct ec_ctx *c)
{
	if (c->cur != NULL) {
		round_free(c->cur);
		free(c->cur);
		c->cur = NULL;
	}
}

/* The round's arrays for nmsg messages and S shards; -ENOMEM. */
static int
round_alloc(struct ec_round *r, int nmsg, int S)
{
	uint32_t hs = 64;

	r->cap = nmsg * 2 + 16;
	r->cap_pend = nmsg * 2 + 16;
	r->cap_done = nmsg + 16;
	while (hs < (uint32_t)r->cap * 2)
		hs *= 2;
	r->m = malloc(sizeof(*r->m) * (size_t)r->cap);
	r->pend = malloc(sizeof(int) * (size_t)r->cap_pend);
	r->hash = malloc(sizeof(int) * hs);
	r->hmask = hs - 1;
	/* per shard (S + 1 each), one block per type: qhead, qtail, probe_src,
	 * probe_order, first_fired; inflight (zeroed), partial, ev */
	r->qhead = malloc(sizeof(int) * 5 * ((size_t)S + 1));
	r->inflight = calloc(3 * ((size_t)S + 1), sizeof(int64_t));
	r->done = malloc(sizeof(int) * (size_t)r->cap_done);
	if (!r->m || !r->pend || !r->hash || !r->qhead || !r->inflight || !r->done)
		return -ENOMEM;
	r->qtail = r->qhead + S + 1;
	r->probe_src = r->qtail + S + 1;
	r->probe_order = r->probe_src + S + 1;
	r->first_fired = r->probe_order + S + 1;
	r->partial = r->inflight + S + 1;
	r->ev = r->partial + S + 1;
	memset(r->hash, 0xff, sizeof(int) * hs);
	for (int s = 0; s < S; s++) {
		r->qhead[s] = r->qtail[s] = -1;
		r->probe_src[s] = -1;
	}
	return 0;
}

/*
 * The caller's messages (tab, queue order) into the round: each into its
 * shard's queue; order[] gets the shards in order of first appearance.
 * Returns how many shards, -ENOMEM or -EINVAL (a shard index out of range).
 */
static int
round_load(struct ec_round *r, int nmsg, const int64_t *tab, const uint8_t *dir,
	   const uint64_t *keys, const uint8_t *vals, int *order)
{
	int S = r->c->nshards, norder = 0;

	for (int j = 0; j < nmsg; j++) {
		const int64_t *row = tab + (size_t)j * M_NCOL;
		int i = ec_add_msg(r, (uint32_t)row[M_ID]);
		struct ec_msg *m;
		int64_t nk = row[M_KB] - row[M_KA];
		int s = (int)row[M_SHARD];

		if (i < 0 || s < 0 || s >= S)
			return i < 0 ? i : -EINVAL;
		m = &r->m[i];
		m->type = (uint8_t)row[M_TYPE];
		m->shard = s;
		m->num_tables = (uint16_t)row[M_NT];
		m->num_keys = (uint32_t)row[M_NKEYS];
		m->value_len = (uint32_t)row[M_VLEN];
		m->msg_len = (uint32_t)row[M_MSGLEN];
		m->dirp = dir + (size_t)EMBNIC_DIR_ENTRY * row[M_DIR0];
		m->keyp = keys + row[M_KA];
		m->ka = row[M_KA];
		m->kb = row[M_KB];
		m->seg[0] = m->dirp;
		m->seglen[0] = (uint64_t)EMBNIC_DIR_ENTRY * m->num_tables;
		m->seg[1] = (const uint8_t *)m->keyp;
		m->seglen[1] = (uint64_t)EMBNIC_KEY_SIZE * nk;
		m->seg[2] = vals + row[M_VOFF];
		m->seglen[2] = m->msg_len - m->seglen[0] - m->seglen[1];
		ec_geometry(r->c, m);
		m->state = Q_QUEUED;
		if (r->qhead[s] < 0) {
			r->qhead[s] = i;
			order[norder++] = s;
		} else {
			r->m[r->qtail[s]].next = i;
		}
		r->qtail[s] = i;
	}
	return norder;
}

/*
 * Wait for a datagram until the first timer (a loss time or a deadline) of
 * the pending messages, at most EC_SIGNAL_SLICE_S. Returns 1 when a signal
 * came or a slice of a longer wait passed (the caller goes back to Python,
 * whose handlers run, then resumes), else 0.
 */
static int
round_wait(struct ec_round *r)
{
	double wait = 1e300;

	for (int j = 0; j < r->npend; j++) {
		const struct ec_msg *x;
		double d;

		if (r->pend[j] < 0)
			continue;
		x = &r->m[r->pend[j]];
		d = x->lost_at != 0 && x->lost_at < x->deadline ? x->lost_at : x->deadline;
		wait = d < wait ? d : wait;
	}
	wait -= ec_mono();
	if (wait > 0) {
		struct pollfd pfd = { .fd = r->c->fd, .events = POLLIN };
		struct timespec ts;
		int sliced = wait > EC_SIGNAL_SLICE_S, n;

		if (sliced)
			wait = EC_SIGNAL_SLICE_S;
		ts.tv_sec = (time_t)wait;
		ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
		n = ppoll(&pfd, 1, &ts, NULL);
		if ((n < 0 && errno == EINTR) || (n == 0 && sliced))
			return 1;
	}
	return 0;
}

/*
 * The round's loop (EmbeddingClient's round, step for step: read before any
 * timer is acted on). Returns 0 when every message is answered, 1 (a shard
 * answered ERROR) or 2 (a message was tried retries times: res[] says which),
 * 3 when interrupted (round_wait), or -errno.
 */
static int
round_loop(struct ec_round *r)
{
	int rc = 0;

	while (rc == 0 && r->live > 0) {
		double now, first = 1e300;

		if (round_wait(r))
			return 3;
		rc = ec_drain(r);
		if (rc != 0)
			break;
		now = ec_mono();
		rc = ec_after_drain(r, now);
		if (rc == 0)
			rc = ec_fast_retransmit(r);
		if (rc == 0)
			rc = ec_probes_due(r);
		if (rc != 0 || r->ndone || r->live == 0)
			continue;	/* read again before a timer is acted on */
		now = ec_mono();
		for (int j = 0; j < r->npend; j++)
			if (r->pend[j] >= 0 && r->m[r->pend[j]].deadline < first)
				first = r->m[r->pend[j]].deadline;
		if (first <= now)
			rc = ec_expire(r, now);
	}
	if (rc == 0)
		for (int j = 0; j < r->npend; j++)	/* probes still out */
			if (r->pend[j] >= 0)
				ec_late_add(r->c, r->m[r->pend[j]].msg_id);
	return rc;
}

/*
 * Run one round: send the nmsg messages of tab (int64 rows of M_NCOL
 * columns, in queue order: a shard's messages largest first) and wait for
 * every answer (EmbeddingClient's round, client_lib/client.py).
 *
 * A message's body is dir[16*dir0 .. +16*nt] ++ keys[ka..kb] ++
 * vals[voff .. +(msg_len - 16*nt - 8*(kb-ka))]. A lookup's reply rows go to
 * out + dst[k] for its grouped key k (rb[k] bytes; so[]: the exclusive sum
 * of rb, N+1); out may be NULL for updates and size rounds. lat (nmsg) gets
 * each lookup message's latency (µs) when record_latency. next_id: the id
 * a repair or probe takes first.
 *
 * Returns 0 and res[] (R_NCOL int64): R_KIND (K_OK, K_SHARD_ERROR with
 * R_SHARD, R_TABLE, R_STATUS; K_GIVE_UP with R_SHARD, R_TRIES, R_TYPE,
 * R_NMSG, R_BIG, R_ELAPSED_NS; K_OS_ERROR with R_ERRNO), R_NEXT_ID, R_NLAT,
 * R_LARGEST (the largest datagram of an answered message so far).
 * K_INTERRUPTED: a signal came while waiting, or a wait passed
 * EC_SIGNAL_SLICE_S (0.1 s); the round is kept in the context: call again
 * with the same arrays to resume it (after the caller's signal handlers
 * ran), or embnic_client_abort() to drop it.
 */
int
embnic_client_round(struct ec_ctx *c, int nmsg, const int64_t *tab,
		    const uint8_t *dir, const uint64_t *keys, const uint8_t *vals,
		    const int64_t *dst, const int64_t *rb, const int64_t *so,
		    uint8_t *out, int record_latency, double *lat,
		    uint32_t next_id, int64_t *res)
{
	struct ec_round *r = c->cur;
	int rc = 0, norder;

	memset(res, 0, sizeof(int64_t) * R_NCOL);
	if (r != NULL) {	/* a round a signal interrupted: on with it */
		c->cur = NULL;
		r->res = res;
		r->lat = lat;
	} else {
		r = calloc(1, sizeof(*r));
		if (r == NULL) {
			res[R_KIND] = K_OS_ERROR;
			res[R_ERRNO] = ENOMEM;
			return -ENOMEM;
		}
		*r = (struct ec_round){ .c = c, .res = res, .keys = keys, .dst = dst, .rb = rb, .so = so,
					.out = out, .record_latency = record_latency, .lat = lat,
					.next_id = next_id };
		rc = round_alloc(r, nmsg, c->nshards);
		r->t0 = ec_mono();
		/* first_fired[] holds the shards in order of first appearance, before any timer */
		norder = rc == 0 ? round_load(r, nmsg, tab, dir, keys, vals, r->first_fired) : rc;
		rc = norder < 0 ? norder : 0;
		r->seqs = 0;
		for (int j = 0; j < norder && rc == 0; j++)
			rc = ec_fill(r, r->first_fired[j]);
		if (rc == 0)
			rc = ec_probes_due(r);
	}
	if (rc == 0)
		rc = round_loop(r);
	res[R_NEXT_ID] = r->next_id;
	res[R_NLAT] = r->nlat;
	if (rc == 3) {	/* back to the caller, whose handlers run, then resume (or embnic_client_abort) */
		c->cur = r;
		res[R_KIND] = K_INTERRUPTED;
		return 0;
	}
	if (rc < 0) {
		res[R_KIND] = K_OS_ERROR;
		res[R_ERRNO] = -rc;
	}
	res[R_LARGEST] = c->largest_answered;
	round_free(r);
	free(r);
	return rc < 0 ? rc : 0;
}
