/* SPDX-License-Identifier: Apache-2.0
 *
 * The training client's round I/O, in C: one call sends a round's request
 * messages and waits for every answer — sendmmsg/recvmmsg on the client's UDP
 * socket, reply fragments copied straight to their rows in the caller's
 * output buffer, the send window, the retransmission timers and the loss
 * detection and recovery of docs/protocol.md "Reliability" (RACK by
 * transmission order, RFC 6298 timers with Karn's rule and backoff, tail
 * probes, lookup repairs, update polls answered by UPDATE_ACK or
 * UPDATE_NACK). Built as build/libembnic-client.so (no DPDK) and called
 * through ctypes by client_lib/native.py.
 *
 * client_lib/client.py (EmbeddingClient._round and the functions it calls)
 * is the readable reference this follows step for step, and the fallback
 * where this library is not built; tests/client_lib/test_native_round.py
 * runs both on the same rounds and compares the frames they send and the
 * arrays they return, loss-free and under loss, duplication and reordering.
 *
 * No allocation per frame: the round's message table grows only when a
 * repair or a tail probe adds a message; frames are built as iovecs over
 * the caller's arrays (header, directory, keys, values), never copied.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "embnic_parse.h"
#include "embnic_proto.h"

#define EC_RXB 32		/* datagrams per recvmmsg */
#define EC_SLOT 65536		/* bytes per receive slot: any UDP datagram */
#define EC_TXB 64		/* frames per sendmmsg */
#define EC_LATE 4096		/* answers of tail probes expected after their round */
#define EC_MAX_MSG_LEN (64u << 20)	/* a reply body above it: too_large */
#define EC_REO_WND_MIN 0.001	/* least reordering window, s (rtt.py) */
#define EC_G 1e-6		/* RFC 6298 clock granularity, s */

/* Counters, in the order of client_lib/native.py STAT_NAMES (ec_stat_name()). */
#define EC_STATS(X) \
	X(messages_sent) X(frames_sent) X(bytes_sent) X(messages_received) \
	X(frames_received) X(bytes_received) X(retransmits) X(timeouts) \
	X(fast_retransmits) X(repairs) X(probes) X(max_inflight_frames) \
	X(update_polls) X(nacks) X(tries_by_nack) X(frames_resent) \
	X(stale_replies) X(duplicates) \
	X(drop_too_short) X(drop_bad_magic) X(drop_bad_version) \
	X(drop_bad_type) X(drop_bad_length) X(drop_too_many_frags) \
	X(drop_frag_mismatch) X(drop_too_large) X(drop_wrong_shard_reply) \
	X(drop_mismatched_reply)

enum {
#define EC_STAT_ENUM(n) S_##n,
	EC_STATS(EC_STAT_ENUM)
#undef EC_STAT_ENUM
	S_END
};

/* Columns of a round's message table (client_lib/roundplan.py MSG_COLUMNS,
 * then the message id and type): one int64 row per message. */
enum {
	M_SHARD, M_DIR0, M_NT, M_KA, M_KB, M_NKEYS, M_VLEN, M_VOFF, M_MSGLEN,
	M_FRAMES, M_RFRAMES, M_ID, M_TYPE, M_NCOL
};

/* What a round returns in res[] (client_lib/native.py reads it). */
enum {
	R_KIND, R_SHARD, R_TABLE, R_STATUS, R_TRIES, R_TYPE, R_NMSG, R_BIG,
	R_ERRNO, R_ELAPSED_NS, R_NEXT_ID, R_NLAT, R_LARGEST, R_NCOL
};
enum { K_OK = 0, K_SHARD_ERROR = 1, K_GIVE_UP = 2, K_OS_ERROR = 3, K_INTERRUPTED = 4 };
/*
 * The longest one ppoll of a round waits (s) before the round goes back to
 * its caller, which runs the handlers of signals that came and resumes the
 * round at once: a signal that comes while the round is not in ppoll (Python's
 * C handler only sets a flag then) interrupts no ppoll, so without the slice a
 * Ctrl-C would wait for the round's retries (ppoll(2) describes the race;
 * blocking the signals instead would send a process-directed one to another
 * thread of the interpreter, which interrupts nothing either).
 */
#define EC_SIGNAL_SLICE_S 0.1

struct ec_round;
struct ec_ctx;
void embnic_client_abort(struct ec_ctx *c);

struct ec_rtt {
	double srtt;		/* < 0: no sample yet */
	double rttvar;
	double rto;
	double min_rtt;		/* < 0: no sample yet */
	int64_t samples;
};

struct ec_ctx {
	int fd;
	uint16_t client_id;
	uint32_t p;		/* body bytes per fragment at the MTU */
	int64_t window;
	int retries;
	double timeout_s, rto_min, rto_max;
	int tail_probes;
	int fixed_length;
	int nshards;
	struct sockaddr_in *dest;	/* per shard index */
	uint16_t *shard_ids;	/* per shard index: its id */
	struct ec_rtt *rtt;	/* [shard][3]: LOOKUP, UPDATE, SIZE */
	int64_t largest_answered;
	uint64_t stats[S_END];
	uint32_t late[EC_LATE];	/* probe ids after their round; 0: free */
	int late_head;
	/* receive and send scratch */
	uint8_t *rxbuf;
	struct mmsghdr rx[EC_RXB];
	struct iovec rxiov[EC_RXB];
	struct embnic_hdr txh[EC_TXB];
	struct iovec txiov[EC_TXB][5];
	struct mmsghdr tx[EC_TXB];
	struct ec_round *cur;	/* a round a signal interrupted, to resume */
};

