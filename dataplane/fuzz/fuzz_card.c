/* SPDX-License-Identifier: Apache-2.0
 *
 * libFuzzer target for the card's whole per-frame path: sequences of
 * frames through the card's own RX and TX stages (what it drives and what
 * it checks, a violation aborting: dataplane/README.md, "Fuzzing").
 *
 *   make -C dataplane fuzz FUZZ_SECONDS=60       (every target)
 *   build/fuzz-card -dict=fuzz/embnic.dict fuzz/seeds-card
 *
 * Input (bytes past the end read as 0):
 *   c0   bits 0-1: ports - 1 (1..3); bit 2: the ports have no IPv4 (any
 *        destination accepted, ARP ignored); bits 3-7: burst - 1 (1..32)
 *   c1   routes (0..3, low 2 bits); bit 2: 2 state map partitions
 *        c2: clients (0..3, low 2 bits); bit 2: ports 1 and 2 send at
 *        most 1514-byte frames (embnic_port.max_frame; else no limit)
 *        (the port's address is 10.1.<port>.1)
 *   3 routes then 3 clients, 4 bytes each, used or not: id, port,
 *        ip (10.1.<port>.<ip>), udp port u (0: 7878; 1..127: 7878 + u;
 *        128..255: 40000 + u - 128); MAC 02:00:00:00:<k>:<id>, k 1 for
 *        a client, 2 for a shard (the address plan of
 *        tests/dataplane/conformance.py; the card checks a sender's
 *        ingress port and MAC against its entry: wrong_port)
 *   then frames, each: len (2 bytes, little endian; cut to what is left),
 *        flags, step, split, then len bytes of frame:
 *     flags bits 0-1: ingress port (mod ports); bit 2: set the IPv4 total
 *        and UDP lengths from len; bit 3: fix the IPv4 checksum; bit 4: fix
 *        the UDP checksum; bit 5: well-formed headers from a registered
 *        sender (Ethernet type, IPv4 version/IHL/protocol/no fragment,
 *        destination the port's address and port 7878, source the client
 *        of a request or the shard of a reply named in the embnic header,
 *        its IPv4, UDP port and MAC, if registered); bit 6: two segments, cut at byte split (if
 *        0 < split < len)
 *     step bits 0-5: before this frame, run the stages on what is queued
 *        and advance the clock by step x 250 us (0: same poll as the
 *        frame before); bits 6-7: the NIC's IPv4 checksum flag (0: unknown;
 *        1: good; 2: bad; 3: unknown, and the frame is a flood: sent
 *        FZ_FLOOD times, the embnic msg_id one higher each time (UDP
 *        checksum fixed again with bit 4), so that the state map fills up
 *        and the header ring and a TX queue overflow)
 *
 * Every frame (every segment) is a malloc'ed buffer of exactly its size
 * attached to its mbuf, so ASan sees a read past a frame or after the
 * card freed it (Debian's DPDK mempools are not instrumented).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rte_arp.h>
#include <rte_byteorder.h>
#include <rte_ip.h>
#include <rte_udp.h>

#define FZ_TARGET "fuzz_card"	/* names the target in fail()'s report */
#include "fuzz_common.h"

#define FZ_STEP_TICKS	250		/* one time step unit, us */
#define FZ_FLOOD	24		/* frames of a flood (> the state map) */
#define FZ_MAX_PEERS	3

enum udp_state {
	UDP_NONE = 0,		/* checksum 0: none */
	UDP_RIGHT = 1,
	UDP_WRONG = 2,
	UDP_UNKNOWN = 3,	/* lengths do not allow computing it */
};

/* What the harness keeps with each external buffer (one per segment). */
struct fz_buf {
	struct rte_mbuf_ext_shared_info shinfo;
	uint8_t udp;		/* enum udp_state of the frame on arrival */
};

static unsigned long fz_live;	/* frame buffers not yet freed */
static struct fz_walk fz_routes, fz_clients;	/* as programmed */

