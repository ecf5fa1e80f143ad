/* SPDX-License-Identifier: Apache-2.0
 *
 * The client's round, its window and loss recovery (round.h): a shard's
 * messages sent while its send window has room, tail probes, lookups
 * repaired and updates polled or sent again, by later answers (RACK, by
 * transmission order) or by their own timers (RFC 6298: backoff, per shard
 * only the message sent first).
 */
#include "round.h"

static void
set_probe_src(struct ec_round *r, int s, int i)
{
	if (r->probe_src[s] < 0)
		r->probe_order[r->nprobe++] = s;
	r->probe_src[s] = i;
}

static int
pop_probe_src(struct ec_round *r, int s)
{
	int i = r->probe_src[s];

	r->probe_src[s] = -1;
	for (int j = 0; j < r->nprobe; j++)
		if (r->probe_order[j] == s) {
			memmove(&r->probe_order[j], &r->probe_order[j + 1],
				sizeof(int) * (size_t)(r->nprobe - j - 1));
			r->nprobe--;
			break;
		}
	return i;
}

/* pyround's _round_msgs, its fill(): send shard s's queued messages while its window has room. */
int
ec_fill(struct ec_round *r, int s)
{
	struct ec_ctx *c = r->c;
	int last = -1, rc;

	while (r->qhead[s] >= 0) {
		int i = r->qhead[s];
		struct ec_msg *m = &r->m[i];

		if (!(r->inflight[s] == 0 || r->inflight[s] + m->cost <= c->window))
			break;
		r->qhead[s] = m->next;
		m->t_first = m->t_sent = ec_mono();
		m->seq0 = m->seq = r->seqs++;
		m->rto = ec_rtt_of(c, s, m->type)->rto;
		rc = ec_send_msg(r, i, NULL, 0, 0);
		if (rc < 0)
			return rc;
		c->stats[S_messages_sent]++;
		if (ec_pend_add(r, i) < 0)
			return -ENOMEM;
		r->live++;
		r->inflight[s] += r->m[i].cost;
		if ((uint64_t)r->inflight[s] > c->stats[S_max_inflight_frames])
			c->stats[S_max_inflight_frames] = (uint64_t)r->inflight[s];
		last = i;
	}
	if (last >= 0 && r->qhead[s] < 0 && c->tail_probes)
		set_probe_src(r, s, last);
	return 0;
}

/* Message x a LOOKUP_REQ to shard s with a body of its own, own: a directory
 * of nt tables, then nk keys (a repair's or a probe's). */
static void
own_lookup(struct ec_msg *x, int s, uint8_t *own, int nt, int64_t nk, uint32_t value_len)
{
	x->type = EMBNIC_LOOKUP_REQ;
	x->shard = s;
	x->num_tables = (uint16_t)nt;
	x->num_keys = (uint32_t)nk;
	x->value_len = value_len;
	x->msg_len = (uint32_t)((size_t)EMBNIC_DIR_ENTRY * nt + (size_t)EMBNIC_KEY_SIZE * nk);
	x->own = own;
	x->seg[0] = own;
	x->seglen[0] = x->msg_len;
	x->dirp = own;
	x->keyp = (const uint64_t *)(own + (size_t)EMBNIC_DIR_ENTRY * nt);
}

/*
 * The keys of message m whose rows lie (in part) in its missing reply
 * fragments (p bytes each), walked table by table (directory order): their
 * grouped positions into kidx[], the keys packed into own after a directory
 * of the tables left (sub: per directory entry, its keys selected). Returns
 * how many keys; *nt2 the tables left.
 */
