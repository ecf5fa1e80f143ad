/* SPDX-License-Identifier: Apache-2.0
 *
 * The client's round, its frames (round.h): a message's fragments built as
 * a header plus iovecs over the caller's arrays and sent with sendmmsg; the
 * replies read with recvmmsg, checked (the card's rules, embnic_parse.h),
 * their bytes copied to their rows, UPDATE_NACKs answered with the
 * fragments the shard lacks.
 */
#include "round.h"

/* -- sending -------------------------------------------------------------- */

static int
flush_tx(struct ec_ctx *c, int n)
{
	int done = 0;

	while (done < n) {
		int k = sendmmsg(c->fd, c->tx + done, (unsigned int)(n - done), 0);

		if (k > 0) {
			done += k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd pfd = { .fd = c->fd, .events = POLLOUT };

			poll(&pfd, 1, (int)(c->timeout_s * 1000) + 1);
			continue;
		}
		if (k < 0 && errno == ENOBUFS) {
			struct timespec ts = { 0, 500000 };

			nanosleep(&ts, NULL);
			continue;
		}
		return k < 0 ? -errno : -EIO;
	}
	return 0;
}

/*
 * Send fragments of message i: every one (list NULL, n = frames) or those
 * listed, RETRANSMIT set if retransmit. Counts frames and bytes sent.
 */
static int
send_frags(struct ec_round *r, int i, const int *list, int n, int retransmit)
{
	struct ec_ctx *c = r->c;
	struct ec_msg *m = &r->m[i];
	struct embnic_hdr t;
	int k = 0, rc;

	memset(&t, 0, sizeof(t));
	t.magic = embnic_ntoh16(EMBNIC_MAGIC);
	t.version = EMBNIC_PROTO_VERSION;
	t.msg_type = m->type;
	t.flags = retransmit ? EMBNIC_FLAG_RETRANSMIT : 0;
	t.msg_id = embnic_ntoh32(m->msg_id);
	t.client_id = embnic_ntoh16(c->client_id);
	t.shard_id = embnic_ntoh16(c->shard_ids[m->shard]);
	t.num_tables = embnic_ntoh16(m->num_tables);
	t.table_id = embnic_ntoh16(EMBNIC_NO_TABLE);
	t.num_keys = embnic_ntoh32(m->num_keys);
	t.value_len = embnic_ntoh32(m->value_len);
	t.msg_len = embnic_ntoh32(m->msg_len);
	t.frag_count = embnic_ntoh16((uint16_t)m->frames);
	for (int j = 0; j < n; j++) {
		int f = list ? list[j] : j;
		uint64_t a = (uint64_t)f * c->p, b = a + c->p, pos = 0;
		struct iovec *iov = c->txiov[k];
		int niov = 1;

		if (b > m->msg_len)
			b = m->msg_len;
		c->txh[k] = t;
		c->txh[k].frag_offset = embnic_ntoh32((uint32_t)a);
		c->txh[k].frag_index = embnic_ntoh16((uint16_t)f);
		c->txh[k].frag_len = embnic_ntoh16((uint16_t)(b - a));
		iov[0].iov_base = &c->txh[k];
		iov[0].iov_len = EMBNIC_HDR_LEN;
		for (int s = 0; s < 3; s++) {	/* the body's part in [a, b) */
			uint64_t s0 = pos, s1 = pos + m->seglen[s];
			uint64_t x = a > s0 ? a : s0, y = b < s1 ? b : s1;

			if (x < y) {
				iov[niov].iov_base = (void *)(m->seg[s] + (x - s0));
				iov[niov].iov_len = y - x;
				niov++;
			}
			pos = s1;
		}
		memset(&c->tx[k].msg_hdr, 0, sizeof(c->tx[k].msg_hdr));
		c->tx[k].msg_hdr.msg_name = &c->dest[m->shard];
		c->tx[k].msg_hdr.msg_namelen = sizeof(c->dest[m->shard]);
		c->tx[k].msg_hdr.msg_iov = iov;
		c->tx[k].msg_hdr.msg_iovlen = (size_t)niov;
		c->stats[S_frames_sent]++;
		c->stats[S_bytes_sent] += EMBNIC_HDR_LEN + (b - a);
		if (++k == EC_TXB) {
			rc = flush_tx(c, k);
			if (rc < 0)
				return rc;
			k = 0;
		}
	}
	return k ? flush_tx(c, k) : 0;
}

/* pyround's _send: a try of message i (and a retransmit), its fragments
 * (all, or list[0..n)), its timer started (what a NACK asks for is no try:
 * answer_nack() calls send_frags()). */
