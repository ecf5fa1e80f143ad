/* SPDX-License-Identifier: Apache-2.0
 *
 * The card's ports and its mbuf pool, as main() sets them up before any
 * lcore runs: each port configured and started (embnic_port_init()) with
 * the TX queues embnic_txq_plan() gives it, the largest frame it sends
 * (port_frame_limit(): what its PMD, its vdev's framesz or its interface's
 * MTU allow, checked against --mtu), and the pool its RX queues fill
 * (embnic_pool_create(): mbufs sized for --mtu, one page each with a
 * net_af_xdp port, the stack driver for a pipeline); then the rings, the
 * tables and the state map partitions (embnic_tables_init(), which the
 * fuzz targets call too).
 */
#include <errno.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_common.h>
#include <rte_devargs.h>
#include <rte_ethdev.h>
#include <rte_kvargs.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>

#include "embnic_dp.h"

#define MBUF_CACHE_SIZE	256
#define POOL_JUMBO_BYTES	(128u << 20)

/* the kernel's XDP headroom in every AF_XDP frame (linux/bpf.h) */
#define XDP_HEADROOM		256u

/*
 * app->page_per_mbuf (a port is net_af_xdp): DPDK 22.11's net_af_xdp
 * registers the mbuf pool itself as the AF_XDP UMEM, whose frames (the
 * pool's whole objects) the kernel refuses past a page; it writes a frame
 * XDP_HEADROOM bytes past the mbuf's headroom and drops, uncounted, one
 * that does not fit. So objects of exactly one page, without the channel
 * spread padding (RTE_MEMPOOL_F_NO_SPREAD).
 */

/* The mempool object header's bytes (cache-line aligned, 64 here). */
static uint32_t
mempool_hdr_size(void)
{
	struct rte_mempool_objsz sz;

	rte_mempool_calc_obj_size(sizeof(struct rte_mbuf),
				  RTE_MEMPOOL_F_NO_SPREAD, &sz);
	return sz.header_size;
}

/*
 * The largest frame (bytes from the Ethernet header, no CRC) a net_af_xdp
 * port receives into a one-page mbuf: a page less the object header, the
 * mbuf, its headroom and the XDP headroom (4096 - 64 - 128 - 128 - 256 =
 * 3520 with 4 KiB pages: MTU 3506).
 */
uint32_t
embnic_af_xdp_max_frame(void)
{
	return (uint32_t)getpagesize() - mempool_hdr_size() -
		(uint32_t)sizeof(struct rte_mbuf) - RTE_PKTMBUF_HEADROOM -
		XDP_HEADROOM;
}

/* net_af_packet's frame size when its vdev gives no framesz (the PMD's) */
#define AF_PACKET_FRAMESZ	2048
/* of each of its frames, the TPACKET2 header takes this much (the PMD's
 * frame_data_size: framesz - (TPACKET2_HDRLEN - sizeof(sockaddr_ll))) */
#define AF_PACKET_FRAME_HDR	(TPACKET2_HDRLEN - sizeof(struct sockaddr_ll))

/* The devarg framesz of port's vdev (the PMD's default when absent). */
static uint32_t
af_packet_framesz(const struct rte_eth_dev_info *info)
{
	const struct rte_devargs *da = rte_dev_devargs(info->device);
	struct rte_kvargs *kv;
	const char *v;
	uint32_t framesz = AF_PACKET_FRAMESZ;

	if (da == NULL || da->args == NULL)
		return framesz;
	kv = rte_kvargs_parse(da->args, NULL);
	if (kv == NULL)
		return framesz;
	v = rte_kvargs_get(kv, "framesz");
	if (v != NULL)
		framesz = (uint32_t)strtoul(v, NULL, 0);
	rte_kvargs_free(kv);
	return framesz;
}

/* The MTU of kernel interface if_index, 0 if unknown; its name in name. */
static uint32_t
if_mtu(unsigned int if_index, char name[IF_NAMESIZE])
{
	struct ifreq ifr = { 0 };
	int s, ret;

	if (if_index == 0 || if_indextoname(if_index, name) == NULL)
		return 0;
	s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0)
		return 0;
	memcpy(ifr.ifr_name, name, IF_NAMESIZE);
	ret = ioctl(s, SIOCGIFMTU, &ifr);
	close(s);
	return ret == 0 && ifr.ifr_mtu > 0 ? (uint32_t)ifr.ifr_mtu : 0;
}