enum { Q_QUEUED, Q_PENDING, Q_DONE, Q_REPLACED, Q_LATE };

struct ec_msg {
	uint32_t msg_id;
	uint8_t type;
	uint8_t probe;
	uint8_t state;
	int shard;
	uint16_t num_tables;
	uint32_t num_keys, value_len, msg_len;
	uint32_t frames, reply_frames;
	int64_t cost, datagram;
	const uint8_t *seg[3];
	uint64_t seglen[3];
	const uint8_t *dirp;	/* its directory (num_tables entries) */
	const uint64_t *keyp;	/* its keys (num_keys) */
	int64_t ka, kb;		/* rows: grouped keys ka..kb-1, or kidx[] */
	int64_t *kidx;		/* a repair's keys (grouped positions), or NULL */
	int64_t *kso;		/* a repair's row offsets in its reply (nk+1) */
	int root;		/* a repair: the round message it completes */
	double t_first, t_sent, deadline, rto, lost_at;
	int tries;
	int64_t seq0, seq;
	uint64_t got[4], dup[4];
	uint32_t ngot, ndup, rp, rfc;
	uint8_t *own;		/* a repair's or probe's body */
	int next;		/* next message in its shard's queue */
};

struct ec_round {
	struct ec_ctx *c;
	struct ec_msg *m;
	int n, cap;
	int *pend;		/* pending message indices, insertion order; -1: removed */
	int npend, cap_pend, live_pend;
	int *hash;		/* msg_id -> index, open addressing */
	uint32_t hmask;
	int *qhead, *qtail;	/* per shard: its queue */
	int64_t *inflight;
	int *probe_src;		/* per shard: message a probe follows, or -1 */
	int *probe_order;	/* shards due a probe, in insertion order */
	int nprobe;
	int64_t *partial, *ev;
	int any_partial;
	int *first_fired;
	int *done;
	int ndone, cap_done;
	int64_t live;
	int64_t seqs;
	uint32_t next_id;
	/* the caller's arrays */
	const uint64_t *keys;
	const int64_t *dst, *rb, *so;
	uint8_t *out;
	int record_latency;
	double *lat;
	int64_t nlat;
	int64_t *res;
	double t0;
};

int
embnic_client_abi(void)
{
	return EMBNIC_PROTO_VERSION * 1000000 + EMBNIC_NB_HDR_FIELDS * 10000 +
	       M_NCOL * 100 + R_NCOL;
}

static const char *const stat_names[] = {
#define EC_STAT_NAME(n) #n,
	EC_STATS(EC_STAT_NAME)
#undef EC_STAT_NAME
};

const char *
embnic_client_stat_name(int i)
{
	return i >= 0 && i < S_END ? stat_names[i] : NULL;
}

int
embnic_client_nstats(void)
{
	return S_END;
}

static double
mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int
tslot(uint8_t type)
{
	return type == EMBNIC_LOOKUP_REQ ? 0 : type == EMBNIC_UPDATE_REQ ? 1 : 2;
}

static struct ec_rtt *
rtt_of(struct ec_ctx *c, int shard, uint8_t type)
{
	return &c->rtt[shard * 3 + tslot(type)];
}

/* RFC 6298 section 2 (client_lib/rtt.py RttEstimator.sample). */
static void
rtt_sample(struct ec_ctx *c, struct ec_rtt *e, double r)
{
	double v;

	e->min_rtt = e->min_rtt < 0 ? r : (r < e->min_rtt ? r : e->min_rtt);
	if (e->srtt < 0) {
		e->srtt = r;
		e->rttvar = r / 2;
	} else {
		e->rttvar = 0.75 * e->rttvar +
			    0.25 * (e->srtt > r ? e->srtt - r : r - e->srtt);
		e->srtt = 0.875 * e->srtt + 0.125 * r;
	}
	e->samples++;
	v = e->srtt + (4.0 * e->rttvar > EC_G ? 4.0 * e->rttvar : EC_G);
	v = v < c->rto_min ? c->rto_min : v;
	e->rto = v > c->rto_max ? c->rto_max : v;
}

/*
 * A client context: the socket (non-blocking, bound), this client's id,
 * the MTU, the transport's settings and each shard's destination (IPv4 and
 * UDP port, network order). Returns NULL when out of memory.
 */