static void
buf_free(void *addr, void *opaque)
{
	free(addr);
	free(opaque);
	fz_live--;
}

static uint16_t
rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static void
wr16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/*
 * The one's-complement sum (folded, host order) of the UDP pseudo header
 * and the datagram of udp_len bytes of frame f.
 */
static uint16_t
udp_sum(const uint8_t *f, uint16_t udp_len)
{
	uint32_t s = __rte_raw_cksum(f + 26, 8, rte_cpu_to_be_16(IPPROTO_UDP) +
				     rte_cpu_to_be_16(udp_len));

	return rte_be_to_cpu_16(__rte_raw_cksum_reduce(
		__rte_raw_cksum(f + 34, udp_len, s)));
}

/* The UDP checksum state of frame f (n bytes) by its own lengths. */
static enum udp_state
udp_state(const uint8_t *f, size_t n)
{
	uint16_t tot, ul;

	if (n < 42 || rd16(f + 12) != RTE_ETHER_TYPE_IPV4 || f[14] != 0x45)
		return UDP_UNKNOWN;
	tot = rd16(f + 16);
	ul = rd16(f + 38);
	if ((size_t)tot + 14 > n || tot < 28 || ul != tot - 20)
		return UDP_UNKNOWN;
	if (rd16(f + 40) == 0)
		return UDP_NONE;
	return udp_sum(f, ul) == 0xffff ? UDP_RIGHT : UDP_WRONG;
}

/* Flag bit 4: the UDP checksum of frame f (n bytes) made right. */
static void
udp_csum_fix(uint8_t *f, size_t n)
{
	if (udp_state(f, n) == UDP_UNKNOWN)
		return;
	wr16(f + 40, 0);
	wr16(f + 40, (uint16_t)~udp_sum(f, rd16(f + 38)));
	if (rd16(f + 40) == 0)
		wr16(f + 40, 0xffff);
}

static const struct embnic_peer *
find_peer(const struct fz_walk *w, uint32_t id)
{
	unsigned int i;

	for (i = 0; i < w->n; i++)
		if (w->v[i].id == id)
			return &w->v[i];
	return NULL;
}

/* Flag bit 5: well-formed headers from the registered sender. */
static void
make_authentic(uint8_t *f, size_t n, const struct embnic_port *port)
{
	const struct embnic_peer *from;
	uint8_t type;

	if (n < 42)
		return;
	wr16(f + 12, RTE_ETHER_TYPE_IPV4);
	f[14] = 0x45;
	wr16(f + 20, 0x4000);	/* DF, no fragment */
	f[23] = IPPROTO_UDP;
	memcpy(f + 30, &port->ip, 4);
	wr16(f + 36, EMBNIC_UDP_PORT);
	if (n < EMBNIC_MIN_FRAME)
		return;
	type = f[42 + offsetof(struct embnic_hdr, msg_type)];
	from = embnic_is_request(type) ?
		find_peer(&fz_clients,
			  rd16(f + 42 + offsetof(struct embnic_hdr, client_id))) :
		find_peer(&fz_routes,
			  rd16(f + 42 + offsetof(struct embnic_hdr, shard_id)));
	if (from != NULL) {
		memcpy(f + 6, &from->mac, 6);
		memcpy(f + 26, &from->ip, 4);
		memcpy(f + 34, &from->udp_port, 2);
	}
}

/* An mbuf holding a malloc'ed copy of f[0..n-1], exactly n bytes. */
static struct rte_mbuf *
seg_make(const uint8_t *f, size_t n, uint8_t udp)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(fz_app.pool);
	struct fz_buf *b = calloc(1, sizeof(*b));
	uint8_t *d = malloc(n);

	if (m == NULL || b == NULL || d == NULL)
		fail("out of mbufs or memory (%p %p %p)", (void *)m, (void *)b,
		     (void *)d);
	memcpy(d, f, n);
	b->udp = udp;
	b->shinfo.free_cb = buf_free;
	b->shinfo.fcb_opaque = b;
	rte_mbuf_ext_refcnt_set(&b->shinfo, 1);
	rte_pktmbuf_attach_extbuf(m, d, (rte_iova_t)(uintptr_t)d, (uint16_t)n,
				  &b->shinfo);
	m->data_len = (uint16_t)n;
	m->pkt_len = (uint32_t)n;
	fz_live++;
	return m;
}

