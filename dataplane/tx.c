/* SPDX-License-Identifier: Apache-2.0
 *
 * TX stage of a state lcore (README, "Files" and "Design notes"): dequeue
 * a burst from its header ring, authorise the sender, look the destination
 * up (bulk, over the burst's distinct ids; peers protected by RCU QSBR:
 * route.c), account the message in its state map partition, rewrite
 * Ethernet/IPv4/UDP, transmit per port or hand to the RX lcore (txr).
 */
#include <string.h>

#include <rte_byteorder.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>
#include <rte_udp.h>

#include "embnic_dp.h"

/* A frame of the burst being sent, as the RX stage parsed it. */
struct tx_frame {
	struct rte_mbuf *m;
	uint8_t *data;			/* rte_pktmbuf_mtod(m) */
	struct embnic_pkt_info info;
	uint8_t kind, trim;
};

/*
 * One's-complement checksum update (RFC 1624, eqn. 3): HC' = ~(~HC + ~m + m')
 * with m, m' the old and new values of the changed words. Summing 32-bit
 * words and folding gives the same 16-bit one's-complement sum, and ~x of a
 * 32-bit word complements both of its 16-bit halves.
 */
static inline uint16_t
csum_replace3(uint16_t check, uint32_t o1, uint32_t o2, uint32_t o3,
	      uint32_t n1, uint32_t n2, uint32_t n3)
{
	uint64_t sum = (uint16_t)~check;

	sum += (uint64_t)(uint32_t)~o1 + (uint32_t)~o2 + (uint32_t)~o3;
	sum += (uint64_t)n1 + n2 + n3;
	check = (uint16_t)~embnic_csum_fold(sum);
	return check == 0 ? 0xffff : check;	/* 0 means "no checksum" */
}

/*
 * Cut m to its first len bytes (the IPv4 datagram; len is at least the
 * headers, which lie in the first segment): the segment holding byte len-1
 * ends there and the segments past it are freed. rte_pktmbuf_trim() only
 * cuts the last segment, and left a trailer longer than it in the frame
 * (found by fuzz-card: dataplane/fuzz/seeds/card/regress-trailer-2-segs).
 */
static __rte_noinline void
trim_to(struct rte_mbuf *m, uint32_t len)
{
	struct rte_mbuf *s = m, *rest;
	uint32_t left = len;
	uint16_t nb = 1;

	while (s->data_len < left && s->next != NULL) {
		left -= s->data_len;
		s = s->next;
		nb++;
	}
	s->data_len = (uint16_t)RTE_MIN(left, (uint32_t)s->data_len);
	rest = s->next;
	s->next = NULL;
	m->nb_segs = nb;
	m->pkt_len = len;
	if (rest != NULL)
		rte_pktmbuf_free(rest);
}

/*
 * Rewrite a validated frame for dst, sent from port out: Ethernet
 * addresses, IPv4 addresses (TTL reset, header checksum recomputed), UDP
 * ports (source = 7878); the UDP checksum is updated incrementally, so it
 * stays correct if it was, and stays 0 (none) if it was 0.
 *
 * The IPv4 words are read once and the new header is summed in registers
 * before it is stored: summing it back from memory right after narrow
 * stores would stall on store forwarding.
 */
static inline void
rewrite(struct rte_mbuf *m, const struct tx_frame *d,
	const struct embnic_peer *dst, const struct embnic_port *out)
{
	uint8_t *p = d->data;
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)p;
	embnic_u32u *ipw = (embnic_u32u *)(p + EMBNIC_ETH_LEN);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)
		(p + EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN);
	uint32_t w0 = ipw[0], w1 = ipw[1], w2 = ipw[2];
	uint32_t old_src = ipw[3], old_dst = ipw[4];
	uint32_t old_ports = *(const embnic_u32u *)udp, new_ports;
	const uint16_t src_port = rte_cpu_to_be_16(EMBNIC_UDP_PORT);
	uint16_t ports[2];
	union {
		uint32_t w;
		uint8_t b[4];	/* ttl, protocol, checksum (2) */
	} ttl_proto;

	rte_ether_addr_copy(&dst->mac, &eth->dst_addr);
	rte_ether_addr_copy(&out->mac, &eth->src_addr);

	ttl_proto.w = w2;
	ttl_proto.b[0] = EMBNIC_CARD_TTL;
	ttl_proto.b[2] = 0;
	ttl_proto.b[3] = 0;
	w2 = ttl_proto.w;
	w2 |= (uint32_t)(uint16_t)~embnic_csum_fold((uint64_t)w0 + w1 + w2 +
						    out->ip + dst->ip) << 16;
	ipw[2] = w2;
	ipw[3] = out->ip;
	ipw[4] = dst->ip;

	/* both ports in one store (source port first in memory) */
	memcpy(&ports[0], &src_port, 2);
	memcpy(&ports[1], &dst->udp_port, 2);
	memcpy(&new_ports, ports, 4);
	*(embnic_u32u *)udp = new_ports;
	if (udp->dgram_cksum != 0)
		udp->dgram_cksum = csum_replace3(udp->dgram_cksum, old_src,
						 old_dst, old_ports, out->ip,
						 dst->ip, new_ports);
	/* Ethernet padding or trailer after the IPv4 datagram is not sent on */
	if (unlikely(d->trim))
		trim_to(m, d->info.frame_len);
}