struct ec_ctx *
embnic_client_new(int fd, int client_id, int mtu, int64_t window_frames,
		  int retries, double timeout_s, double rto_min_s,
		  double rto_max_s, int tail_probes, int fixed_length,
		  int nshards, const uint16_t *shard_ids, const uint32_t *ip,
		  const uint16_t *port)
{
	struct ec_ctx *c = calloc(1, sizeof(*c));
	double rto0;

	if (c == NULL)
		return NULL;
	c->dest = calloc(nshards > 0 ? nshards : 1, sizeof(*c->dest));
	c->shard_ids = calloc(nshards > 0 ? nshards : 1, sizeof(*c->shard_ids));
	c->rtt = calloc(nshards > 0 ? nshards * 3 : 1, sizeof(*c->rtt));
	c->rxbuf = malloc((size_t)EC_RXB * EC_SLOT);
	if (c->dest == NULL || c->shard_ids == NULL || c->rtt == NULL || c->rxbuf == NULL) {
		free(c->dest);
		free(c->shard_ids);
		free(c->rtt);
		free(c->rxbuf);
		free(c);
		return NULL;
	}
	c->fd = fd;
	c->client_id = (uint16_t)client_id;
	c->p = (uint32_t)(mtu - EMBNIC_IPV4_LEN - EMBNIC_UDP_LEN -
			  EMBNIC_HDR_LEN);
	c->window = window_frames;
	c->retries = retries;
	c->timeout_s = timeout_s;
	c->rto_min = rto_min_s;
	c->rto_max = rto_max_s;
	c->tail_probes = tail_probes;
	c->fixed_length = fixed_length;
	c->nshards = nshards;
	rto0 = timeout_s < rto_min_s ? rto_min_s : timeout_s;
	rto0 = rto0 > rto_max_s ? rto_max_s : rto0;
	for (int s = 0; s < nshards; s++) {
		c->dest[s].sin_family = AF_INET;
		c->dest[s].sin_addr.s_addr = ip[s];
		c->dest[s].sin_port = port[s];
		c->shard_ids[s] = shard_ids[s];
		for (int t = 0; t < 3; t++) {
			struct ec_rtt *e = &c->rtt[s * 3 + t];

			e->srtt = -1;
			e->min_rtt = -1;
			e->rttvar = 0;
			e->rto = rto0;
		}
	}
	for (int i = 0; i < EC_RXB; i++) {
		c->rxiov[i].iov_base = c->rxbuf + (size_t)i * EC_SLOT;
		c->rxiov[i].iov_len = EC_SLOT;
		c->rx[i].msg_hdr.msg_iov = &c->rxiov[i];
		c->rx[i].msg_hdr.msg_iovlen = 1;
	}
	return c;
}

void
embnic_client_free(struct ec_ctx *c)
{
	if (c == NULL)
		return;
	embnic_client_abort(c);
	free(c->dest);
	free(c->shard_ids);
	free(c->rtt);
	free(c->rxbuf);
	free(c);
}

/* The counters so far (S_END uint64, cumulative). */
void
embnic_client_stats(const struct ec_ctx *c, uint64_t *out)
{
	memcpy(out, c->stats, sizeof(c->stats));
}

/* One estimator: srtt, rttvar, rto, min_rtt (s; srtt, min_rtt < 0 before a
 * sample), samples. Returns -1 for a shard index out of range. */
int
embnic_client_rtt(const struct ec_ctx *c, int shard, int type, double *out)
{
	const struct ec_rtt *e;

	if (shard < 0 || shard >= c->nshards)
		return -1;
	e = &c->rtt[shard * 3 + tslot((uint8_t)type)];
	out[0] = e->srtt;
	out[1] = e->rttvar;
	out[2] = e->rto;
	out[3] = e->min_rtt;
	out[4] = (double)e->samples;
	return 0;
}

/* -- the round's message table ------------------------------------------- */

static int
hash_slot(const struct ec_round *r, uint32_t id)
{
	uint32_t h = (id * 2654435761u) & r->hmask;

	while (r->hash[h] >= 0 && r->m[r->hash[h]].msg_id != id)
		h = (h + 1) & r->hmask;
	return (int)h;
}

static int
find(const struct ec_round *r, uint32_t id)
{
	return r->hash[hash_slot(r, id)];
}

static int
rehash(struct ec_round *r, uint32_t size)
{
	int *h = malloc(sizeof(int) * size);

	if (h == NULL)
		return -ENOMEM;
	free(r->hash);
	r->hash = h;
	r->hmask = size - 1;
	memset(h, 0xff, sizeof(int) * size);
	for (int i = 0; i < r->n; i++)
		r->hash[hash_slot(r, r->m[i].msg_id)] = i;
	return 0;
}

/* A new message (zeroed), or -ENOMEM. Indices stay valid, pointers not. */
static int
add_msg(struct ec_round *r, uint32_t id)
{
	if (r->n == r->cap) {
		int cap = r->cap * 2;
		struct ec_msg *m = realloc(r->m, sizeof(*m) * cap);

		if (m == NULL)
			return -ENOMEM;
		r->m = m;
		r->cap = cap;
	}
	if ((uint32_t)(r->n + 1) * 2 > r->hmask + 1 &&
	    rehash(r, (r->hmask + 1) * 2) < 0)
		return -ENOMEM;
	memset(&r->m[r->n], 0, sizeof(r->m[r->n]));
	r->m[r->n].msg_id = id;
	r->m[r->n].root = -1;
	r->m[r->n].next = -1;
	r->hash[hash_slot(r, id)] = r->n;
	return r->n++;
}

