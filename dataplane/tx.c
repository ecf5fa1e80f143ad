/* SPDX-License-Identifier: Apache-2.0
 *
 * TX stage: dequeue a burst of descriptors from the header ring, check the
 * sender (requests from registered clients, replies from registered
 * servers), look the destination up (route table by shard for requests,
 * client table by client id for replies), account the message in the state
 * map, rewrite Ethernet/IPv4/UDP and transmit per port. What the PMD does
 * not take is freed and counted (tx_full).
 *
 * Lookups are bulk (rte_hash_lookup_bulk_data) over the whole burst; the
 * peers they return are protected by RCU QSBR (route.c), so this lcore
 * reports a quiescent state between bursts (main.c).
 */
#include <string.h>

#include <rte_byteorder.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>
#include <rte_udp.h>

#include "embnic_dp.h"

struct tx_queue {
	uint16_t n;
	struct rte_mbuf *m[EMBNIC_MAX_BURST];
	uint32_t len[EMBNIC_MAX_BURST];
};

/*
 * One's-complement checksum update (RFC 1624, eqn. 3):
 * HC' = ~(~HC + ~m + m') over the 16-bit words that changed.
 */
static inline uint16_t
csum_replace(uint16_t check, const uint16_t *old, const uint16_t *new,
	     unsigned int nwords)
{
	uint32_t sum = (uint16_t)~check;
	unsigned int i;

	for (i = 0; i < nwords; i++)
		sum += (uint16_t)~old[i] + (uint32_t)new[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	check = (uint16_t)~sum;
	return check == 0 ? 0xffff : check;
}

/*
 * Rewrite a validated frame for dst, sent from port out: Ethernet
 * addresses, IPv4 addresses (TTL reset, header checksum recomputed), UDP
 * ports (source = 7878); the UDP checksum is updated incrementally, so it
 * stays correct if it was, and stays 0 (none) if it was 0.
 */
static inline void
rewrite(struct rte_mbuf *m, const struct embnic_desc *d,
	const struct embnic_peer *dst, const struct embnic_port *out)
{
	uint8_t *p = rte_pktmbuf_mtod(m, uint8_t *);
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)p;
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(p + EMBNIC_ETH_LEN);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)
		(p + EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN);
	uint16_t old[6], new[6];

	rte_ether_addr_copy(&dst->mac, &eth->dst_addr);
	rte_ether_addr_copy(&out->mac, &eth->src_addr);

	memcpy(&old[0], &ip->src_addr, 4);
	memcpy(&old[2], &ip->dst_addr, 4);
	old[4] = udp->src_port;
	old[5] = udp->dst_port;

	ip->src_addr = out->ip;
	ip->dst_addr = dst->ip;
	ip->time_to_live = EMBNIC_CARD_TTL;
	ip->hdr_checksum = 0;
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	udp->src_port = rte_cpu_to_be_16(EMBNIC_UDP_PORT);
	udp->dst_port = dst->udp_port;

	if (udp->dgram_cksum != 0) {
		memcpy(&new[0], &ip->src_addr, 4);
		memcpy(&new[2], &ip->dst_addr, 4);
		new[4] = udp->src_port;
		new[5] = udp->dst_port;
		udp->dgram_cksum = csum_replace(udp->dgram_cksum, old, new, 6);
	}
	/* Ethernet padding or trailer after the IPv4 datagram is not sent on */
	if (rte_pktmbuf_pkt_len(m) > d->info.frame_len)
		rte_pktmbuf_trim(m, rte_pktmbuf_pkt_len(m) - d->info.frame_len);
}

static inline void
txq_add(struct tx_queue *q, struct rte_mbuf *m)
{
	q->len[q->n] = rte_pktmbuf_pkt_len(m);
	q->m[q->n++] = m;
}

static void
txq_flush(struct embnic_app *app, struct tx_queue *qs,
	  struct embnic_lcore_stats *st)
{
	uint16_t p, sent, i;
	uint64_t bytes;

	for (p = 0; p < app->nb_ports; p++) {
		struct tx_queue *q = &qs[p];

		if (q->n == 0)
			continue;
		sent = rte_eth_tx_burst(p, 0, q->m, q->n);
		bytes = 0;
		for (i = 0; i < sent; i++)
			bytes += q->len[i];
		st->tx_frames[p] += sent;
		st->tx_bytes[p] += bytes;
		if (unlikely(sent < q->n)) {
			st->drops[EMBNIC_DROP_TX_FULL] += q->n - sent;
			rte_pktmbuf_free_bulk(&q->m[sent], q->n - sent);
		}
		q->n = 0;
	}
}

/*
 * Who may send this frame and where it goes: a request needs its client
 * registered with the sender's IPv4 and UDP port, then a route for its
 * shard; a reply needs a route for its shard whose server is the sender,
 * then its client registered. Returns 0 and sets *dst, or a drop reason.
 */
