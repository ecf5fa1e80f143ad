/* SPDX-License-Identifier: Apache-2.0
 *
 * RX stage: receive a burst on every port, parse and validate each frame,
 * answer ARP for the card's address, and enqueue each valid frame's mbuf on
 * the header ring, the parse result travelling with the mbuf (struct
 * embnic_rx_meta in a dynfield, the rest in the frame's first cache line;
 * embnic_dp.h). The body stays in its mbuf. Whatever is dropped is counted
 * by reason and freed in bulk; a full ring drops (ring_full), it never
 * blocks.
 */
#include <string.h>

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

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

/*
 * Parse m and leave what the TX stage needs in its meta, its header in
 * *hdr (for the ring log; zeroed for ARP); 0 or a drop reason.
 */
static inline int
classify(const struct embnic_port *port, struct rte_mbuf *m, int meta_off,
	 struct embnic_msg *hdr)
{
	struct embnic_rx_meta *meta = embnic_rx_meta(m, meta_off);
	uint8_t *data = rte_pktmbuf_mtod(m, uint8_t *);
	struct embnic_pkt_info info;
	int r;

	r = embnic_parse(data, rte_pktmbuf_data_len(m), rte_pktmbuf_pkt_len(m),
			 csum_hint(m), port->ip, &info);
	if (likely(r == EMBNIC_PARSE_OK)) {
		meta->num_keys = info.msg.num_keys;
		meta->msg_len = info.msg.msg_len;
		meta->frag_index = info.msg.frag_index;
		meta->frag_count = info.msg.frag_count;
		meta->frag_len = info.msg.frag_len;
		meta->kind = EMBNIC_DESC_MSG;
		meta->trim = rte_pktmbuf_pkt_len(m) > info.frame_len;
		*hdr = info.msg;
	} else if (r == EMBNIC_PARSE_ARP) {
		memset(hdr, 0, sizeof(*hdr));
		r = embnic_arp_reply(data, rte_pktmbuf_data_len(m), port->ip,
				     port->mac.addr_bytes);
		meta->kind = EMBNIC_DESC_ARP;
		meta->trim = 0;
		m->port = port->id;	/* the reply leaves where it came */
	}
	return r;
}

static void
rx_port(struct embnic_app *app, const struct embnic_port *port,
	struct embnic_lcore_stats *st, struct rte_mbuf **pkts, uint16_t nb_rx)
{
	struct rte_mbuf *ok[EMBNIC_MAX_BURST];
	struct rte_mbuf *dropped[EMBNIC_MAX_BURST];
	struct embnic_msg hdr[EMBNIC_MAX_BURST];
	unsigned int nd = 0, nf = 0, sent, free_space, count, i;
	int meta_off = app->meta_off;
	uint64_t bytes = 0;
	int r;

	for (i = 0; i < PREFETCH_OFFSET && i < nb_rx; i++)
		rte_prefetch0(rte_pktmbuf_mtod(pkts[i], void *));
	for (i = 0; i < nb_rx; i++) {
		if (i + PREFETCH_OFFSET < nb_rx)
			rte_prefetch0(rte_pktmbuf_mtod(pkts[i + PREFETCH_OFFSET],
						       void *));
		bytes += rte_pktmbuf_pkt_len(pkts[i]);
		r = classify(port, pkts[i], meta_off, &hdr[nd]);
		if (r == 0) {
			ok[nd++] = pkts[i];
		} else {
			st->drops[r]++;
			dropped[nf++] = pkts[i];
		}
	}
	st->rx_frames[port->id] += nb_rx;
	st->rx_bytes[port->id] += bytes;

	if (nd > 0) {
		sent = rte_ring_enqueue_burst(app->ring, (void *const *)ok, nd,
					      &free_space);
		count = rte_ring_get_capacity(app->ring) - free_space;
		if (count > st->ring_high_water)
			st->ring_high_water = count;
		if (sent > 0) {
			uint64_t tsc = rte_rdtsc();

			for (i = 0; i < sent; i++)
				embnic_hlog_put(&st->rxlog, &hdr[i], port->id,
						EMBNIC_HLOG_NO_PORT, tsc);
		}
		if (unlikely(sent < nd)) {
			st->drops[EMBNIC_DROP_RING_FULL] += nd - sent;
			for (i = sent; i < nd; i++)
				dropped[nf++] = ok[i];
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