static uint32_t
alloc_id(struct ec_round *r)
{
	uint32_t i = r->next_id;

	r->next_id = (i + 1) ? i + 1 : 1;
	return i;
}

static int
pend_add(struct ec_round *r, int i)
{
	if (r->npend == r->cap_pend) {
		int k = 0;

		for (int j = 0; j < r->npend; j++)	/* compact first */
			if (r->pend[j] >= 0)
				r->pend[k++] = r->pend[j];
		r->npend = k;
		if (k * 2 > r->cap_pend) {
			int *p = realloc(r->pend, sizeof(int) * r->cap_pend * 2);

			if (p == NULL)
				return -ENOMEM;
			r->pend = p;
			r->cap_pend *= 2;
		}
	}
	r->pend[r->npend++] = i;
	r->live_pend++;
	r->m[i].state = Q_PENDING;
	return 0;
}

static void
pend_del(struct ec_round *r, int i, int state)
{
	for (int j = 0; j < r->npend; j++)
		if (r->pend[j] == i) {
			r->pend[j] = -1;
			break;
		}
	r->live_pend--;
	r->m[i].state = (uint8_t)state;
}

/* The message's frames, cost and largest datagram from its lengths. */
static void
geometry(const struct ec_ctx *c, struct ec_msg *m)
{
	uint64_t reply = m->type == EMBNIC_LOOKUP_REQ ? m->value_len : 0;
	uint64_t big_req = m->msg_len < c->p ? m->msg_len : c->p;
	uint64_t big_rep = reply < c->p ? reply : c->p;

	m->frames = m->msg_len ? (uint32_t)((m->msg_len + c->p - 1) / c->p) : 1;
	m->reply_frames = reply ? (uint32_t)((reply + c->p - 1) / c->p) : 1;
	m->cost = (int64_t)m->frames + m->reply_frames;
	m->datagram = EMBNIC_IPV4_LEN + EMBNIC_UDP_LEN + EMBNIC_HDR_LEN +
		      (int64_t)(big_req > big_rep ? big_req : big_rep);
}

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

/* EmbeddingClient._send: fragments (all, or list[0..n)) of message i; a try
 * of it (and a retransmit) unless !count_try (what a NACK asks for). */
static int
send_msg(struct ec_round *r, int i, const int *list, int n, int retransmit,
	 int count_try)
{
	int rc = send_frags(r, i, list, list ? n : (int)r->m[i].frames, retransmit);

	if (rc < 0)
		return rc;
	if (!count_try)
		return 0;
	r->m[i].tries++;
	if (retransmit)
		r->c->stats[S_retransmits]++;
	return 0;
}

static void
late_add(struct ec_ctx *c, uint32_t id)
{
	c->late[c->late_head] = id;
	c->late_head = (c->late_head + 1) % EC_LATE;
}

/* An answer of a probe after its round: consumed (1), else 0. */
static int
late_take(struct ec_ctx *c, uint32_t id)
{
	for (int j = 0; j < EC_LATE; j++)
		if (c->late[j] == id && id != 0) {
			c->late[j] = 0;
			return 1;
		}
	return 0;
}

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