/*
 * Hand m[0..n-1] to the RX lcore through txr, each with m->port the port
 * to send on (it counts them sent); what txr does not take is freed and
 * counted (tx_full).
 */
static __rte_noinline void
txq_handoff(struct rte_ring *txr, struct rte_mbuf **m, unsigned int n,
	    struct embnic_lcore_stats *st)
{
	unsigned int sent = rte_ring_enqueue_burst(txr, (void *const *)m, n,
						   NULL);
	unsigned int i;

	if (unlikely(sent < n)) {
		for (i = sent; i < n; i++)
			st->drops[m[i]->port][EMBNIC_DROP_TX_FULL]++;
		rte_pktmbuf_free_bulk(&m[sent], n - sent);
	}
}

/* Send each port's frames on state lcore w's TX queue, or hand them off. */
static void
txq_flush(struct embnic_app *app, struct embnic_worker *w,
	  struct embnic_txq *qs, struct embnic_lcore_stats *st)
{
	struct rte_mbuf *hand[EMBNIC_MAX_BURST];
	unsigned int nh = 0;
	uint16_t p, i;

	for (p = 0; p < app->nb_ports; p++) {
		struct embnic_txq *q = &qs[p];

		if (q->n == 0)
			continue;
		if (unlikely(w->txq[p] == EMBNIC_TXQ_NONE)) {
			for (i = 0; i < q->n; i++) {
				q->m[i]->port = p;
				hand[nh++] = q->m[i];
			}
			q->n = 0;
			continue;
		}
		embnic_txq_send(p, w->txq[p], q, st);
	}
	if (nh > 0)
		txq_handoff(w->txr, hand, nh, st);
}

/*
 * The distinct ids of a burst (few: a card serves a handful of shards and
 * clients), so each is looked up once. uniq gets them, slot[i] the index of
 * ids[i] in uniq; returns how many.
 */
static inline unsigned int
dedup_ids(const uint32_t *ids, unsigned int n, uint32_t *uniq, uint8_t *slot)
{
	unsigned int u = 0, i, k;

	for (i = 0; i < n; i++) {
		if (i > 0 && ids[i] == ids[i - 1]) {
			slot[i] = slot[i - 1];
			continue;
		}
		for (k = 0; k < u && uniq[k] != ids[i]; k++)
			;
		if (k == u)
			uniq[u++] = ids[i];
		slot[i] = (uint8_t)k;
	}
	return u;
}

/* Look up the peers of n ids with one bulk lookup of their distinct values. */
static inline void
lookup_peers(struct embnic_table *t, const uint32_t *ids, unsigned int n,
	     const struct embnic_peer **out)
{
	const struct embnic_peer *found[EMBNIC_MAX_BURST];
	uint32_t uniq[EMBNIC_MAX_BURST];
	uint8_t slot[EMBNIC_MAX_BURST];
	unsigned int u, i;

	u = dedup_ids(ids, n, uniq, slot);
	embnic_table_lookup_bulk(t, uniq, u, found);
	for (i = 0; i < n; i++)
		out[i] = found[slot[i]];
}

/*
 * Does the frame come from where peer p is: the card port it is behind,
 * and its MAC where the entry states a unicast one? Else it spoofs the
 * peer's address (wrong_port).
 */