static int64_t
repair_keys(const struct ec_round *r, const struct ec_msg *m, uint32_t p, uint32_t *sub,
	    int64_t *kidx, uint8_t *own, int *nt2)
{
	uint32_t cm[EMBNIC_MAX_FRAGS + 1];
	int nt = m->num_tables;
	int64_t k = 0, nsel = 0;
	uint8_t *keys0 = own + (size_t)EMBNIC_DIR_ENTRY * nt;

	cm[0] = 0;	/* missing fragments before each fragment */
	for (uint32_t f = 0; f < m->rfc; f++)
		cm[f + 1] = cm[f] + !(m->got[f >> 6] >> (f & 63) & 1);
	for (int e = 0; e < nt; e++) {
		uint32_t cnt;

		memcpy(&cnt, m->dirp + (size_t)e * EMBNIC_DIR_ENTRY + 8, 4);
		for (uint32_t q = 0; q < cnt; q++, k++) {
			int64_t off = row_off(r, m, k);
			int64_t len = r->rb[row_pos(m, k)];
			uint32_t f0 = (uint32_t)(off / p);
			uint32_t f1 = (uint32_t)((off + len - 1) / p);

			if (cm[f1 + 1] - cm[f0] > 0) {
				kidx[nsel] = row_pos(m, k);
				memcpy(keys0 + (size_t)EMBNIC_KEY_SIZE * nsel, m->keyp + k, EMBNIC_KEY_SIZE);
				nsel++;
				sub[e]++;
			}
		}
	}
	/* the directory of the tables left, packed before the keys */
	*nt2 = 0;
	for (int e = 0; e < nt; e++) {
		if (!sub[e])
			continue;
		memcpy(own + (size_t)EMBNIC_DIR_ENTRY * *nt2, m->dirp + (size_t)e * EMBNIC_DIR_ENTRY,
		       EMBNIC_DIR_ENTRY);
		memcpy(own + (size_t)EMBNIC_DIR_ENTRY * *nt2 + 8, &sub[e], 4);
		(*nt2)++;
	}
	memmove(own + (size_t)EMBNIC_DIR_ENTRY * *nt2, keys0, (size_t)EMBNIC_KEY_SIZE * nsel);
	return nsel;
}

/*
 * pyround's _repair(): a new LOOKUP_REQ for only the keys of message i whose rows lie
 * (in part) in its missing reply fragments (repair_keys). Returns its index,
 * -1 when no fragment of i's reply is held (send i again instead), or
 * -ENOMEM.
 */
static int
repair(struct ec_round *r, int i)
{
	struct ec_msg *m = &r->m[i], *n;
	int64_t nk = m->num_keys, nsel;
	uint32_t p = m->rp;
	int nt = m->num_tables, nt2 = 0;
	uint32_t *sub;
	uint8_t *own;
	int64_t *kidx, *kso;
	int ri;

	if (m->ngot == 0 || p == 0)
		return -1;
	sub = calloc((size_t)nt + 1, sizeof(*sub));
	kidx = malloc(sizeof(*kidx) * (size_t)(nk + 1));
	kso = malloc(sizeof(*kso) * (size_t)(nk + 1));
	own = malloc((size_t)EMBNIC_DIR_ENTRY * nt + (size_t)EMBNIC_KEY_SIZE * nk);
	if (sub == NULL || kidx == NULL || kso == NULL || own == NULL)
		goto nomem;
	nsel = repair_keys(r, m, p, sub, kidx, own, &nt2);
	kso[0] = 0;
	for (int64_t k = 0; k < nsel; k++)
		kso[k + 1] = kso[k] + r->rb[kidx[k]];
	free(sub);
	sub = NULL;
	ri = ec_add_msg(r, ec_alloc_id(r));
	if (ri < 0)
		goto nomem;
	m = &r->m[i];
	n = &r->m[ri];
	own_lookup(n, m->shard, own, nt2, nsel, (uint32_t)kso[nsel]);
	n->kidx = kidx;
	n->kso = kso;
	n->root = m->root >= 0 ? m->root : i;
	n->t_first = r->m[n->root].t_first;
	n->t_sent = ec_mono();
	n->rto = m->rto;
	n->tries = m->tries;
	ec_geometry(r->c, n);
	return ri;
nomem:
	free(sub);
	free(kidx);
	free(kso);
	free(own);
	return -ENOMEM;
}

/* pyround's _round_msgs, its resend(): repair message i, or send it again (an update of
 * several fragments: its last one, a poll). Returns 0 or -errno. */
static int
resend(struct ec_round *r, int i)
{
	struct ec_ctx *c = r->c;
	struct ec_msg *m = &r->m[i];
	int ri = -1, rc, poll_, last;

	if (m->type == EMBNIC_LOOKUP_REQ && !c->fixed_length) {
		ri = repair(r, i);
		if (ri < -1)
			return ri;
	}
	if (ri >= 0) {
		ec_pend_del(r, i, Q_REPLACED);
		memset(r->m[i].dup, 0, sizeof(r->m[i].dup));
		r->m[i].ndup = 0;
		if (ec_pend_add(r, ri) < 0)
			return -ENOMEM;
		c->stats[S_repairs]++;
		i = ri;
	}
	m = &r->m[i];
	m->seq = r->seqs++;
	last = (int)m->frames - 1;
	if (ri >= 0)
		m->seq0 = m->seq;
	m->lost_at = 0;
	m->t_sent = ec_mono();
	poll_ = m->type == EMBNIC_UPDATE_REQ && m->frames > 1;	/* its last fragment */
	if (poll_)
		c->stats[S_update_polls]++;
	rc = ec_send_msg(r, i, poll_ ? &last : NULL, 1, ri < 0);
	if (rc < 0)
		return rc;
	if (ri >= 0)
		c->stats[S_retransmits]++;
	m = &r->m[i];
	if (c->tail_probes && r->qhead[m->shard] < 0)
		set_probe_src(r, m->shard, i);
	return 0;
}