/* _round's fill(): send shard s's queued messages while its window has room. */
static int
fill(struct ec_round *r, int s)
{
	struct ec_ctx *c = r->c;
	int last = -1, rc;

	while (r->qhead[s] >= 0) {
		int i = r->qhead[s];
		struct ec_msg *m = &r->m[i];

		if (!(r->inflight[s] == 0 || r->inflight[s] + m->cost <= c->window))
			break;
		r->qhead[s] = m->next;
		m->t_first = m->t_sent = mono();
		m->seq0 = m->seq = r->seqs++;
		m->rto = rtt_of(c, s, m->type)->rto;
		rc = send_msg(r, i, NULL, 0, 0, 1);
		if (rc < 0)
			return rc;
		m = &r->m[i];
		m->deadline = mono() + m->rto;
		c->stats[S_messages_sent]++;
		if (pend_add(r, i) < 0)
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

/* A message's row k: its grouped position and its offset in the reply. */
static inline int64_t
row_pos(const struct ec_msg *m, int64_t k)
{
	return m->kidx ? m->kidx[k] : m->ka + k;
}

static inline int64_t
row_off(const struct ec_round *r, const struct ec_msg *m, int64_t k)
{
	return m->kidx ? m->kso[k] : r->so[m->ka + k] - r->so[m->ka];
}

/*
 * _repair(): a new LOOKUP_REQ for only the keys of message i whose rows lie
 * (in part) in its missing reply fragments. Returns its index, -1 when no
 * fragment of i's reply is held (send i again instead), or -ENOMEM.
 */
static int
repair(struct ec_round *r, int i)
{
	struct ec_msg *m = &r->m[i];
	int64_t nk = m->num_keys, nsel = 0;
	uint32_t p = m->rp, cm[EMBNIC_MAX_FRAGS + 1];
	int nt = m->num_tables, nt2 = 0;
	uint32_t *sub;
	uint8_t *own;
	int64_t *kidx, *kso;
	int ri;

	if (m->ngot == 0 || p == 0)
		return -1;
	cm[0] = 0;
	for (uint32_t f = 0; f < m->rfc; f++)
		cm[f + 1] = cm[f] + !(m->got[f >> 6] >> (f & 63) & 1);
	sub = calloc((size_t)nt + 1, sizeof(*sub));
	kidx = malloc(sizeof(*kidx) * (size_t)(nk + 1));
	kso = malloc(sizeof(*kso) * (size_t)(nk + 1));
	own = malloc((size_t)EMBNIC_DIR_ENTRY * nt + (size_t)EMBNIC_KEY_SIZE * nk);
	if (sub == NULL || kidx == NULL || kso == NULL || own == NULL)
		goto nomem;
	/* walk the keys table by table (directory order) */
	{
		int64_t k = 0;

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
					memcpy(own + (size_t)EMBNIC_DIR_ENTRY * nt +
						       (size_t)EMBNIC_KEY_SIZE * nsel,
					       m->keyp + k, EMBNIC_KEY_SIZE);
					nsel++;
					sub[e]++;
				}
			}
		}
	}
	/* the directory of the tables left, packed before the keys */
	{
		uint8_t *keys0 = own + (size_t)EMBNIC_DIR_ENTRY * nt;

		for (int e = 0; e < nt; e++) {
			if (!sub[e])
				continue;
			memcpy(own + (size_t)EMBNIC_DIR_ENTRY * nt2,
			       m->dirp + (size_t)e * EMBNIC_DIR_ENTRY, EMBNIC_DIR_ENTRY);
			memcpy(own + (size_t)EMBNIC_DIR_ENTRY * nt2 + 8, &sub[e], 4);
			nt2++;
		}
		memmove(own + (size_t)EMBNIC_DIR_ENTRY * nt2, keys0,
			(size_t)EMBNIC_KEY_SIZE * nsel);
	}
	kso[0] = 0;
	for (int64_t k = 0; k < nsel; k++)
		kso[k + 1] = kso[k] + r->rb[kidx[k]];
	free(sub);
	sub = NULL;
	ri = add_msg(r, alloc_id(r));
	if (ri < 0)
		goto nomem;
	m = &r->m[i];
	{
		struct ec_msg *n = &r->m[ri];
		int root = m->root >= 0 ? m->root : i;

		n->type = EMBNIC_LOOKUP_REQ;
		n->shard = m->shard;
		n->num_tables = (uint16_t)nt2;
		n->num_keys = (uint32_t)nsel;
		n->value_len = (uint32_t)kso[nsel];
		n->msg_len = (uint32_t)((size_t)EMBNIC_DIR_ENTRY * nt2 +
					(size_t)EMBNIC_KEY_SIZE * nsel);
		n->own = own;
		n->seg[0] = own;
		n->seglen[0] = n->msg_len;
		n->dirp = own;
		n->keyp = (const uint64_t *)(own + (size_t)EMBNIC_DIR_ENTRY * nt2);
		n->kidx = kidx;
		n->kso = kso;
		n->root = root;
		n->t_first = r->m[root].t_first;
		n->t_sent = mono();
		n->rto = m->rto;
		n->tries = m->tries;
		geometry(r->c, n);
	}
	return ri;
nomem:
	free(sub);
	free(kidx);
	free(kso);
	free(own);
	return -ENOMEM;
}

/* _round's resend(): repair message i, or send it again (an update of
 * several fragments: its last one, a poll). Returns 0 or -errno. */
static int
resend(struct ec_round *r, int i)
{
	struct ec_ctx *c = r->c;
	struct ec_msg *m = &r->m[i];
	int ri = -1, rc, poll_;

	if (m->type == EMBNIC_LOOKUP_REQ && !c->fixed_length) {
		ri = repair(r, i);
		if (ri < -1)
			return ri;
	}
	if (ri >= 0) {
		pend_del(r, i, Q_REPLACED);
		memset(r->m[i].dup, 0, sizeof(r->m[i].dup));
		r->m[i].ndup = 0;
		if (pend_add(r, ri) < 0)
			return -ENOMEM;
		c->stats[S_repairs]++;
		i = ri;
	}
	m = &r->m[i];
	m->seq = r->seqs++;
	if (ri >= 0)
		m->seq0 = m->seq;
	m->lost_at = 0;
	m->t_sent = mono();
	poll_ = m->type == EMBNIC_UPDATE_REQ && m->frames > 1;
	if (poll_) {
		int last = (int)m->frames - 1;

		c->stats[S_update_polls]++;
		rc = send_msg(r, i, &last, 1, ri < 0, 1);
	} else {
		rc = send_msg(r, i, NULL, 0, ri < 0, 1);
	}
	if (rc < 0)
		return rc;
	if (ri >= 0)
		c->stats[S_retransmits]++;
	m = &r->m[i];
	m->deadline = mono() + m->rto;
	if (c->tail_probes && r->qhead[m->shard] < 0)
		set_probe_src(r, m->shard, i);
	return 0;
}