/*
 * The largest frame port p sends (bytes from the Ethernet header, no CRC)
 * into p->max_frame, and what sets it. net_af_packet reports 1518 whatever
 * its frames, and drops inside tx_burst (reporting it sent) a frame longer
 * than its frame's data (framesz less its TPACKET2 header); the kernel
 * then discards what exceeds the interface's MTU + 14: the smaller of the
 * two. Any other port: its max_rx_pktlen less the CRC, at most a whole
 * IPv4 datagram's frame. With --mtu, a port below the MTU's frame is
 * refused (-EINVAL), naming what to change. Not oerrors instead: it means
 * different things per PMD, costs a driver call and names no frame; this
 * is one compare per frame against a constant.
 */
static int
port_frame_limit(struct embnic_app *a, uint16_t port,
		 const struct rte_eth_dev_info *info)
{
	struct embnic_port *p = &a->ports[port];
	uint32_t max = RTE_ETHER_HDR_LEN + UINT16_MAX, need, framesz = 0;
	uint32_t mtu;
	char ifname[IF_NAMESIZE] = "";

	p->max_frame_by = EMBNIC_LIMIT_PMD;
	if (strcmp(info->driver_name, "net_af_packet") == 0) {
		framesz = af_packet_framesz(info);
		max = framesz > AF_PACKET_FRAME_HDR ?
			framesz - (uint32_t)AF_PACKET_FRAME_HDR : 0;
		p->max_frame_by = EMBNIC_LIMIT_FRAMESZ;
		mtu = if_mtu(info->if_index, ifname);
		if (mtu != 0 && mtu + RTE_ETHER_HDR_LEN < max) {
			max = mtu + RTE_ETHER_HDR_LEN;
			p->max_frame_by = EMBNIC_LIMIT_IF_MTU;
		}
	} else if (info->max_rx_pktlen > RTE_ETHER_CRC_LEN) {
		max = RTE_MIN(max, info->max_rx_pktlen - RTE_ETHER_CRC_LEN);
	}
	/* net_af_xdp's max_rx_pktlen (3560) counts a 24-byte object header:
	 * the pool's is 64, and the kernel drops a longer frame unseen */
	if (strcmp(info->driver_name, "net_af_xdp") == 0)
		max = RTE_MIN(max, embnic_af_xdp_max_frame());
	p->max_frame = max;
	need = a->opts.mtu + RTE_ETHER_HDR_LEN;
	if (a->opts.mtu == 0 || need <= max)
		return 0;
	fprintf(stderr, "embnic-dp: port %u (%s) cannot send a frame of the "
		"MTU: it sends at most %u-byte frames", port, info->driver_name,
		max);
	if (p->max_frame_by == EMBNIC_LIMIT_FRAMESZ)
		fprintf(stderr, " (its vdev's framesz=%u less %zu): --mtu %u "
			"needs %u; give the vdev framesz=%u\n", framesz,
			AF_PACKET_FRAME_HDR, a->opts.mtu, need,
			RTE_ALIGN_CEIL(need + RTE_ETHER_CRC_LEN + 128, 1024));
	else if (p->max_frame_by == EMBNIC_LIMIT_IF_MTU)
		fprintf(stderr, " (interface %s has MTU %u): --mtu %u needs "
			"%u; set it: ip link set %s mtu %u\n", ifname,
			max - RTE_ETHER_HDR_LEN, a->opts.mtu, need, ifname,
			a->opts.mtu);
	else
		fprintf(stderr, ": --mtu %u needs %u\n", a->opts.mtu, need);
	return -EINVAL;
}

/*
 * Configure and start one port (examples/skeleton): 1 RX queue filled from
 * a->pool and nb_txq TX queues (queue 0 for the RX lcore's side, one per
 * state lcore on another lcore when the port has them: embnic_txq_plan());
 * its largest frame checked against --mtu. 0 or -errno.
 */