int
ec_send_msg(struct ec_round *r, int i, const int *list, int n, int retransmit)
{
	int rc = send_frags(r, i, list, list ? n : (int)r->m[i].frames, retransmit);

	if (rc < 0)
		return rc;
	r->m[i].tries++;
	if (retransmit)
		r->c->stats[S_retransmits]++;
	r->m[i].deadline = ec_mono() + r->m[i].rto;
	return 0;
}

static int
drop(struct ec_ctx *c, int stat)
{
	c->stats[stat]++;
	return 0;
}

/* Copy the reply bytes [off, off + len) of message i to their rows. */
static void
scatter(struct ec_round *r, const struct ec_msg *m, uint64_t off,
	const uint8_t *data, uint64_t len)
{
	int64_t lo = 0, hi = m->num_keys, k;
	uint64_t end = off + len;

	if (m->probe || r->out == NULL)
		return;
	while (hi - lo > 1) {	/* the row holding byte off */
		int64_t mid = (lo + hi) / 2;

		if ((uint64_t)row_off(r, m, mid) <= off)
			lo = mid;
		else
			hi = mid;
	}
	for (k = lo; k < m->num_keys; k++) {
		uint64_t s = (uint64_t)row_off(r, m, k);
		int64_t g = row_pos(m, k);
		uint64_t e = s + (uint64_t)r->rb[g];
		uint64_t x = off > s ? off : s, y = end < e ? end : e;

		if (s >= end)
			break;
		if (x < y)
			memcpy(r->out + r->dst[g] + (x - s), data + (x - off), y - x);
	}
}

static void
complete(struct ec_round *r, int i)
{
	struct ec_ctx *c = r->c;
	struct ec_msg *m = &r->m[i];

	if (m->datagram > c->largest_answered)
		c->largest_answered = m->datagram;
	ec_pend_del(r, i, Q_DONE);
	memset(m->dup, 0, sizeof(m->dup));
	m->ndup = 0;
	r->done[r->ndone++] = i;
	if (m->probe)
		return;
	c->stats[S_messages_received]++;
	if (r->record_latency)
		r->lat[r->nlat++] = (ec_mono() - m->t_first) * 1e6;
}

/* pyround's _answer_nack(): re-send the fragments the shard does not hold. */
static int
answer_nack(struct ec_round *r, int i, const struct embnic_msg *h, const uint8_t *body)
{
	struct ec_ctx *c = r->c;
	struct ec_msg *m = &r->m[i];
	int list[EMBNIC_MAX_FRAGS], n = 0, rc;

	if (h->num_keys != m->num_keys || h->value_len != m->value_len ||
	    h->frag_len != EMBNIC_NACK_LEN)
		return drop(c, S_drop_mismatched_reply);
	for (uint32_t f = 0; f < m->frames; f++)
		if (!(body[f >> 3] >> (f & 7) & 1))
			list[n++] = (int)f;
	c->stats[S_nacks]++;
	if (n) {
		m->seq = r->seqs++;
		m->lost_at = 0;
		rc = send_frags(r, i, list, n, 1);
		if (rc < 0)
			return rc;
		c->stats[S_tries_by_nack]++;
		c->stats[S_frames_resent] += (uint64_t)n;
	}
	m = &r->m[i];
	m->t_sent = ec_mono();
	m->deadline = m->t_sent + m->rto;
	return 0;
}

static const uint8_t reply_of[EMBNIC_NB_TYPES] = {
	[EMBNIC_LOOKUP_REQ] = EMBNIC_LOOKUP_REPLY,
	[EMBNIC_UPDATE_REQ] = EMBNIC_UPDATE_ACK,
	[EMBNIC_SIZE_REQ] = EMBNIC_SIZE_ACK,
};

static void
evidence(struct ec_round *r, const struct ec_msg *m)
{
	if (m->seq0 > r->partial[m->shard])
		r->partial[m->shard] = m->seq0;
	r->any_partial = 1;
}

/* A reply to no pending message: a late probe's answer, else stale. */
static void
no_pending(struct ec_round *r, const struct embnic_msg *h, int i)
{
	struct ec_ctx *c = r->c;
	int whole = h->frag_count == 1;

	if (!whole && i >= 0) {	/* this round's: a whole duplicate reply */
		struct ec_msg *m = &r->m[i];
		uint32_t f = h->frag_index;

		if (m->dup[f >> 6] >> (f & 63) & 1)
			return;
		m->dup[f >> 6] |= 1ull << (f & 63);
		if (++m->ndup < h->frag_count)
			return;
		memset(m->dup, 0, sizeof(m->dup));
		m->ndup = 0;
		whole = 1;
	} else if (!whole) {
		whole = h->frag_index == 0;	/* another round's: by its first fragment */
	}
	if (!whole)
		return;
	if (h->client_id == c->client_id && ec_late_take(c, h->msg_id))
		return;
	c->stats[S_stale_replies]++;
}