static inline bool
from_peer(const struct tx_frame *d, const struct embnic_peer *p)
{
	const struct rte_ether_hdr *eth = (const struct rte_ether_hdr *)d->data;

	if (d->m->port != p->port)
		return false;
	return !rte_is_valid_assigned_ether_addr(&p->mac) ||
		rte_is_same_ether_addr(&p->mac, &eth->src_addr);
}

/*
 * Who may send this frame and where it goes: the sender (a request's
 * client, a reply's shard) registered with the frame's IPv4 and UDP port,
 * from its card port and MAC; then the receiver registered. Returns 0 and
 * sets *dst, or a drop reason.
 */
static inline int
authorise(const struct tx_frame *d, const struct embnic_peer *client,
	  const struct embnic_peer *route, const struct embnic_peer **dst)
{
	const struct embnic_pkt_info *in = &d->info;
	bool req = embnic_is_request(in->msg.msg_type);
	/* the sender's entry, the receiver's: a request's client and route */
	const struct embnic_peer *from = req ? client : route;
	const struct embnic_peer *to = req ? route : client;

	if (from == NULL || from->ip != in->src_ip ||
	    from->udp_port != in->src_port)
		return req ? EMBNIC_DROP_UNKNOWN_CLIENT :
			EMBNIC_DROP_UNKNOWN_SERVER;
	if (unlikely(!from_peer(d, from)))
		return EMBNIC_DROP_WRONG_PORT;
	if (to == NULL)
		return req ? EMBNIC_DROP_UNKNOWN_SHARD :
			EMBNIC_DROP_UNKNOWN_CLIENT;
	*dst = to;
	return 0;
}

/*
 * The parse result of f->m: the RX stage's meta, the rest read back from
 * the frame's first cache line, msg_len by the type's formula (which the
 * RX stage checked); frag_offset is not carried (unused here).
 */
static inline void
read_back(struct tx_frame *f, int meta_off)
{
	const struct embnic_rx_meta *meta = embnic_rx_meta(f->m, meta_off);
	const uint8_t *p = f->data;
	const struct rte_ipv4_hdr *ip = (const struct rte_ipv4_hdr *)
		(p + EMBNIC_ETH_LEN);
	const struct rte_udp_hdr *udp = (const struct rte_udp_hdr *)
		(p + EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN);
	const struct embnic_hdr *h = (const struct embnic_hdr *)
		(p + EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN + EMBNIC_UDP_LEN);
	struct embnic_msg *m = &f->info.msg;

	f->kind = meta->kind;
	f->trim = meta->trim;
	if (f->kind != EMBNIC_DESC_MSG) {
		f->info.frame_len = (uint16_t)rte_pktmbuf_pkt_len(f->m);
		return;
	}
	f->info.frame_len = (uint16_t)(EMBNIC_ETH_LEN +
				       embnic_ntoh16(ip->total_length));
	f->info.src_ip = ip->src_addr;
	f->info.src_port = udp->src_port;
	embnic_hdr_decode_head(h, m);
	m->num_keys = meta->num_keys;
	m->value_len = meta->value_len;
	m->msg_len = (uint32_t)embnic_expected_msg_len(m->msg_type,
						       m->num_tables,
						       m->num_keys,
						       m->value_len);
	m->frag_index = meta->frag_index;
	m->frag_count = meta->frag_count;
	m->frag_len = meta->frag_len;
	m->frag_offset = 0;
}