/* Check one frame the card sent on port p; frees it. */
static void
check_sent(struct rte_mbuf *m, uint16_t p)
{
	static const char *const udp_fails[] = {
		[UDP_NONE] = "UDP checksum 0 on arrival, %#x sent",
		[UDP_RIGHT] = "UDP checksum right on arrival, wrong when sent",
		[UDP_WRONG] = "UDP checksum wrong on arrival, not when sent",
		[UDP_UNKNOWN] = "the card sent a frame whose UDP lengths were wrong",
	};
	static uint8_t f[65536 + 64];
	const struct embnic_port *port = &fz_app.ports[p];
	const struct fz_buf *b = (const struct fz_buf *)m->shinfo;
	const struct embnic_peer *to = NULL;
	struct rte_mbuf *s;
	uint32_t len = rte_pktmbuf_pkt_len(m), segs = 0;
	uint16_t tot, ul, dport, sum;
	uint32_t dip;
	unsigned int i;

	for (s = m; s != NULL; s = s->next)
		segs += s->data_len;
	if (segs != len || len > 65535 || !RTE_MBUF_HAS_EXTBUF(m))
		fail("sent frame: %u bytes in segments, pkt_len %u", segs, len);
	if (rte_pktmbuf_read(m, 0, len, f) != f)
		memcpy(f, rte_pktmbuf_mtod(m, void *), len);
	if (len < 14)
		fail("sent frame of %u bytes", len);
	if (memcmp(f + 6, &port->mac, 6) != 0)
		fail("sent frame: source MAC is not port %u's", p);
	if (rd16(f + 12) == RTE_ETHER_TYPE_ARP) {
		const struct rte_arp_hdr *a = (const void *)(f + 14);

		if (len < 14 + sizeof(*a) || m->port != p ||
		    a->arp_opcode != rte_cpu_to_be_16(RTE_ARP_OP_REPLY) ||
		    a->arp_data.arp_sip != port->ip || port->ip == 0)
			fail("bad ARP reply on port %u", p);
		goto out;
	}
	if (len < EMBNIC_MIN_FRAME || rd16(f + 12) != RTE_ETHER_TYPE_IPV4 ||
	    f[14] != 0x45 || f[23] != IPPROTO_UDP)
		fail("sent frame of %u bytes is no IPv4/UDP", len);
	tot = rd16(f + 16);
	ul = rd16(f + 38);
	if ((uint32_t)tot + 14 != len || ul != tot - 20)
		fail("sent frame of %u bytes: IPv4 total length %u, UDP "
		     "length %u", len, tot, ul);
	if (len > port->max_frame)
		fail("sent a %u-byte frame on port %u, which sends at most %u",
		     len, p, port->max_frame);
	if (rte_raw_cksum(f + 14, 20) != 0xffff || f[22] != EMBNIC_CARD_TTL)
		fail("sent frame: IPv4 checksum or TTL wrong");
	if (memcmp(f + 26, &port->ip, 4) != 0 ||
	    rd16(f + 34) != EMBNIC_UDP_PORT)
		fail("sent frame: source is not port %u, 7878", p);
	memcpy(&dip, f + 30, 4);
	memcpy(&dport, f + 36, 2);
	for (i = 0; i < fz_routes.n + fz_clients.n && to == NULL; i++) {
		const struct embnic_peer *q = i < fz_routes.n ?
			&fz_routes.v[i] : &fz_clients.v[i - fz_routes.n];

		if (q->ip == dip && q->udp_port == dport && q->port == p &&
		    memcmp(&q->mac, f, 6) == 0)
			to = q;
	}
	if (to == NULL)
		fail("sent frame on port %u to no registered peer", p);
	/* 0 stays 0; else right iff it was right on arrival */
	sum = rd16(f + 40);
	if (b->udp >= UDP_UNKNOWN || (b->udp == UDP_NONE ? sum != 0 : sum == 0 ||
	    (udp_sum(f, ul) == 0xffff) != (b->udp == UDP_RIGHT)))
		fail(udp_fails[b->udp < UDP_UNKNOWN ? b->udp : UDP_UNKNOWN], sum);
out:
	rte_pktmbuf_free(m);
}