static inline int
authorise(const struct embnic_desc *d, const struct embnic_peer *client,
	  const struct embnic_peer *route, const struct embnic_peer **dst)
{
	const struct embnic_pkt_info *in = &d->info;

	if (embnic_is_request(in->msg.msg_type)) {
		if (client == NULL || client->ip != in->src_ip ||
		    client->udp_port != in->src_port)
			return EMBNIC_DROP_UNKNOWN_CLIENT;
		if (route == NULL)
			return EMBNIC_DROP_UNKNOWN_SHARD;
		*dst = route;
	} else {
		if (route == NULL || route->ip != in->src_ip ||
		    route->udp_port != in->src_port)
			return EMBNIC_DROP_UNKNOWN_SERVER;
		if (client == NULL)
			return EMBNIC_DROP_UNKNOWN_CLIENT;
		*dst = client;
	}
	return 0;
}

unsigned int
embnic_tx_stage(struct embnic_app *app, struct embnic_lcore_stats *st)
{
	struct embnic_desc descs[EMBNIC_MAX_BURST];
	struct tx_queue qs[EMBNIC_MAX_PORTS];
	struct rte_mbuf *dropped[EMBNIC_MAX_BURST];
	const struct embnic_peer *routes[EMBNIC_MAX_BURST];
	const struct embnic_peer *clients[EMBNIC_MAX_BURST];
	const struct embnic_peer *dst[EMBNIC_MAX_BURST];
	const struct embnic_msg *msgs[EMBNIC_MAX_BURST];
	uint32_t shard_ids[EMBNIC_MAX_BURST], client_ids[EMBNIC_MAX_BURST];
	uint16_t idx[EMBNIC_MAX_BURST], fwd[EMBNIC_MAX_BURST];
	int verdict[EMBNIC_MAX_BURST], res[EMBNIC_MAX_BURST];
	unsigned int n, nm = 0, nfwd = 0, nf = 0, i, j;
	uint64_t now_ns;
	uint16_t p;

	now_ns = embnic_tsc_to_ns(app, rte_rdtsc());
	embnic_state_expire_step(app->state, now_ns, st);

	n = rte_ring_dequeue_burst_elem(app->ring, descs, sizeof(descs[0]),
					app->opts.burst, NULL);
	if (n == 0)
		return 0;
	for (p = 0; p < app->nb_ports; p++)
		qs[p].n = 0;

	/* bulk route and client lookups for the embnic frames of the burst */
	for (i = 0; i < n; i++) {
		res[i] = 0;
		if (descs[i].kind == EMBNIC_DESC_ARP)
			continue;
		shard_ids[nm] = descs[i].info.msg.shard_id;
		client_ids[nm] = descs[i].info.msg.client_id;
		idx[nm++] = (uint16_t)i;
	}
	embnic_table_lookup_bulk(app->routes, shard_ids, nm, routes);
	embnic_table_lookup_bulk(app->clients, client_ids, nm, clients);

	for (j = 0; j < nm; j++) {
		i = idx[j];
		res[i] = authorise(&descs[i], clients[j], routes[j], &dst[i]);
		if (res[i] == 0) {
			msgs[nfwd] = &descs[i].info.msg;
			fwd[nfwd++] = (uint16_t)i;
		}
	}

	embnic_state_update_burst(app->state, msgs, nfwd, now_ns, verdict, st);
	for (j = 0; j < nfwd; j++)
		res[fwd[j]] = verdict[j];

	/* in ring order, so frames from one port leave in the order they came */
	for (i = 0; i < n; i++) {
		const struct embnic_desc *d = &descs[i];

		if (res[i] != 0) {
			st->drops[res[i]]++;
			dropped[nf++] = d->m;
		} else if (d->kind == EMBNIC_DESC_ARP) {
			st->arp_replies++;
			txq_add(&qs[d->in_port], d->m);
		} else {
			rewrite(d->m, d, dst[i], &app->ports[dst[i]->port]);
			st->types[d->info.msg.msg_type]++;
			txq_add(&qs[dst[i]->port], d->m);
		}
	}

	txq_flush(app, qs, st);
	if (nf > 0)
		rte_pktmbuf_free_bulk(dropped, nf);
	return n;
}

void
embnic_ring_drain(struct embnic_app *app)
{
	struct embnic_desc descs[EMBNIC_MAX_BURST];
	unsigned int n, i;

	while ((n = rte_ring_dequeue_burst_elem(app->ring, descs,
						sizeof(descs[0]),
						EMBNIC_MAX_BURST, NULL)) > 0)
		for (i = 0; i < n; i++)
			rte_pktmbuf_free(descs[i].m);
}
