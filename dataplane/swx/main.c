/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic-swx: runs the card's P4 program for PNA (p4/pna/embnic.p4, built
 * by p4c-dpdk -> rte_swx_pipeline_codegen -> gcc -shared) in DPDK's SWX
 * pipeline, on one lcore, with the EAL options and vdevs of the C card.
 *
 *   embnic-swx [EAL args] -- --pipeline LIB.so [--ctl PATH] [--burst N] [--paused]
 *   embnic-swx [EAL args] -- --codegen SPEC OUT.c
 *
 * main(): EAL init -> own args -> (codegen and exit) -> mempool -> port_init()
 * per port -> the pipeline from the library (the wiring: below) ->
 * control socket -> the polling loop (host_rx, the pipeline, host_tx; the
 * control socket, ctl.c, every millisecond) until SIGINT/SIGTERM or "quit" ->
 * stop and close ports -> rte_eal_cleanup(). Only main() calls rte_exit().
 *
 * Wiring, one lcore:
 *
 *   ethdev port i --rx burst--> [+16 B rx pseudo-header: time, length]
 *        --> ring rx<i> --> SWX pipeline (port in i) --> port out i --> ring tx<i>
 *        --> [-4 B tx pseudo-header, trim to its length] --tx burst--> ethdev port i
 *                         the pipeline's drop port (N, added by DPDK) --> sink
 *
 * The pseudo-headers are p4/pna/arch.p4's: the SWX pipeline has no frame
 * length, no input timestamp and no truncation of its own, so this process
 * supplies them around the pipeline.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_byteorder.h>
#include <rte_common.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_swx_ctl.h>
#include <rte_swx_pipeline.h>

#include "embnic_conn.h"
#include "embnic_main.h"
#include "embnic_swx.h"	/* the state main.c and ctl.c share */

#define SWX_RX_META_LEN		16	/* embnic_rx_meta_t */
#define SWX_TX_META_LEN		4	/* embnic_tx_meta_t */
#define SWX_DEFAULT_BURST	32
#define SWX_RING_SIZE		1024
#define SWX_MBUFS		8191
#define SWX_MBUF_CACHE		256
#define SWX_RX_DESC		1024
#define SWX_TX_DESC		1024
#define SWX_INSTR_QUANTA	4096	/* pipeline instructions per loop turn */
#define SWX_CTL_PERIOD_US	1000
#define SWX_DEFAULT_CTL		"/run/embnic/embnic-swx.sock"

volatile bool force_quit;
static struct swx_app app;

static void
usage(const char *prog)
{
	fprintf(stderr,
		"Usage: %s [EAL args] -- --pipeline LIB.so [--ctl PATH] [--burst N] [--paused]\n"
		"       %s [EAL args] -- --codegen SPEC OUT.c\n"
		"  --pipeline LIB.so  the pipeline built from p4c-dpdk's spec (codegen + gcc -shared)\n"
		"  --ctl PATH         control socket (default %s)\n"
		"  --burst N          RX/TX burst and ring burst, 1..%u (%u)\n"
		"  --mbufs N          mempool size (%u)\n"
		"  --paused           start with RX stopped until 'resume'\n"
		"  --codegen SPEC OUT.c  write the C code of a pipeline spec and exit\n",
		prog, prog, SWX_DEFAULT_CTL, 512, SWX_DEFAULT_BURST, SWX_MBUFS);
}

/* Own arguments; -EINVAL on a bad one. codegen[0..1] set for --codegen. */
static int
parse_args(int argc, char **argv, struct swx_app *a, const char **codegen)
{
	static const struct option opts[] = {
		{ "pipeline", required_argument, NULL, 'p' },
		{ "ctl", required_argument, NULL, 'c' },
		{ "burst", required_argument, NULL, 'b' },
		{ "paused", no_argument, NULL, 'P' },
		{ "mbufs", required_argument, NULL, 'm' },
		{ "codegen", required_argument, NULL, 'g' },
		{ NULL, 0, NULL, 0 },
	};
	int o;

	a->ctl_path = SWX_DEFAULT_CTL;
	a->burst = SWX_DEFAULT_BURST;
	a->mbufs = SWX_MBUFS;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'p':
			a->lib_path = optarg;
			break;
		case 'c':
			a->ctl_path = optarg;
			break;
		case 'b':
			if (embnic_parse_u32(optarg, 1, 512, &a->burst) != 0)
				return -EINVAL;
			break;
		case 'P':
			a->paused = true;
			break;
		case 'm':
			if (embnic_parse_u32(optarg, 1024, 1u << 24, &a->mbufs) != 0)
				return -EINVAL;
			break;
		case 'g':
			codegen[0] = optarg;
			if (optind >= argc)
				return -EINVAL;
			codegen[1] = argv[optind++];
			break;
		default:
			return -EINVAL;
		}
	}
	if (optind != argc || (codegen[0] == NULL && a->lib_path == NULL))
		return -EINVAL;
	return 0;
}

