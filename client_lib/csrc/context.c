/* SPDX-License-Identifier: Apache-2.0
 *
 * The client's round, its context (round.h): a client's settings and shard
 * destinations, its counters and the round-trip time estimators of its
 * shards (RFC 6298, one per shard and request type); the ABI number
 * client_lib/native.py checks.
 */
#include "round.h"

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

double
ec_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct ec_rtt *
ec_rtt_of(const struct ec_ctx *c, int shard, uint8_t type)
{
	return &c->rtt[shard * 3 + (type == EMBNIC_LOOKUP_REQ ? 0 : type == EMBNIC_UPDATE_REQ ? 1 : 2)];
}

/* RFC 6298 section 2 (pyround.py RttEstimator.sample, the oracle). */
void
ec_rtt_sample(struct ec_ctx *c, struct ec_rtt *e, double r)
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
		embnic_client_free(c);
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
	e = ec_rtt_of(c, shard, (uint8_t)type);
	out[0] = e->srtt;
	out[1] = e->rttvar;
	out[2] = e->rto;
	out[3] = e->min_rtt;
	out[4] = (double)e->samples;
	return 0;
}
