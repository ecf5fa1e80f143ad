/* SPDX-License-Identifier: Apache-2.0
 *
 * RX stage: receive a burst on every port, parse and validate each frame,
 * answer ARP for the card's address, and enqueue one descriptor per valid
 * frame (parsed header + mbuf pointer) on the header ring. The body stays
 * in its mbuf. Whatever is dropped is counted by reason and freed in bulk;
 * a full ring drops (ring_full), it never blocks.
 */
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "embnic_dp.h"

#define PREFETCH_OFFSET 3

static inline enum embnic_csum_hint
csum_hint(const struct rte_mbuf *m)
{
	switch (m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) {
	case RTE_MBUF_F_RX_IP_CKSUM_GOOD:
		return EMBNIC_CSUM_GOOD;
	case RTE_MBUF_F_RX_IP_CKSUM_BAD:
		return EMBNIC_CSUM_BAD;
	default:
		return EMBNIC_CSUM_UNKNOWN;
	}
}

/* Fill d for m; returns 0 to enqueue it or a drop reason. */
static inline int
classify(const struct embnic_port *port, struct rte_mbuf *m,
	 struct embnic_desc *d)
{
	uint8_t *data = rte_pktmbuf_mtod(m, uint8_t *);
	int r;

	r = embnic_parse(data, rte_pktmbuf_data_len(m), rte_pktmbuf_pkt_len(m),
			 csum_hint(m), port->ip, &d->info);
	if (r == EMBNIC_PARSE_ARP) {
		r = embnic_arp_reply(data, rte_pktmbuf_data_len(m), port->ip,
				     port->mac.addr_bytes);
		d->kind = EMBNIC_DESC_ARP;
		d->info.frame_len = (uint16_t)rte_pktmbuf_pkt_len(m);
	} else {
		d->kind = EMBNIC_DESC_MSG;
		d->trim = rte_pktmbuf_pkt_len(m) > d->info.frame_len;
	}
	d->m = m;
	d->data = data;
	d->in_port = port->id;
	return r;
}

static void
rx_port(struct embnic_app *app, const struct embnic_port *port,
	struct embnic_lcore_stats *st, struct rte_mbuf **pkts, uint16_t nb_rx)
{
	struct embnic_desc descs[EMBNIC_MAX_BURST];
	struct rte_mbuf *dropped[EMBNIC_MAX_BURST];
	unsigned int nd = 0, nf = 0, sent, free_space, count, i;
	uint64_t bytes = 0;
	int r;

	for (i = 0; i < PREFETCH_OFFSET && i < nb_rx; i++)
		rte_prefetch0(rte_pktmbuf_mtod(pkts[i], void *));
	for (i = 0; i < nb_rx; i++) {
		if (i + PREFETCH_OFFSET < nb_rx)
			rte_prefetch0(rte_pktmbuf_mtod(pkts[i + PREFETCH_OFFSET],
						       void *));
		bytes += rte_pktmbuf_pkt_len(pkts[i]);
		r = classify(port, pkts[i], &descs[nd]);
		if (r == 0) {
			nd++;
		} else {
			st->drops[r]++;
			dropped[nf++] = pkts[i];
		}
	}
	st->rx_frames[port->id] += nb_rx;
	st->rx_bytes[port->id] += bytes;

	if (nd > 0) {
		sent = rte_ring_enqueue_burst_elem(app->ring, descs,
						   sizeof(descs[0]), nd,
						   &free_space);
		count = rte_ring_get_capacity(app->ring) - free_space;
		if (count > st->ring_high_water)
			st->ring_high_water = count;
		if (unlikely(sent < nd)) {
			st->drops[EMBNIC_DROP_RING_FULL] += nd - sent;
			for (i = sent; i < nd; i++)
				dropped[nf++] = descs[i].m;
		}
	}
	if (nf > 0)
		rte_pktmbuf_free_bulk(dropped, nf);
}

unsigned int
embnic_rx_stage(struct embnic_app *app, struct embnic_lcore_stats *st)
{
	struct rte_mbuf *pkts[EMBNIC_MAX_BURST];
	unsigned int total = 0;
	uint16_t p, nb_rx;

	if (app->paused)
		return 0;
	for (p = 0; p < app->nb_ports; p++) {
		nb_rx = rte_eth_rx_burst(p, 0, pkts, app->opts.burst);
		if (nb_rx == 0)
			continue;
		rx_port(app, &app->ports[p], st, pkts, nb_rx);
		total += nb_rx;
	}
	return total;
}