/* rte_swx_pipeline_codegen: SPEC -> OUT.c; 0 or -errno (message on stderr). */
static int
codegen(const char *spec_path, const char *out_path)
{
	FILE *spec, *out;
	uint32_t err_line = 0;
	const char *err_msg = NULL;
	int ret;

	spec = fopen(spec_path, "r");
	out = spec != NULL ? fopen(out_path, "w") : NULL;
	if (out == NULL) {
		ret = -errno;
		fprintf(stderr, "embnic-swx: %s: %s\n", spec ? out_path : spec_path, strerror(-ret));
		if (spec != NULL)
			fclose(spec);
		return ret;
	}
	ret = rte_swx_pipeline_codegen(spec, out, &err_line, &err_msg);
	fclose(spec);
	if (fclose(out) != 0 && ret == 0)
		ret = -EIO;
	if (ret != 0)
		fprintf(stderr, "embnic-swx: codegen of %s failed at line %u: %s (%s)\n", spec_path,
			err_line, err_msg ? err_msg : "?", strerror(-ret));
	return ret;
}

static int
port_init(struct swx_app *a, uint16_t port)
{
	struct rte_eth_conf conf = { 0 };
	struct swx_port *p = &a->ports[port];
	int socket = rte_eth_dev_socket_id(port);
	char name[RTE_RING_NAMESIZE];
	int ret;

	if (socket < 0)
		socket = (int)rte_socket_id();
	p->port_id = port;
	ret = rte_eth_dev_get_name_by_port(port, p->name);
	if (ret != 0)
		return ret;
	ret = rte_eth_dev_configure(port, 1, 1, &conf);
	if (ret != 0)
		return ret;
	ret = rte_eth_rx_queue_setup(port, 0, SWX_RX_DESC, socket, NULL, a->pool);
	if (ret < 0)
		return ret;
	ret = rte_eth_tx_queue_setup(port, 0, SWX_TX_DESC, socket, NULL);
	if (ret < 0)
		return ret;
	ret = rte_eth_dev_start(port);
	if (ret < 0)
		return ret;
	rte_eth_promiscuous_enable(port);	/* a vdev may not support it: not fatal */

	snprintf(name, sizeof(name), "swx_rx%u", port);
	p->rx_ring = rte_ring_create(name, SWX_RING_SIZE, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
	snprintf(name, sizeof(name), "swx_tx%u", port);
	p->tx_ring = rte_ring_create(name, SWX_RING_SIZE, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
	if (p->rx_ring == NULL || p->tx_ring == NULL)
		return -rte_errno;
	return 0;
}

/* The pipeline from its library, port i reading ring swx_rx<i> and writing swx_tx<i>; the
 * pipeline adds its drop port (a sink) after them itself. DPDK 22.11's pipeline wants a power
 * of two of input ports (its rx instruction steps through them by a mask): the ones past the
 * card's ports read rings nothing is ever put in. 0 or -errno. */
static int
pipeline_init(struct swx_app *a)
{
	char *spec = NULL;
	size_t len = 0;
	FILE *io;
	uint32_t i, n_in = rte_align32pow2(a->nb_ports);
	int ret;

	for (i = a->nb_ports; i < n_in; i++) {
		char name[RTE_RING_NAMESIZE];

		snprintf(name, sizeof(name), "swx_rx%u", i);
		if (rte_ring_create(name, 64, (int)rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ) == NULL)
			return -rte_errno;
	}
	io = open_memstream(&spec, &len);
	if (io == NULL)
		return -errno;
	for (i = 0; i < n_in; i++)
		fprintf(io, "port in %u ring swx_rx%u bsz %u\n", i, i, a->burst);
	for (i = 0; i < a->nb_ports; i++)
		fprintf(io, "port out %u ring swx_tx%u bsz %u\n", i, i, a->burst);
	fclose(io);
	io = fmemopen(spec, len, "r");
	if (io == NULL) {
		free(spec);
		return -errno;
	}
	ret = rte_swx_pipeline_build_from_lib(&a->p, "embnic", a->lib_path, io, (int)rte_socket_id());
	fclose(io);
	free(spec);
	if (ret != 0)
		return ret;
	a->ctl = rte_swx_ctl_pipeline_create(a->p);
	return a->ctl == NULL ? -EINVAL : 0;
}

/* One RX burst of port p into the pipeline's input ring, each frame behind its rx
 * pseudo-header (embnic_rx_meta_t: time_us, frame_len, reserved; big-endian). Only as many
 * frames as the ring has room for are taken: the rest wait in the port's RX queue (where a
 * full queue is the PMD's counted loss), so the host never drops what the pipeline is slow for. */
static unsigned int
host_rx(struct swx_app *a, struct swx_port *p)
{
	struct rte_mbuf *pkts[512], *ok[512];
	unsigned int room = rte_ring_free_count(p->rx_ring);
	uint16_t n = rte_eth_rx_burst(p->port_id, 0, pkts, (uint16_t)RTE_MIN(room, a->burst));
	unsigned int i, n_ok = 0, sent;
	uint64_t t;

	if (n == 0)
		return 0;
	t = rte_cpu_to_be_64(now_us(a));
	for (i = 0; i < n; i++) {
		struct rte_mbuf *m = pkts[i];
		uint32_t frame_len = m->pkt_len;
		uint8_t *h;

		p->c.rx_frames++;
		p->c.rx_bytes += frame_len;
		/* the pipeline reads one contiguous buffer */
		h = m->nb_segs == 1 ? (uint8_t *)rte_pktmbuf_prepend(m, SWX_RX_META_LEN) : NULL;
		if (h == NULL) {
			p->c.rx_no_headroom++;
			rte_pktmbuf_free(m);
			continue;
		}
		memcpy(h, &t, 8);
		*(rte_be32_t *)(h + 8) = rte_cpu_to_be_32(frame_len);
		*(rte_be32_t *)(h + 12) = 0;
		ok[n_ok++] = m;
	}
	sent = rte_ring_sp_enqueue_burst(p->rx_ring, (void **)ok, n_ok, NULL);
	if (sent < n_ok) {
		p->c.rx_ring_full += n_ok - sent;
		rte_pktmbuf_free_bulk(&ok[sent], n_ok - sent);
	}
	return n;
}

/* What the pipeline sent on port p: the tx pseudo-header (embnic_tx_meta_t: send_len) off,
 * the frame cut to send_len, one TX burst. */
static unsigned int
host_tx(struct swx_app *a, struct swx_port *p)
{
	struct rte_mbuf *pkts[512], *ok[512];
	uint32_t len[512];
	unsigned int n = rte_ring_sc_dequeue_burst(p->tx_ring, (void **)pkts, a->burst, NULL);
	unsigned int i, n_ok = 0;
	uint16_t sent;

	if (n == 0)
		return 0;
	for (i = 0; i < n; i++) {
		struct rte_mbuf *m = pkts[i];
		uint16_t send_len;

		if (m->pkt_len < SWX_TX_META_LEN || m->data_len < SWX_TX_META_LEN) {
			p->c.tx_bad_meta++;
			rte_pktmbuf_free(m);
			continue;
		}
		send_len = rte_be_to_cpu_16(*rte_pktmbuf_mtod(m, rte_be16_t *));
		rte_pktmbuf_adj(m, SWX_TX_META_LEN);
		if (send_len < m->pkt_len)
			rte_pktmbuf_trim(m, (uint16_t)(m->pkt_len - send_len));
		len[n_ok] = m->pkt_len;	/* the PMD may free it once sent */
		ok[n_ok++] = m;
	}
	sent = rte_eth_tx_burst(p->port_id, 0, ok, (uint16_t)n_ok);
	for (i = 0; i < sent; i++)
		p->c.tx_bytes += len[i];
	p->c.tx_frames += sent;
	if (sent < n_ok) {
		p->c.tx_full += n_ok - sent;
		rte_pktmbuf_free_bulk(&ok[sent], n_ok - sent);
	}
	return n;
}

static void
main_loop(struct swx_app *a)
{
	uint64_t ctl_period = rte_get_tsc_hz() / 1000000 * SWX_CTL_PERIOD_US;
	uint64_t next_ctl = 0;
	uint16_t i;

	while (!force_quit && !a->quit) {
		uint64_t now;

		if (!a->paused)
			for (i = 0; i < a->nb_ports; i++)
				host_rx(a, &a->ports[i]);
		rte_swx_pipeline_run(a->p, SWX_INSTR_QUANTA);
		rte_swx_pipeline_flush(a->p);
		for (i = 0; i < a->nb_ports; i++) {
			unsigned int k = 0;

			/* drain what the pipeline sent (a few bursts at most per turn) */
			while (host_tx(a, &a->ports[i]) == a->burst && ++k < 8)
				;
		}
		a->loops++;
		now = rte_get_tsc_cycles();
		if (now >= next_ctl) {
			embnic_conn_poll(a->conn, 0);
			next_ctl = now + ctl_period;
		}
	}
}

int
main(int argc, char **argv)
{
	const char *gen[2] = { NULL, NULL };
	uint16_t port;
	int ret;

	ret = rte_eal_init(argc, argv);
	if (ret < 0)
		rte_exit(EXIT_FAILURE, "embnic-swx: EAL init failed: %s\n", rte_strerror(rte_errno));
	argc -= ret;
	argv += ret;
	if (parse_args(argc, argv, &app, gen) != 0) {
		usage("embnic-swx");
		rte_exit(2, "embnic-swx: bad arguments\n");
	}
	if (gen[0] != NULL) {
		ret = codegen(gen[0], gen[1]);
		rte_eal_cleanup();
		return ret == 0 ? 0 : 1;
	}
	embnic_quit_on_signals();

	app.nb_ports = rte_eth_dev_count_avail();
	if (app.nb_ports == 0 || app.nb_ports > SWX_MAX_PORTS)
		rte_exit(EXIT_FAILURE, "embnic-swx: %u ports (1..%u): give one --vdev or device per "
			 "card port\n", app.nb_ports, SWX_MAX_PORTS);
	app.pool = rte_pktmbuf_pool_create("swx_pool", app.mbufs, SWX_MBUF_CACHE, 0,
					   RTE_MBUF_DEFAULT_BUF_SIZE, (int)rte_socket_id());
	if (app.pool == NULL)
		rte_exit(EXIT_FAILURE, "embnic-swx: mempool: %s\n", rte_strerror(rte_errno));
	RTE_ETH_FOREACH_DEV(port) {
		ret = port_init(&app, port);
		if (ret != 0)
			rte_exit(EXIT_FAILURE, "embnic-swx: port %u: %s\n", port, rte_strerror(-ret));
	}
	ret = pipeline_init(&app);
	if (ret != 0)
		rte_exit(EXIT_FAILURE, "embnic-swx: pipeline %s: %s (built for another DPDK, or "
			 "not a pipeline library)\n", app.lib_path, rte_strerror(-ret));
	app.conn = embnic_conn_init(app.ctl_path, swx_ctl_handle, &app);
	if (app.conn == NULL)
		rte_exit(EXIT_FAILURE, "embnic-swx: control socket %s: %s\n", app.ctl_path,
			 strerror(errno));
	app.start_tsc = rte_get_tsc_cycles();
	printf("embnic-swx: pipeline %s on %u ports, ctl %s%s\n", app.lib_path, app.nb_ports,
	       app.ctl_path, app.paused ? ", paused" : "");
	fflush(stdout);

	main_loop(&app);

	embnic_conn_free(app.conn);
	RTE_ETH_FOREACH_DEV(port) {
		rte_eth_dev_stop(port);
		rte_eth_dev_close(port);
	}
	rte_swx_ctl_pipeline_free(app.ctl);
	rte_swx_pipeline_free(app.p);
	printf("embnic-swx: bye\n");
	rte_eal_cleanup();
	return 0;
}