/* One received datagram (pyround's _drain, its loop body). Returns 0, 1 (a shard
 * answered ERROR: res[] says which), or -errno. */
static int
on_frame(struct ec_round *r, const uint8_t *buf, uint32_t len)
{
	struct ec_ctx *c = r->c;
	struct embnic_msg h;
	struct ec_msg *m;
	int i, bad;
	uint32_t p;

	c->stats[S_frames_received]++;
	c->stats[S_bytes_received] += len;
	if (len < EMBNIC_HDR_LEN)
		return drop(c, S_drop_too_short);
	embnic_hdr_decode((const struct embnic_hdr *)buf, &h);
	if (embnic_ntoh16(((const struct embnic_hdr *)buf)->magic) != EMBNIC_MAGIC)
		return drop(c, S_drop_bad_magic);
	if (h.version != EMBNIC_PROTO_VERSION)
		return drop(c, S_drop_bad_version);
	if (h.msg_type < 1 || h.msg_type >= EMBNIC_NB_TYPES || embnic_is_request(h.msg_type))
		return drop(c, S_drop_bad_type);
	bad = embnic_check_lengths(&h, len - EMBNIC_HDR_LEN);
	if (bad != EMBNIC_DROP_NONE)
		return drop(c, bad == EMBNIC_DROP_TOO_MANY_FRAGS ? S_drop_too_many_frags :
			    bad == EMBNIC_DROP_FRAG_MISMATCH ? S_drop_frag_mismatch : S_drop_bad_length);
	if (h.msg_len > EC_MAX_MSG_LEN)
		return drop(c, S_drop_too_large);
	i = h.client_id == c->client_id ? ec_find(r, h.msg_id) : -1;
	if (i < 0 || r->m[i].state != Q_PENDING) {
		no_pending(r, &h, i);
		return 0;
	}
	m = &r->m[i];
	if (h.shard_id != c->shard_ids[m->shard])
		return drop(c, S_drop_wrong_shard_reply);
	if (h.msg_type == EMBNIC_ERROR) {
		r->res[R_KIND] = K_SHARD_ERROR;
		r->res[R_SHARD] = m->shard;
		r->res[R_TABLE] = h.table_id;
		r->res[R_STATUS] = h.status;
		return 1;
	}
	if (h.msg_type == EMBNIC_UPDATE_NACK && m->type == EMBNIC_UPDATE_REQ) {
		int rc = answer_nack(r, i, &h, buf + EMBNIC_HDR_LEN);

		evidence(r, &r->m[i]);
		return rc;
	}
	if (h.msg_type != reply_of[m->type] || h.num_keys != m->num_keys ||
	    h.num_tables != m->num_tables || h.value_len != m->value_len)
		return drop(c, S_drop_mismatched_reply);
	if (h.frag_count == 1) {
		scatter(r, m, 0, buf + EMBNIC_HDR_LEN, h.frag_len);
		complete(r, i);
		return 0;
	}
	p = h.frag_index + 1 < h.frag_count ? h.frag_len : h.frag_offset / h.frag_index;
	if (m->rfc == 0) {
		m->rfc = h.frag_count;
		m->rp = p;
	} else if (h.frag_count != m->rfc || p != m->rp) {
		return drop(c, S_drop_frag_mismatch);
	}
	if (m->got[h.frag_index >> 6] >> (h.frag_index & 63) & 1) {
		c->stats[S_duplicates]++;
		evidence(r, m);
		return 0;
	}
	m->got[h.frag_index >> 6] |= 1ull << (h.frag_index & 63);
	scatter(r, m, h.frag_offset, buf + EMBNIC_HDR_LEN, h.frag_len);
	if (++m->ngot == m->rfc)
		complete(r, i);
	else
		evidence(r, m);
	return 0;
}

/* pyround's _drain(): every waiting datagram, a recvmmsg batch at a time. */
int
ec_drain(struct ec_round *r)
{
	struct ec_ctx *c = r->c;

	r->ndone = 0;
	r->any_partial = 0;
	for (int s = 0; s < c->nshards; s++)
		r->partial[s] = -1;
	for (;;) {
		int n = recvmmsg(c->fd, c->rx, EC_RXB, MSG_DONTWAIT, NULL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		for (int k = 0; k < n; k++) {
			int rc;

			if (r->ndone == r->cap_done) {
				int *d = realloc(r->done, sizeof(int) * (size_t)r->cap_done * 2);

				if (d == NULL)
					return -ENOMEM;
				r->done = d;
				r->cap_done *= 2;
			}
			rc = on_frame(r, c->rxbuf + (size_t)k * EC_SLOT, c->rx[k].msg_len);
			if (rc != 0)
				return rc;
		}
		if (n < EC_RXB)
			return 0;
	}
}