/* _round's probe(): a one-key lookup after shard s's last message. */
static int
probe(struct ec_round *r, int s)
{
	struct ec_ctx *c = r->c;
	int src = pop_probe_src(r, s), found = 0, pi, rc;
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
	now = mono();
	own = malloc(EMBNIC_DIR_ENTRY + EMBNIC_KEY_SIZE);
	if (own == NULL)
		return -ENOMEM;
	memcpy(own, r->m[src].dirp, EMBNIC_DIR_ENTRY);
	memcpy(own + 8, &(uint32_t){ 1 }, 4);
	memcpy(own + EMBNIC_DIR_ENTRY, r->m[src].keyp, EMBNIC_KEY_SIZE);
	memcpy(&dim, own + 2, 2);
	dtype = own[4];
	pi = add_msg(r, alloc_id(r));
	if (pi < 0) {
		free(own);
		return -ENOMEM;
	}
	{
		struct ec_msg *p = &r->m[pi];

		p->type = EMBNIC_LOOKUP_REQ;
		p->probe = 1;
		p->shard = s;
		p->num_tables = 1;
		p->num_keys = 1;
		p->value_len = (uint32_t)dim * (dtype == EMBNIC_DTYPE_FP16 ? 2 : 4);
		p->msg_len = EMBNIC_DIR_ENTRY + EMBNIC_KEY_SIZE;
		p->own = own;
		p->seg[0] = own;
		p->seglen[0] = p->msg_len;
		p->dirp = own;
		p->keyp = (const uint64_t *)(own + EMBNIC_DIR_ENTRY);
		p->t_first = p->t_sent = now;
		p->rto = rtt_of(c, s, EMBNIC_LOOKUP_REQ)->rto;
		geometry(c, p);
		p->seq0 = p->seq = r->seqs++;
	}
	rc = send_msg(r, pi, NULL, 0, 0, 1);
	if (rc < 0)
		return rc;
	r->m[pi].deadline = mono() + r->m[pi].rto;
	if (pend_add(r, pi) < 0)
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
	const struct ec_rtt *e = rtt_of(r->c, m->shard, m->type);
	double w = (e->min_rtt >= 0 ? e->min_rtt : e->rto) / 4;

	return w > EC_REO_WND_MIN ? w : EC_REO_WND_MIN;
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
	pend_del(r, i, Q_DONE);
	memset(m->dup, 0, sizeof(m->dup));
	m->ndup = 0;
	r->done[r->ndone++] = i;
	if (m->probe)
		return;
	c->stats[S_messages_received]++;
	if (r->record_latency)
		r->lat[r->nlat++] = (mono() - m->t_first) * 1e6;
}

/* _answer_nack(): re-send the fragments the shard does not hold. */
static int
answer_nack(struct ec_round *r, int i, const struct embnic_msg *h, const uint8_t *body)
{
	struct ec_ctx *c = r->c;
	struct ec_msg *m = &r->m[i];
	int list[EMBNIC_MAX_FRAGS], n = 0, rc;

	if (h->num_keys != m->num_keys || h->value_len != m->value_len ||
	    h->frag_len != EMBNIC_NACK_LEN) {
		c->stats[S_drop_mismatched_reply]++;
		return 0;
	}
	for (uint32_t f = 0; f < m->frames; f++)
		if (!(body[f >> 3] >> (f & 7) & 1))
			list[n++] = (int)f;
	c->stats[S_nacks]++;
	if (n) {
		m->seq = r->seqs++;
		m->lost_at = 0;
		rc = send_msg(r, i, list, n, 1, 0);
		if (rc < 0)
			return rc;
		c->stats[S_tries_by_nack]++;
		c->stats[S_frames_resent] += (uint64_t)n;
	}
	m = &r->m[i];
	m->t_sent = mono();
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
	if (h->client_id == c->client_id && late_take(c, h->msg_id))
		return;
	c->stats[S_stale_replies]++;
}

/* One received datagram (_drain's loop body). Returns 0, 1 (a shard
 * answered ERROR: res[] says which), or -errno. */
static int
on_frame(struct ec_round *r, const uint8_t *buf, uint32_t len)
{
	struct ec_ctx *c = r->c;
	struct embnic_msg h;
	struct ec_msg *m;
	int i, drop;
	uint32_t p;

	c->stats[S_frames_received]++;
	c->stats[S_bytes_received] += len;
	if (len < EMBNIC_HDR_LEN) {
		c->stats[S_drop_too_short]++;
		return 0;
	}
	embnic_hdr_decode((const struct embnic_hdr *)buf, &h);
	if (embnic_ntoh16(((const struct embnic_hdr *)buf)->magic) != EMBNIC_MAGIC) {
		c->stats[S_drop_bad_magic]++;
		return 0;
	}
	if (h.version != EMBNIC_PROTO_VERSION) {
		c->stats[S_drop_bad_version]++;
		return 0;
	}
	if (h.msg_type < 1 || h.msg_type >= EMBNIC_NB_TYPES || embnic_is_request(h.msg_type)) {
		c->stats[S_drop_bad_type]++;
		return 0;
	}
	drop = embnic_check_lengths(&h, len - EMBNIC_HDR_LEN);
	if (drop != EMBNIC_DROP_NONE) {
		c->stats[drop == EMBNIC_DROP_TOO_MANY_FRAGS ? S_drop_too_many_frags :
			 drop == EMBNIC_DROP_FRAG_MISMATCH ? S_drop_frag_mismatch :
							      S_drop_bad_length]++;
		return 0;
	}
	if (h.msg_len > EC_MAX_MSG_LEN) {
		c->stats[S_drop_too_large]++;
		return 0;
	}
	i = h.client_id == c->client_id ? find(r, h.msg_id) : -1;
	if (i < 0 || r->m[i].state != Q_PENDING) {
		no_pending(r, &h, i);
		return 0;
	}
	m = &r->m[i];
	if (h.shard_id != c->shard_ids[m->shard]) {
		c->stats[S_drop_wrong_shard_reply]++;
		return 0;
	}
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
	    h.num_tables != m->num_tables || h.value_len != m->value_len) {
		c->stats[S_drop_mismatched_reply]++;
		return 0;
	}
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
		c->stats[S_drop_frag_mismatch]++;
		return 0;
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