/* Not static so that fuzz-card runs this very code on its own clock. */
void
embnic_tx_burst(struct embnic_app *app, struct embnic_worker *w,
		struct embnic_lcore_stats *st, struct rte_mbuf **pkts,
		unsigned int n, uint64_t tsc)
{
	struct tx_frame fr[EMBNIC_MAX_BURST];
	struct embnic_txq qs[EMBNIC_MAX_PORTS];
	struct rte_mbuf *dropped[EMBNIC_MAX_BURST];
	const struct embnic_peer *routes[EMBNIC_MAX_BURST];
	const struct embnic_peer *clients[EMBNIC_MAX_BURST];
	const struct embnic_peer *dst[EMBNIC_MAX_BURST];
	const struct embnic_msg *msgs[EMBNIC_MAX_BURST];
	uint32_t shard_ids[EMBNIC_MAX_BURST], client_ids[EMBNIC_MAX_BURST];
	uint16_t idx[EMBNIC_MAX_BURST], fwd[EMBNIC_MAX_BURST];
	int verdict[EMBNIC_MAX_BURST], res[EMBNIC_MAX_BURST];
	unsigned int nm = 0, nfwd = 0, nf = 0, i, j;
	uint16_t p;

	if (unlikely(tsc >= w->next_expire_tsc)) {
		/* the state map ages in slices, every millisecond */
		w->next_expire_tsc = tsc + app->tsc_hz / 1000;
		embnic_state_expire_step(w->state, tsc, st);
	}
	if (n == 0)
		return;
	for (p = 0; p < app->nb_ports; p++)
		qs[p].n = 0;
	/* from the RX lcore's cache: both mbuf lines (data address, meta),
	 * then each frame's first line, which is rewritten */
	for (i = 0; i < n; i++) {
		rte_prefetch0(pkts[i]);
		rte_prefetch0(RTE_PTR_ADD(pkts[i], RTE_CACHE_LINE_SIZE));
	}
	for (i = 0; i < n; i++) {
		fr[i].m = pkts[i];
		fr[i].data = rte_pktmbuf_mtod(pkts[i], uint8_t *);
		rte_prefetch0(fr[i].data);
	}

	/* bulk route and client lookups for the embnic frames of the burst */
	for (i = 0; i < n; i++) {
		read_back(&fr[i], app->meta_off);
		res[i] = 0;
		if (fr[i].kind == EMBNIC_DESC_ARP)
			continue;
		shard_ids[nm] = fr[i].info.msg.shard_id;
		client_ids[nm] = fr[i].info.msg.client_id;
		idx[nm++] = (uint16_t)i;
	}
	lookup_peers(app->routes, shard_ids, nm, routes);
	lookup_peers(app->clients, client_ids, nm, clients);

	for (j = 0; j < nm; j++) {
		i = idx[j];
		res[i] = authorise(&fr[i], clients[j], routes[j], &dst[i]);
		if (res[i] == 0 && unlikely(fr[i].info.frame_len >
				app->ports[dst[i]->port].max_frame)) {
			/* its PMD would drop it and report it sent:
			 * dropped before the state map counts it */
			res[i] = EMBNIC_DROP_TOO_LONG_FOR_PORT;
			st->too_long[dst[i]->port]++;
		}
		if (res[i] == 0) {
			msgs[nfwd] = &fr[i].info.msg;
			fwd[nfwd++] = (uint16_t)i;
		}
	}

	embnic_state_update_burst(w->state, msgs, nfwd, tsc, verdict, st);
	for (j = 0; j < nfwd; j++)
		res[fwd[j]] = verdict[j];

	/* in ring order, so frames from one port leave in the order they came */
	for (i = 0; i < n; i++) {
		const struct tx_frame *d = &fr[i];

		if (res[i] != 0) {
			st->drops[d->m->port][res[i]]++;
			dropped[nf++] = d->m;
		} else if (d->kind == EMBNIC_DESC_ARP) {
			st->arp_replies++;
			embnic_txq_add(&qs[d->m->port], d->m,
				       d->info.frame_len);
		} else {
			rewrite(d->m, d, dst[i], &app->ports[dst[i]->port]);
			st->types[d->info.msg.msg_type]++;
			embnic_hlog_put(&st->hlog, &d->info.msg, d->m->port,
					dst[i]->port, tsc);
			embnic_txq_add(&qs[dst[i]->port], d->m,
				       d->info.frame_len);
		}
	}

	txq_flush(app, w, qs, st);
	if (nf > 0)
		rte_pktmbuf_free_bulk(dropped, nf);
}

unsigned int
embnic_tx_stage(struct embnic_app *app, struct embnic_worker *w,
		struct embnic_lcore_stats *st)
{
	struct rte_mbuf *pkts[EMBNIC_MAX_BURST];
	unsigned int n;

	if (app->tx_paused)
		return 0;
	n = rte_ring_dequeue_burst(w->ring, (void **)pkts, app->opts.burst,
				   NULL);
	if (n > 0)
		__atomic_store_n(&w->ring_dequeued, w->ring_dequeued + n,
				 __ATOMIC_RELEASE);
	embnic_tx_burst(app, w, st, pkts, n, rte_rdtsc());
	return n;
}