/* pyround's _round_msgs, its probe(): a one-key lookup after shard s's last message. */
static int
probe(struct ec_round *r, int s)
{
	struct ec_ctx *c = r->c;
	int src = pop_probe_src(r, s), found = 0, pi, rc;
	struct ec_msg *p;
	uint8_t *own;
	uint16_t dim;
	uint8_t dtype;
	double now;

	if (src < 0 || r->m[src].type == EMBNIC_SIZE_REQ)
		return 0;
	for (int j = 0; j < r->npend && !found; j++) {
		int x = r->pend[j];

		found = x >= 0 && r->m[x].shard == s && !r->m[x].probe;
	}
	if (!found)
		return 0;
	now = ec_mono();
	own = malloc(EMBNIC_DIR_ENTRY + EMBNIC_KEY_SIZE);
	if (own == NULL)
		return -ENOMEM;
	memcpy(own, r->m[src].dirp, EMBNIC_DIR_ENTRY);
	memcpy(own + 8, &(uint32_t){ 1 }, 4);
	memcpy(own + EMBNIC_DIR_ENTRY, r->m[src].keyp, EMBNIC_KEY_SIZE);
	memcpy(&dim, own + 2, 2);
	dtype = own[4];
	pi = ec_add_msg(r, ec_alloc_id(r));
	if (pi < 0) {
		free(own);
		return -ENOMEM;
	}
	p = &r->m[pi];
	own_lookup(p, s, own, 1, 1, (uint32_t)dim * (dtype == EMBNIC_DTYPE_FP16 ? 2 : 4));
	p->probe = 1;
	p->t_first = p->t_sent = now;
	p->rto = ec_rtt_of(c, s, EMBNIC_LOOKUP_REQ)->rto;
	ec_geometry(c, p);
	p->seq0 = p->seq = r->seqs++;
	rc = ec_send_msg(r, pi, NULL, 0, 0);
	if (rc < 0)
		return rc;
	if (ec_pend_add(r, pi) < 0)
		return -ENOMEM;
	c->stats[S_probes]++;
	return 0;
}

static void
give_up(struct ec_round *r, int i, double now)
{
	const struct ec_msg *m = &r->m[i];
	int64_t n = 0, big = 0;

	for (int j = 0; j < r->npend; j++) {
		const struct ec_msg *x;

		if (r->pend[j] < 0)
			continue;
		x = &r->m[r->pend[j]];
		if (x->shard != m->shard)
			continue;
		n += !x->probe;
		big = x->datagram > big ? x->datagram : big;
	}
	r->res[R_KIND] = K_GIVE_UP;
	r->res[R_SHARD] = m->shard;
	r->res[R_TRIES] = m->tries;
	r->res[R_TYPE] = m->type;
	r->res[R_NMSG] = n;
	r->res[R_BIG] = big;
	r->res[R_ELAPSED_NS] = (int64_t)((now - r->t0) * 1e9);
}

static double
reo_wnd(struct ec_round *r, const struct ec_msg *m)
{
	const struct ec_rtt *e = ec_rtt_of(r->c, m->shard, m->type);
	double w = (e->min_rtt >= 0 ? e->min_rtt : e->rto) / 4;

	return w > EC_REO_WND_MIN ? w : EC_REO_WND_MIN;
}

/*
 * Run fn over the pending messages (in pending order) whose timer fired by
 * now (lost = 0), or that later answers showed lost and whose reordering
 * window passed by now (lost = 1). Returns fn's result, or -ENOMEM.
 */
static int
on_due(struct ec_round *r, double now, int lost, int (*fn)(struct ec_round *, const int *, int, double))
{
	int *x = malloc(sizeof(int) * (size_t)(r->npend + 1)), n = 0, rc;

	if (x == NULL)
		return -ENOMEM;
	for (int j = 0; j < r->npend; j++) {
		int i = r->pend[j];

		if (i < 0)
			continue;
		if (lost ? r->m[i].lost_at != 0 && r->m[i].lost_at <= now : r->m[i].deadline <= now)
			x[n++] = i;
	}
	rc = fn(r, x, n, now);
	free(x);
	return rc;
}