static void
drain_tx(void)
{
	struct rte_mbuf *pkts[FZ_PORT_RING];
	unsigned int n, i;
	uint16_t p;

	for (p = 0; p < FZ_PORTS; p++)
		while ((n = rte_ring_dequeue_burst(fz_tx[p], (void **)pkts,
						   RTE_DIM(pkts), NULL)) > 0)
			for (i = 0; i < n; i++)
				check_sent(pkts[i], p);
}

static bool
queued(void)
{
	unsigned int k;
	uint16_t p;

	for (k = 0; k < fz_app.nb_workers; k++)
		if (!rte_ring_empty(fz_app.w[k].ring) ||
		    (fz_app.w[k].txr != NULL &&
		     !rte_ring_empty(fz_app.w[k].txr)))
			return true;
	for (p = 0; p < FZ_PORTS; p++)
		if (!rte_ring_empty(fz_rx[p]))
			return true;
	return false;
}

/* Every embnic frame state lcore k dequeued belongs to its partition. */
static void
check_steered(struct rte_mbuf **pkts, unsigned int n, unsigned int k)
{
	uint8_t h[EMBNIC_MIN_FRAME];
	const uint8_t *f;
	unsigned int i, part;
	uint32_t msg_id;
	uint16_t client_id;

	for (i = 0; i < n; i++) {
		if (embnic_rx_meta(pkts[i], fz_app.meta_off)->kind !=
		    EMBNIC_DESC_MSG)
			continue;
		f = rte_pktmbuf_read(pkts[i], 0, sizeof(h), h);
		if (f == NULL)
			fail("an accepted frame shorter than %zu bytes",
			     sizeof(h));
		msg_id = (uint32_t)rd16(f + 50) << 16 | rd16(f + 52);
		client_id = rd16(f + 54);
		part = embnic_partition(client_id, msg_id,
					fz_app.nb_workers);
		if (part != k)
			fail("client %u msg %u (partition %u) went to state "
			     "lcore %u", client_id, msg_id, part, k);
	}
}

/* Partition k of the map against a walk of its entries (a reply completed
 * within the burst left its entry: state.c's RTE_ASSERT checked it). */
static void
check_state(unsigned int k, const char *when)
{
	char err[256];

	if (embnic_state_check(fz_app.w[k].state, err, sizeof(err)) != 0)
		fail("state map partition %u%s: %s", k, when, err);
}

/*
 * Run the stages at time tsc until every frame queued was sent or dropped:
 * the RX stage, then for each state lcore what embnic_tx_stage() does (a
 * dequeue, then embnic_tx_burst() at the harness's clock), then the RX
 * lcore's sending of what partition 1 handed back (embnic_io_tx).
 */
static void
run_stages(uint64_t tsc)
{
	struct embnic_lcore_stats *st = &fz_app.stats[0];
	struct rte_mbuf *pkts[EMBNIC_MAX_BURST];
	unsigned int n, k;

	do {
		embnic_rx_stage(&fz_app, st);
		for (k = 0; k < fz_app.nb_workers; k++) {
			n = rte_ring_dequeue_burst(fz_app.w[k].ring,
						   (void **)pkts,
						   fz_app.opts.burst, NULL);
			check_steered(pkts, n, k);
			embnic_tx_burst(&fz_app, &fz_app.w[k], st, pkts, n,
					tsc);
			check_state(k, " after a TX burst");
		}
		embnic_io_tx(&fz_app, st);
		drain_tx();
	} while (queued());
}