/* _drain(): every waiting datagram, a recvmmsg batch at a time. */
static int
drain(struct ec_round *r)
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

/* _expire(): timers that fired; per shard only the one sent first is sent again. */
static int
expire(struct ec_round *r, double now)
{
	struct ec_ctx *c = r->c;
	int nf = 0, rc;
	int *fired = malloc(sizeof(int) * (size_t)(r->npend + 1));

	if (fired == NULL)
		return -ENOMEM;
	for (int j = 0; j < r->npend; j++) {
		int x = r->pend[j];

		if (x >= 0 && r->m[x].probe && r->m[x].deadline <= now) {
			pend_del(r, x, Q_LATE);	/* never re-sent: its answer is expected late */
			late_add(c, r->m[x].msg_id);
		}
	}
	for (int j = 0; j < r->npend; j++) {
		int x = r->pend[j];

		if (x >= 0 && r->m[x].deadline <= now)
			fired[nf++] = x;
	}
	for (int j = 0; j < nf; j++)
		if (r->m[fired[j]].tries >= c->retries) {
			give_up(r, fired[j], now);
			free(fired);
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
		if (rc < 0) {
			free(fired);
			return rc;
		}
	}
	free(fired);
	return 0;
}

/* After a drain: answered messages, then loss detection (RACK) and timers
 * of the shards that answered (the body of _round's while loop). */