int
embnic_port_init(struct embnic_app *a, uint16_t port, uint16_t nb_txq)
{
	uint16_t q;
	struct rte_eth_conf conf = { 0 };
	struct rte_eth_dev_info info;
	struct embnic_port *p = &a->ports[port];
	uint16_t nb_rxd = EMBNIC_RX_DESC, nb_txd = EMBNIC_TX_DESC;
	int socket = rte_eth_dev_socket_id(port);
	int ret;

	if (socket < 0)
		socket = (int)rte_socket_id();
	ret = rte_eth_dev_info_get(port, &info);
	if (ret != 0)
		return ret;
	if (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_IPV4_CKSUM)
		conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
	if (a->opts.mtu != 0) {
		/* af_packet reports 1518 whatever its frames (its limit is
		 * framesz: port_frame_limit()); any other port below the MTU
		 * is refused, naming its limit */
		uint32_t frame = a->opts.mtu + RTE_ETHER_HDR_LEN +
			RTE_ETHER_CRC_LEN;

		if (frame <= info.max_rx_pktlen && a->opts.mtu <= info.max_mtu)
			conf.rxmode.mtu = a->opts.mtu;
		else if (strcmp(info.driver_name, "net_af_packet") != 0) {
			fprintf(stderr, "embnic-dp: port %u (%s) receives at "
				"most %u-byte frames (MTU %u): --mtu %u needs "
				"%u\n", port, info.driver_name,
				info.max_rx_pktlen, info.max_rx_pktlen -
				RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN,
				a->opts.mtu, frame);
			return -EINVAL;
		}
	}
	ret = port_frame_limit(a, port, &info);
	if (ret != 0)
		return ret;
	ret = rte_eth_dev_configure(port, 1, nb_txq, &conf);
	if (ret != 0)
		return ret;
	ret = rte_eth_dev_adjust_nb_rx_tx_desc(port, &nb_rxd, &nb_txd);
	if (ret != 0)
		return ret;
	ret = rte_eth_rx_queue_setup(port, 0, nb_rxd, socket, NULL, a->pool);
	if (ret < 0)
		return ret;
	for (q = 0; q < nb_txq; q++) {
		ret = rte_eth_tx_queue_setup(port, q, nb_txd, socket, NULL);
		if (ret < 0)
			return ret;
	}
	ret = rte_eth_dev_start(port);
	if (ret < 0)
		return ret;
	ret = rte_eth_macaddr_get(port, &p->mac);
	if (ret != 0)
		return ret;
	p->id = port;
	p->nb_txq = nb_txq;
	p->ip = a->opts.port_ip[port];
	if (rte_eth_dev_get_name_by_port(port, p->name) != 0)
		snprintf(p->name, sizeof(p->name), "port%u", port);
	return 0;
}

/*
 * Which TX queue each state lcore uses on each port; nb_txq[p] gets how
 * many port p needs. The only state lcore, or one on the RX lcore: queue
 * 0. Others: queue 1 + j (j-th of them) on a port that offers 1 + all of
 * them, else none (their frames go through their txr to the RX lcore).
 * 0 or a negative errno.
 */
int
embnic_txq_plan(struct embnic_app *a, uint16_t *nb_txq)
{
	struct rte_eth_dev_info info;
	unsigned int k, j, others = 0;
	uint16_t p;
	int ret;

	for (k = 0; k < a->nb_workers; k++)
		if (a->nb_workers > 1 && a->w[k].lcore != a->rx_lcore)
			others++;
	for (p = 0; p < a->nb_ports; p++) {
		ret = rte_eth_dev_info_get(p, &info);
		if (ret != 0)
			return ret;
		nb_txq[p] = others > 0 && info.max_tx_queues >= 1 + others ?
			(uint16_t)(1 + others) : 1;
		for (k = 0, j = 0; k < a->nb_workers; k++) {
			bool other = a->nb_workers > 1 &&
				a->w[k].lcore != a->rx_lcore;

			a->w[k].txq[p] = !other ? 0 : nb_txq[p] > 1 ?
				(uint16_t)(1 + j) : EMBNIC_TXQ_NONE;
			j += other;
		}
	}
	return 0;
}

