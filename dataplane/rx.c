/* SPDX-License-Identifier: Apache-2.0
 *
 * RX stage (README, "Files" and "Several state lcores"): a burst per port,
 * parse and validate, ARP for the card's address, each valid frame's mbuf
 * onto the header ring of its partition's state lcore (ARP: lcore 0), the
 * parse result in the mbuf; drops counted by reason and freed in bulk, a
 * full ring drops (ring_full). With several state lcores this lcore also
 * sends what they hand back (embnic_io_tx).
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
 * *hdr (for the ring log; zeroed for ARP); 0 or a drop reason. *part gets
 * the state lcore (of nw) it goes to.
 */
static inline int
classify(const struct embnic_port *port, struct rte_mbuf *m, int meta_off,
	 struct embnic_msg *hdr, unsigned int nw, uint8_t *part)
{
	struct embnic_rx_meta *meta = embnic_rx_meta(m, meta_off);
	uint8_t *data = rte_pktmbuf_mtod(m, uint8_t *);
	struct embnic_pkt_info info;
	int r;

	r = embnic_parse(data, rte_pktmbuf_data_len(m), rte_pktmbuf_pkt_len(m),
			 csum_hint(m), port->ip, &info);
	if (likely(r == EMBNIC_PARSE_OK)) {
		meta->num_keys = info.msg.num_keys;
		meta->value_len = info.msg.value_len;
		meta->frag_index = info.msg.frag_index;
		meta->frag_count = info.msg.frag_count;
		meta->frag_len = info.msg.frag_len;
		meta->kind = EMBNIC_DESC_MSG;
		meta->trim = rte_pktmbuf_pkt_len(m) > info.frame_len;
		*hdr = info.msg;
		*part = nw > 1 ? (uint8_t)embnic_partition(info.msg.client_id,
							   info.msg.msg_id,
							   nw) : 0;
	} else if (r == EMBNIC_PARSE_ARP) {
		memset(hdr, 0, sizeof(*hdr));
		*part = 0;
		r = embnic_arp_reply(data, rte_pktmbuf_data_len(m), port->ip,
				     port->mac.addr_bytes);
		meta->kind = EMBNIC_DESC_ARP;
		meta->trim = 0;
		m->port = port->id;	/* the reply leaves where it came */
	}
	return r;
}

/*
 * Enqueue ok[0..nd-1] (from port in_port) on state lcore w's header ring
 * and log the headers of those it took in its ring log (ok[i] is the
 * burst's accepted frame j = qi[i], or i when qi is NULL: header hdr[j],
 * logged at TSC tsc + j, so that the ring logs of several state lcores
 * merge in arrival order); what does not fit goes to dropped[] (*nf) and
 * is counted (ring_full).
 */
static inline void
to_ring(struct embnic_worker *w, uint16_t in_port, struct rte_mbuf **ok,
	const struct embnic_msg *hdr, const uint8_t *qi, unsigned int nd,
	uint64_t tsc, struct embnic_lcore_stats *st, struct rte_mbuf **dropped,
	unsigned int *nf)
{
	unsigned int sent, free_space, count, i, j;

	sent = rte_ring_enqueue_burst(w->ring, (void *const *)ok, nd,
				      &free_space);
	count = rte_ring_get_capacity(w->ring) - free_space;
	if (count > st->ring_high_water)
		st->ring_high_water = count;
	for (i = 0; i < sent; i++) {
		j = qi ? qi[i] : i;
		embnic_hlog_put(&w->rxlog, &hdr[j], in_port,
				EMBNIC_HLOG_NO_PORT, tsc + j);
	}
	if (unlikely(sent < nd)) {
		st->drops[in_port][EMBNIC_DROP_RING_FULL] += nd - sent;
		for (i = sent; i < nd; i++)
			dropped[(*nf)++] = ok[i];
	}
}

static void
rx_port(struct embnic_app *app, const struct embnic_port *port,
	struct embnic_lcore_stats *st, struct rte_mbuf **pkts, uint16_t nb_rx)
{
	struct rte_mbuf *ok[EMBNIC_MAX_BURST];
	struct rte_mbuf *dropped[EMBNIC_MAX_BURST];
	struct embnic_msg hdr[EMBNIC_MAX_BURST];
	uint8_t part[EMBNIC_MAX_BURST];
	unsigned int nd = 0, nf = 0, nw = app->nb_workers, i, k, j, nk;
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
		r = classify(port, pkts[i], meta_off, &hdr[nd], nw, &part[nd]);
		if (r == 0) {
			ok[nd++] = pkts[i];
		} else {
			st->drops[port->id][r]++;
			dropped[nf++] = pkts[i];
		}
	}
	st->rx_frames[port->id] += nb_rx;
	st->rx_bytes[port->id] += bytes;

	if (nd > 0 && nw == 1) {
		to_ring(&app->w[0], port->id, ok, hdr, NULL, nd, rte_rdtsc(),
			st, dropped, &nf);
	} else if (nd > 0) {
		/* each partition's frames in burst order, one enqueue each */
		struct rte_mbuf *q[EMBNIC_MAX_BURST];
		uint8_t qi[EMBNIC_MAX_BURST];
		uint64_t tsc = rte_rdtsc();

		for (k = 0; k < nw; k++) {
			for (j = 0, nk = 0; j < nd; j++)
				if (part[j] == k) {
					qi[nk] = (uint8_t)j;
					q[nk++] = ok[j];
				}
			if (nk > 0)
				to_ring(&app->w[k], port->id, q, hdr, qi, nk,
					tsc, st, dropped, &nf);
		}
	}
	if (nf > 0)
		rte_pktmbuf_free_bulk(dropped, nf);
}

unsigned int
embnic_io_tx(struct embnic_app *app, struct embnic_lcore_stats *st)
{
	struct rte_mbuf *pkts[EMBNIC_MAX_BURST];
	struct embnic_txq qs[EMBNIC_MAX_PORTS];
	unsigned int total = 0, k, i, n;
	uint16_t p;

	for (p = 0; p < app->nb_ports; p++)
		qs[p].n = 0;
	for (k = 0; k < app->nb_workers; k++) {
		if (app->w[k].txr == NULL)
			continue;
		n = rte_ring_dequeue_burst(app->w[k].txr, (void **)pkts,
					   app->opts.burst, NULL);
		if (n == 0)
			continue;
		total += n;
		for (i = 0; i < n; i++)
			embnic_txq_add(&qs[pkts[i]->port], pkts[i],
				       rte_pktmbuf_pkt_len(pkts[i]));
		for (p = 0; p < app->nb_ports; p++)
			if (qs[p].n > 0)
				embnic_txq_send(p, 0, &qs[p], st);
	}
	return total;
}

unsigned int
embnic_rx_port(struct embnic_app *app, uint16_t p,
	       struct embnic_lcore_stats *st)
{
	struct rte_mbuf *pkts[EMBNIC_MAX_BURST];
	uint16_t nb_rx;

	if (app->paused)
		return 0;
	nb_rx = rte_eth_rx_burst(p, 0, pkts, app->opts.burst);
	if (nb_rx > 0)
		rx_port(app, &app->ports[p], st, pkts, nb_rx);
	return nb_rx;
}

unsigned int
embnic_rx_stage(struct embnic_app *app, struct embnic_lcore_stats *st)
{
	unsigned int total = 0;
	uint16_t p;

	for (p = 0; p < app->nb_ports; p++)
		total += embnic_rx_port(app, p, st);
	return total;
}