static void
add_peers(const uint8_t *c, unsigned int n, bool route, uint16_t nports)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		const uint8_t *b = c + 4 * i;
		struct embnic_peer p = {
			.id = b[0],
			.port = (uint16_t)(b[1] % nports),
			.udp_port = rte_cpu_to_be_16(b[3] < 128 ?
				EMBNIC_UDP_PORT + b[3] : 40000 + b[3] - 128),
		};

		p.ip = rte_cpu_to_be_32(0x0a010000u | (uint32_t)p.port << 8 |
					b[2]);
		p.mac = (struct rte_ether_addr){ { 2, 0, 0, 0,
						   route ? 2 : 1, b[0] } };
		if (route) {
			/* as the control socket's route_add does */
			embnic_shard_slot_assign(&fz_app, p.id);
			if (embnic_table_add(fz_app.routes, &p) != 0)
				fail("route_add %u", p.id);
		} else if (embnic_table_add(fz_app.clients, &p) != 0) {
			fail("client_add %u", p.id);
		}
	}
}

/* After an input: nothing left anywhere, and everything accounted. */
static void
check_after(void)
{
	const struct embnic_lcore_stats *st = &fz_app.stats[0];
	uint64_t rx = 0, out = 0, none = 0;
	unsigned int i, j;

	if (fz_live != 0)
		fail("%lu frame buffers not freed", fz_live);
	if (rte_mempool_avail_count(fz_app.pool) != FZ_MBUFS)
		fail("%u of %u mbufs back in the pool",
		     rte_mempool_avail_count(fz_app.pool), FZ_MBUFS);
	for (i = 0; i < 2; i++)
		check_state(i, "");
	for (i = 0; i < EMBNIC_MAX_PORTS; i++) {
		rx += st->rx_frames[i];
		out += st->tx_frames[i];
		for (j = 0; j < EMBNIC_DROP_MAX; j++)
			out += st->drops[i][j];
		none += st->drops[i][EMBNIC_DROP_NONE];
	}
	if (rx != out || none != 0)
		fail("%lu frames received, %lu sent or dropped",
		     (unsigned long)rx, (unsigned long)out);
}

static void
reset_card(void)
{
	uint16_t p;

	embnic_state_reset(fz_app.w[0].state, fz_app.nb_slots);
	embnic_state_reset(fz_app.w[1].state, fz_app.nb_slots);
	fz_app.w[1].next_expire_tsc = 0;
	fz_app.nb_workers = 1;
	fz_table_clear(fz_app.routes);
	fz_table_clear(fz_app.clients);
	fz_slots_reset(&fz_app, 1);
	memset(&fz_app.stats[0], 0, sizeof(fz_app.stats[0]));
	fz_app.w[0].next_expire_tsc = 0;
	for (p = 0; p < FZ_PORTS; p++) {
		fz_app.ports[p].ip = 0;
		fz_app.ports[p].max_frame = FZ_MAX_FRAME;
	}
}

int
LLVMFuzzerInitialize(int *argc __rte_unused, char ***argv __rte_unused)
{
	fz_app_init();
	return 0;
}