/*
 * Bytes of an mbuf's buffer: the default (2048 + headroom), or with --mtu a
 * whole frame of the MTU plus 128 bytes of slack (af_packet puts its frame
 * header's tail in it), rounded up to 1 KiB; with a net_af_xdp port, what
 * fills one page with the object header and the mbuf (a->page_per_mbuf).
 */
static uint16_t
mbuf_buf_size(const struct embnic_app *a)
{
	uint32_t room = RTE_MBUF_DEFAULT_DATAROOM;

	if (a->page_per_mbuf)
		return (uint16_t)((uint32_t)getpagesize() -
			mempool_hdr_size() - sizeof(struct rte_mbuf));
	if (a->opts.mtu != 0)
		room = RTE_MAX(room, RTE_ALIGN_CEIL(a->opts.mtu +
			RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN + 128, 1024));
	return (uint16_t)(room + RTE_PKTMBUF_HEADROOM);
}

/*
 * The card's pool by rte_pktmbuf_pool_create_by_ops() with mempool flags
 * (it takes none): RTE_MEMPOOL_F_NO_SPREAD for a page per mbuf.
 */
static struct rte_mempool *
pktmbuf_pool_create_flags(unsigned int n, uint16_t buf_size, const char *ops,
			  unsigned int flags)
{
	struct rte_pktmbuf_pool_private priv = {
		.mbuf_data_room_size = buf_size, .mbuf_priv_size = 0 };
	struct rte_mempool *mp;
	int ret;

	mp = rte_mempool_create_empty("embnic_mbufs", n,
				      sizeof(struct rte_mbuf) + buf_size,
				      MBUF_CACHE_SIZE, sizeof(priv),
				      (int)rte_socket_id(), flags);
	if (mp == NULL)
		return NULL;
	ret = rte_mempool_set_ops_byname(mp, ops != NULL ? ops :
					 rte_mbuf_best_mempool_ops(), NULL);
	if (ret == 0) {
		rte_pktmbuf_pool_init(mp, &priv);
		ret = rte_mempool_populate_default(mp);
	}
	if (ret < 0) {
		rte_mempool_free(mp);
		rte_errno = -ret;
		return NULL;
	}
	rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
	return mp;
}

static uint32_t
default_nb_mbufs(const struct embnic_app *a)
{
	/* every header ring, and with several state lcores their txrs */
	uint32_t rings = a->nb_workers > 1 ? 2 * a->nb_workers : 1;
	uint32_t n = a->nb_ports * (EMBNIC_RX_DESC + EMBNIC_TX_DESC) +
		rings * a->opts.ring_size + a->nb_lcores *
		(MBUF_CACHE_SIZE + 4 * EMBNIC_MAX_BURST) + 8192;
	/* jumbo mbufs: at most POOL_JUMBO_BYTES of them (EAL -m 256 here) */
	uint32_t cap = POOL_JUMBO_BYTES / mbuf_buf_size(a);

	return mbuf_buf_size(a) > RTE_MBUF_DEFAULT_BUF_SIZE && n > cap ?
		RTE_MAX(cap, 1024u) : n;
}

/*
 * The mbuf pool: the "stack" driver (LIFO) when RX and TX run on two
 * lcores, else the default one (why: README, "Mbuf pool"; with several
 * state lcores the RX lcore allocates and frees nearly every mbuf). EAL's
 * --mbuf-pool-ops-name overrides both.
 */
struct rte_mempool *
embnic_pool_create(struct embnic_app *a)
{
	const char *ops = rte_eal_mbuf_user_pool_ops();
	unsigned int n = a->opts.nb_mbufs ? a->opts.nb_mbufs :
		default_nb_mbufs(a);
	unsigned int flags = a->page_per_mbuf ? RTE_MEMPOOL_F_NO_SPREAD : 0;
	struct rte_mempool *mp;

	if (ops == NULL && a->nb_workers == 1 && a->rx_lcore != a->tx_lcore)
		ops = "stack";
	mp = pktmbuf_pool_create_flags(n, mbuf_buf_size(a), ops, flags);
	if (mp == NULL && ops != NULL && rte_eal_mbuf_user_pool_ops() == NULL) {
		printf("embnic-dp: no '%s' mempool driver (%s), using the "
		       "default\n", ops, rte_strerror(rte_errno));
		mp = pktmbuf_pool_create_flags(n, mbuf_buf_size(a), NULL,
					       flags);
	}
	return mp;
}