/* The nf messages whose timers fired: a give-up past retries (2), else per
 * shard the one transmitted first sent again, its timer doubled, the others'
 * restarted. Returns 0, 2 or -errno. */
static int
resend_fired(struct ec_round *r, const int *fired, int nf, double now)
{
	struct ec_ctx *c = r->c;
	int rc;

	for (int j = 0; j < nf; j++)
		if (r->m[fired[j]].tries >= c->retries) {
			give_up(r, fired[j], now);
			return 2;
		}
	for (int s = 0; s < c->nshards; s++)
		r->first_fired[s] = -1;
	for (int j = 0; j < nf; j++) {
		int x = fired[j], s = r->m[x].shard;

		if (r->first_fired[s] < 0 || r->m[x].seq < r->m[r->first_fired[s]].seq)
			r->first_fired[s] = x;
	}
	for (int j = 0; j < nf; j++) {
		int x = fired[j];
		struct ec_msg *m = &r->m[x];
		double rto;

		if (r->first_fired[m->shard] != x) {
			m->deadline = now + m->rto;
			continue;
		}
		c->stats[S_timeouts]++;
		rto = m->rto * 2;
		m->rto = rto < c->rto_max ? rto : c->rto_max;
		rc = resend(r, x);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* pyround's _expire(): timers that fired; per shard only the one sent first is sent again. */
int
ec_expire(struct ec_round *r, double now)
{
	for (int j = 0; j < r->npend; j++) {
		int x = r->pend[j];

		if (x >= 0 && r->m[x].probe && r->m[x].deadline <= now) {
			ec_pend_del(r, x, Q_LATE);	/* never re-sent: its answer is expected late */
			ec_late_add(r->c, r->m[x].msg_id);
		}
	}
	return on_due(r, now, 0, resend_fired);
}

/* After a drain: answered messages, then loss detection (RACK) and timers
 * of the shards that answered (the body of pyround's _round_msgs loop). */
int
ec_after_drain(struct ec_round *r, double now)
{
	struct ec_ctx *c = r->c;
	int rc;

	for (int d = 0; d < r->ndone; d++) {
		struct ec_msg *m = &r->m[r->done[d]];
		int s = m->shard;

		if (m->probe)
			continue;
		r->live--;
		r->inflight[s] -= r->m[m->root >= 0 ? m->root : r->done[d]].cost;
		if (m->tries == 1 && m->root < 0)	/* Karn */
			ec_rtt_sample(c, ec_rtt_of(c, s, m->type), now - m->t_first);
		rc = ec_fill(r, s);
		if (rc < 0)
			return rc;
	}
	if (r->ndone || r->any_partial) {
		for (int s = 0; s < c->nshards; s++)
			r->ev[s] = r->partial[s];
		for (int d = 0; d < r->ndone; d++) {
			const struct ec_msg *m = &r->m[r->done[d]];
			const struct ec_rtt *e = ec_rtt_of(c, m->shard, m->type);
			int64_t sq = e->min_rtt >= 0 && now - m->t_sent >= e->min_rtt ? m->seq : m->seq0;

			if (sq > r->ev[m->shard])
				r->ev[m->shard] = sq;
		}
		for (int j = 0; j < r->npend; j++) {
			struct ec_msg *x;
			int64_t e;

			if (r->pend[j] < 0)
				continue;
			x = &r->m[r->pend[j]];
			e = r->ev[x->shard];
			if (e < 0 || x->probe)
				continue;
			if (x->seq < e && x->lost_at == 0)
				x->lost_at = now + reo_wnd(r, x);
			if (x->deadline < now + x->rto)
				x->deadline = now + x->rto;
		}
	}
	return 0;
}

/* The n messages later answers showed lost: each repaired or sent again, a
 * give-up past retries (2). Returns 0, 2 or -errno. */
static int
resend_lost(struct ec_round *r, const int *lost, int n, double now)
{
	struct ec_ctx *c = r->c;

	for (int j = 0; j < n; j++) {
		int rc;

		if (r->m[lost[j]].tries >= c->retries) {
			give_up(r, lost[j], now);
			return 2;
		}
		c->stats[S_fast_retransmits]++;
		rc = resend(r, lost[j]);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* Messages later answers showed lost, their reordering window over. */
int
ec_fast_retransmit(struct ec_round *r)
{
	return on_due(r, ec_mono(), 1, resend_lost);
}

int
ec_probes_due(struct ec_round *r)
{
	while (r->nprobe > 0) {
		int rc = probe(r, r->probe_order[0]);

		if (rc < 0)
			return rc;
	}
	return 0;
}