#define CFG_LEN	(3 + 2 * FZ_MAX_PEERS * 4)

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t c[CFG_LEN] = { 0 };
	uint64_t now = 1000000000ULL;
	uint16_t nports, p;
	size_t off, len;
	unsigned int i;

	memcpy(c, data, size < CFG_LEN ? size : CFG_LEN);
	off = size < CFG_LEN ? size : CFG_LEN;
	nports = (uint16_t)((c[0] & 3) % FZ_PORTS + 1);
	fz_app.nb_ports = nports;
	fz_app.opts.burst = (uint32_t)(c[0] >> 3) + 1;
	fz_app.nb_workers = (c[1] & 4) ? 2 : 1;
	for (p = 0; p < nports; p++) {
		fz_app.ports[p].ip = (c[0] & 4) ? 0 :
			rte_cpu_to_be_32(0x0a010001u | (uint32_t)p << 8);
		if ((c[2] & 4) && p > 0)
			fz_app.ports[p].max_frame = RTE_ETHER_MAX_LEN -
				RTE_ETHER_CRC_LEN;
	}
	add_peers(c + 3, (c[1] & 3) % (FZ_MAX_PEERS + 1), true, nports);
	add_peers(c + 3 + 4 * FZ_MAX_PEERS, (c[2] & 3) % (FZ_MAX_PEERS + 1),
		  false, nports);
	fz_table_snapshot(fz_app.routes, &fz_routes);
	fz_table_snapshot(fz_app.clients, &fz_clients);

	while (off + 5 <= size) {
		const uint8_t *h = data + off;
		uint8_t flags = h[2], step = h[3] & 0x3f, split = h[4];
		const struct embnic_port *port = &fz_app.ports[(flags & 3) %
							      nports];
		struct rte_mbuf *m, *m2;
		uint8_t *f;
		uint8_t udp;

		len = (size_t)(h[0] | h[1] << 8);
		off += 5;
		if (len > size - off)
			len = size - off;
		if (len == 0)
			len = 1;	/* a 1-byte frame of 0 */
		f = calloc(1, len);
		if (f == NULL)
			fail("out of memory");
		memcpy(f, data + off, off + len <= size ? len : size - off);
		off += len;
		if (step != 0) {
			run_stages(now);
			now += (uint64_t)step * FZ_STEP_TICKS;
		}
		if ((flags & 4) && len >= 34)
			wr16(f + 16, (uint16_t)(len - 14 > 65535 ? 65535 :
						len - 14));
		if ((flags & 4) && len >= 42)
			wr16(f + 38, (uint16_t)(len - 34 > 65535 ? 65535 :
						len - 34));
		if (flags & 0x20)
			make_authentic(f, len, port);
		if (flags & 0x10)
			udp_csum_fix(f, len);
		if ((flags & 8) && len >= 34) {
			wr16(f + 24, 0);
			wr16(f + 24, rte_be_to_cpu_16(
				(uint16_t)~rte_raw_cksum(f + 14, 20)));
		}
		for (i = 0; i < ((h[3] >> 6) == 3 ? FZ_FLOOD : 1); i++) {
			if (i > 0 && len >= EMBNIC_MIN_FRAME) {
				/* the next message: msg_id + 1 */
				uint32_t id = (uint32_t)rd16(f + 50) << 16 |
					rd16(f + 52);

				wr16(f + 50, (uint16_t)((id + 1) >> 16));
				wr16(f + 52, (uint16_t)(id + 1));
				if (flags & 0x10)
					udp_csum_fix(f, len);
			}
			udp = (uint8_t)udp_state(f, len);
			if ((flags & 0x40) && split > 0 && split < len) {
				m = seg_make(f, split, udp);
				m2 = seg_make(f + split, len - split, udp);
				m->next = m2;
				m->nb_segs = 2;
				m->pkt_len = (uint32_t)len;
			} else {
				m = seg_make(f, len, udp);
			}
			m->port = port->id;
			if ((h[3] >> 6) == 1)
				m->ol_flags |= RTE_MBUF_F_RX_IP_CKSUM_GOOD;
			else if ((h[3] >> 6) == 2)
				m->ol_flags |= RTE_MBUF_F_RX_IP_CKSUM_BAD;
			while (rte_ring_enqueue(fz_rx[port->id], m) != 0)
				run_stages(now);
		}
		free(f);
	}
	run_stages(now);
	check_after();
	reset_card();
	return 0;
}