/* State lcore k's header ring, its txr (when a port has no TX queue for it:
 * embnic_txq_plan()), its partition of the map. 0 or -ENOMEM. */
static int
worker_init(struct embnic_app *a, unsigned int k, uint32_t part_size)
{
	struct embnic_worker *w = &a->w[k];
	char name[RTE_RING_NAMESIZE];
	uint16_t p;

	w->id = k;
	snprintf(name, sizeof(name), "embnic_hdr_ring%u", k);
	w->ring = rte_ring_create(name, a->opts.ring_size, (int)rte_socket_id(),
				  RING_F_SP_ENQ | RING_F_SC_DEQ |
				  RING_F_EXACT_SZ);
	for (p = 0; p < a->nb_ports && w->txq[p] != EMBNIC_TXQ_NONE; p++)
		;
	if (p < a->nb_ports) {	/* a port without a TX queue for it */
		snprintf(name, sizeof(name), "embnic_tx_ring%u", k);
		w->txr = rte_ring_create(name, a->opts.ring_size,
					 (int)rte_socket_id(), RING_F_SP_ENQ |
					 RING_F_SC_DEQ | RING_F_EXACT_SZ);
		if (w->txr == NULL)
			return -ENOMEM;
	}
	w->state = embnic_state_create(k, part_size, a->opts.state_timeout_ms,
				       a->tsc_hz, a->shard_slot);
	return w->ring == NULL || w->state == NULL ? -ENOMEM : 0;
}

int
embnic_tables_init(struct embnic_app *a, uint32_t route_size,
		   uint32_t client_size, uint32_t part_size)
{
	size_t sz = rte_rcu_qsbr_get_memsize(RTE_MAX_LCORE);
	unsigned int k;

	a->qsbr = rte_zmalloc("embnic_qsbr", sz, RTE_CACHE_LINE_SIZE);
	if (a->qsbr == NULL || rte_rcu_qsbr_init(a->qsbr, RTE_MAX_LCORE) != 0)
		return -ENOMEM;
	for (k = 0; k < a->nb_workers; k++)
		if (worker_init(a, k, part_size) != 0)
			return -ENOMEM;
	a->routes = embnic_table_create("embnic_routes", route_size, a->qsbr);
	a->clients = embnic_table_create("embnic_clients", client_size,
					 a->qsbr);
	a->shard_base = rte_zmalloc("embnic_shard_base",
				    sizeof(a->shard_base[0]) *
				    EMBNIC_SHARD_SLOTS, RTE_CACHE_LINE_SIZE);
	a->nb_slots = 1;	/* slot 0: shards beyond the table's size */
	a->stats = rte_zmalloc("embnic_stats",
			       sizeof(a->stats[0]) * RTE_MAX_LCORE,
			       RTE_CACHE_LINE_SIZE);
	if (a->routes == NULL || a->clients == NULL || a->stats == NULL ||
	    a->shard_base == NULL)
		return -ENOMEM;
	return 0;
}

/* Free r with the mbufs left in it. */
static void
ring_free(struct rte_ring *r)
{
	struct rte_mbuf *pkts[EMBNIC_MAX_BURST];
	unsigned int n;

	if (r == NULL)
		return;
	while ((n = rte_ring_dequeue_burst(r, (void **)pkts,
					   EMBNIC_MAX_BURST, NULL)) > 0)
		rte_pktmbuf_free_bulk(pkts, n);
	rte_ring_free(r);
}

void
embnic_tables_free(struct embnic_app *a)
{
	unsigned int k;

	for (k = 0; k < a->nb_workers; k++) {
		embnic_state_free(a->w[k].state);
		ring_free(a->w[k].ring);
		ring_free(a->w[k].txr);
	}
	embnic_table_free(a->clients);
	embnic_table_free(a->routes);
	rte_free(a->stats);
	rte_free(a->shard_base);
	rte_free(a->qsbr);
}