static int
after_drain(struct ec_round *r, double now)
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
			rtt_sample(c, rtt_of(c, s, m->type), now - m->t_first);
		rc = fill(r, s);
		if (rc < 0)
			return rc;
	}
	if (r->ndone || r->any_partial) {
		for (int s = 0; s < c->nshards; s++)
			r->ev[s] = r->partial[s];
		for (int d = 0; d < r->ndone; d++) {
			const struct ec_msg *m = &r->m[r->done[d]];
			const struct ec_rtt *e = rtt_of(c, m->shard, m->type);
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

static int
fast_retransmit(struct ec_round *r)
{
	struct ec_ctx *c = r->c;
	double now = mono();
	int n = 0, rc;
	int *lost = malloc(sizeof(int) * (size_t)(r->npend + 1));

	if (lost == NULL)
		return -ENOMEM;
	for (int j = 0; j < r->npend; j++) {
		int x = r->pend[j];

		if (x >= 0 && r->m[x].lost_at != 0 && r->m[x].lost_at <= now)
			lost[n++] = x;
	}
	for (int j = 0; j < n; j++) {
		if (r->m[lost[j]].tries >= c->retries) {
			give_up(r, lost[j], now);
			free(lost);
			return 2;
		}
		c->stats[S_fast_retransmits]++;
		rc = resend(r, lost[j]);
		if (rc < 0) {
			free(lost);
			return rc;
		}
	}
	free(lost);
	return 0;
}

static int
probes_due(struct ec_round *r)
{
	while (r->nprobe > 0) {
		int rc = probe(r, r->probe_order[0]);

		if (rc < 0)
			return rc;
	}
	return 0;
}

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
	free(r->qhead);
	free(r->qtail);
	free(r->inflight);
	free(r->probe_src);
	free(r->probe_order);
	free(r->partial);
	free(r->ev);
	free(r->first_fired);
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

/*
 * Run one round: send the nmsg messages of tab (int64 rows of M_NCOL
 * columns, in queue order: a shard's messages largest first) and wait for
 * every answer (client_lib/client.py EmbeddingClient._round).
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
	struct ec_round *rp = c->cur;
	int S = c->nshards, rc = 0, *order, norder = 0;
	uint32_t hs = 64;

	memset(res, 0, sizeof(int64_t) * R_NCOL);
	if (rp != NULL) {	/* a round a signal interrupted: on with it */
		c->cur = NULL;
		rp->res = res;
		rp->lat = lat;
		goto loop;
	}
	rp = calloc(1, sizeof(*rp));
	if (rp == NULL) {
		res[R_KIND] = K_OS_ERROR;
		res[R_ERRNO] = ENOMEM;
		return -ENOMEM;
	}
#define r (*rp)
	r.c = c;
	r.res = res;
	r.keys = keys;
	r.dst = dst;
	r.rb = rb;
	r.so = so;
	r.out = out;
	r.record_latency = record_latency;
	r.lat = lat;
	r.next_id = next_id;
	r.cap = nmsg * 2 + 16;
	r.cap_pend = nmsg * 2 + 16;
	r.cap_done = nmsg + 16;
	while (hs < (uint32_t)r.cap * 2)
		hs *= 2;
	r.m = malloc(sizeof(*r.m) * (size_t)r.cap);
	r.pend = malloc(sizeof(int) * (size_t)r.cap_pend);
	r.hash = malloc(sizeof(int) * hs);
	r.hmask = hs - 1;
	r.qhead = malloc(sizeof(int) * (size_t)(S + 1));
	r.qtail = malloc(sizeof(int) * (size_t)(S + 1));
	r.inflight = calloc((size_t)S + 1, sizeof(int64_t));
	r.probe_src = malloc(sizeof(int) * (size_t)(S + 1));
	r.probe_order = malloc(sizeof(int) * (size_t)(S + 1));
	r.partial = malloc(sizeof(int64_t) * (size_t)(S + 1));
	r.ev = malloc(sizeof(int64_t) * (size_t)(S + 1));
	r.first_fired = malloc(sizeof(int) * (size_t)(S + 1));
	r.done = malloc(sizeof(int) * (size_t)r.cap_done);
	order = r.first_fired;	/* shards in order of first appearance, before any timer */
	if (!r.m || !r.pend || !r.hash || !r.qhead || !r.qtail || !r.inflight || !r.probe_src ||
	    !r.probe_order || !r.partial || !r.ev || !r.first_fired || !r.done) {
		rc = -ENOMEM;
		goto out;
	}
	memset(r.hash, 0xff, sizeof(int) * hs);
	for (int s = 0; s < S; s++) {
		r.qhead[s] = r.qtail[s] = -1;
		r.probe_src[s] = -1;
	}
	r.t0 = mono();
	for (int j = 0; j < nmsg; j++) {
		const int64_t *row = tab + (size_t)j * M_NCOL;
		int i = add_msg(&r, (uint32_t)row[M_ID]);
		struct ec_msg *m;
		int64_t nk = row[M_KB] - row[M_KA];
		int s = (int)row[M_SHARD];

		if (i < 0 || s < 0 || s >= S) {
			rc = i < 0 ? i : -EINVAL;
			goto out;
		}
		m = &r.m[i];
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
		geometry(c, m);
		m->state = Q_QUEUED;
		if (r.qhead[s] < 0) {
			r.qhead[s] = i;
			order[norder++] = s;
		} else {
			r.m[r.qtail[s]].next = i;
		}
		r.qtail[s] = i;
	}
	r.seqs = 0;
	for (int j = 0; j < norder && rc == 0; j++)
		rc = fill(&r, order[j]);
	if (rc == 0)
		rc = probes_due(&r);
loop:
	while (rc == 0 && r.live > 0) {
		double wait = 1e300, now;

		for (int j = 0; j < r.npend; j++) {
			const struct ec_msg *x;
			double d;

			if (r.pend[j] < 0)
				continue;
			x = &r.m[r.pend[j]];
			d = x->lost_at != 0 && x->lost_at < x->deadline ? x->lost_at : x->deadline;
			wait = d < wait ? d : wait;
		}
		wait -= mono();
		if (wait > 0) {
			struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
			struct timespec ts;
			int sliced = wait > EC_SIGNAL_SLICE_S, n;

			if (sliced)
				wait = EC_SIGNAL_SLICE_S;
			ts.tv_sec = (time_t)wait;
			ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
			n = ppoll(&pfd, 1, &ts, NULL);
			if ((n < 0 && errno == EINTR) || (n == 0 && sliced)) {
				/* a signal (or a slice of a long wait over, in case
				 * one came before ppoll): back to the caller, whose
				 * handlers run, then resume (or embnic_client_abort) */
				c->cur = rp;
				res[R_KIND] = K_INTERRUPTED;
				res[R_NEXT_ID] = r.next_id;
				res[R_NLAT] = r.nlat;
				return 0;
			}
		}
		rc = drain(&r);
		if (rc != 0)
			break;
		now = mono();
		rc = after_drain(&r, now);
		if (rc == 0)
			rc = fast_retransmit(&r);
		if (rc == 0)
			rc = probes_due(&r);
		if (rc != 0 || r.ndone || r.live == 0)
			continue;
		now = mono();
		{
			double first = 1e300;

			for (int j = 0; j < r.npend; j++)
				if (r.pend[j] >= 0 && r.m[r.pend[j]].deadline < first)
					first = r.m[r.pend[j]].deadline;
			if (first <= now)
				rc = expire(&r, now);
		}
	}
	if (rc == 0)
		for (int j = 0; j < r.npend; j++)	/* probes still out */
			if (r.pend[j] >= 0)
				late_add(c, r.m[r.pend[j]].msg_id);
out:
	if (rc < 0) {
		res[R_KIND] = K_OS_ERROR;
		res[R_ERRNO] = -rc;
	}
	res[R_NEXT_ID] = r.next_id;
	res[R_NLAT] = r.nlat;
	res[R_LARGEST] = c->largest_answered;
	round_free(&r);
	free(rp);
	return rc < 0 ? rc : 0;
#undef r
}
