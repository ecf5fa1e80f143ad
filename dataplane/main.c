/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic-dp: the embnic accelerator card as a DPDK application (the stages
 * and lcore layouts: dataplane/README.md; usage: docs/control-socket.md,
 * "Command line of the card").
 *
 * main() is a fixed sequence: EAL init -> own arguments -> mempool ->
 * embnic_port_init() per port -> rings and tables -> control socket ->
 * launch lcores -> stop and close ports -> rte_eal_cleanup(). Only main()
 * calls rte_exit().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>

#include "embnic_dp.h"
#include "embnic_limits.h"
#include "embnic_main.h"

#define CTL_PERIOD_US	1000	/* control socket poll period on a busy lcore */

volatile bool force_quit;

static struct embnic_app app;

static void
usage(const char *prog)
{
	fprintf(stderr,
		"Usage: %s [EAL args] -- [--ctl PATH] [--port-ip P=A.B.C.D ...]\n"
		"       [--ring-size N] [--state-size N] [--state-timeout-ms T]\n"
		"       [--burst N] [--idle-us U] [--mbufs N] [--mtu N] [--paused]\n"
		"       [--state-lcores S]\n"
		"  --ctl PATH            control socket (default %s)\n"
		"  --port-ip P=IP        the card's IPv4 on DPDK port P (repeat)\n"
		"  --ring-size N         header ring entries, power of 2 (%u)\n"
		"  --state-size N        message state map entries (%u)\n"
		"  --state-timeout-ms T  message state expiry (%u)\n"
		"  --burst N             RX/TX burst, 1..%u (%u)\n"
		"  --idle-us U           sleep U us when a poll finds nothing (0)\n"
		"  --mbufs N             mempool size (default: sized from ports)\n"
		"  --mtu N               every port's MTU, %u..%u (port default;\n"
		"                        at most 3506 with a net_af_xdp port: one\n"
		"                        4 KiB page per frame)\n"
		"  --paused              start with RX stopped until 'resume'\n"
		"  --state-lcores S      lcores sharing the state map, 1..%u, each\n"
		"                        owning the messages of one partition (1)\n",
		prog, EMBNIC_DEFAULT_CTL_PATH, EMBNIC_DEFAULT_RING_SIZE,
		EMBNIC_DEFAULT_STATE_SIZE, EMBNIC_DEFAULT_STATE_TIMEOUT_MS,
		EMBNIC_MAX_BURST, EMBNIC_DEFAULT_BURST, EMBNIC_MTU_MIN,
		EMBNIC_MAX_MTU, EMBNIC_MAX_STATE_LCORES);
}

/* "P=A.B.C.D" */
static int
parse_port_ip(const char *s, struct embnic_opts *o)
{
	char buf[64], *eq;
	uint32_t port;
	struct in_addr a;

	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	eq = strchr(buf, '=');
	if (eq == NULL)
		return -EINVAL;
	*eq = '\0';
	if (embnic_parse_u32(buf, 0, EMBNIC_MAX_PORTS - 1, &port) ||
	    inet_pton(AF_INET, eq + 1, &a) != 1)
		return -EINVAL;
	o->port_ip[port] = a.s_addr;
	return 0;
}

/* The card's own arguments (after "--"); 0 or -EINVAL. */
static int
parse_args(int argc, char **argv, struct embnic_opts *o)
{
	enum { O_CTL = 256, O_PORT_IP, O_RING, O_STATE, O_TIMEOUT, O_BURST,
	       O_IDLE, O_MBUFS, O_PAUSED, O_HELP, O_MTU, O_STATE_LCORES };
	static const struct option lopts[] = {
		{ "ctl", required_argument, NULL, O_CTL },
		{ "port-ip", required_argument, NULL, O_PORT_IP },
		{ "ring-size", required_argument, NULL, O_RING },
		{ "state-size", required_argument, NULL, O_STATE },
		{ "state-timeout-ms", required_argument, NULL, O_TIMEOUT },
		{ "burst", required_argument, NULL, O_BURST },
		{ "idle-us", required_argument, NULL, O_IDLE },
		{ "mbufs", required_argument, NULL, O_MBUFS },
		{ "paused", no_argument, NULL, O_PAUSED },
		{ "help", no_argument, NULL, O_HELP },
		{ "mtu", required_argument, NULL, O_MTU },
		{ "state-lcores", required_argument, NULL, O_STATE_LCORES },
		{ NULL, 0, NULL, 0 },
	};
	/* the options that set a uint32_t of *o, within bounds */
	static const struct {
		int opt;
		size_t off;
		uint32_t lo, hi;
	} nums[] = {
		{ O_RING, offsetof(struct embnic_opts, ring_size),
		  EMBNIC_RING_SIZE_MIN, EMBNIC_RING_SIZE_MAX },
		{ O_STATE, offsetof(struct embnic_opts, state_size),
		  EMBNIC_STATE_SIZE_MIN, EMBNIC_STATE_SIZE_MAX },
		{ O_TIMEOUT, offsetof(struct embnic_opts, state_timeout_ms),
		  EMBNIC_STATE_TIMEOUT_MS_MIN, EMBNIC_STATE_TIMEOUT_MS_MAX },
		{ O_BURST, offsetof(struct embnic_opts, burst), 1,
		  EMBNIC_MAX_BURST },
		{ O_IDLE, offsetof(struct embnic_opts, idle_us), 0, 1000000 },
		{ O_MBUFS, offsetof(struct embnic_opts, nb_mbufs), 1024,
		  1u << 24 },
		{ O_MTU, offsetof(struct embnic_opts, mtu), EMBNIC_MTU_MIN,
		  EMBNIC_MAX_MTU },
		{ O_STATE_LCORES, offsetof(struct embnic_opts, state_lcores), 1,
		  EMBNIC_MAX_STATE_LCORES },
	};
	unsigned int i;
	int opt, ret = 0;

	o->ctl_path = EMBNIC_DEFAULT_CTL_PATH;
	o->ring_size = EMBNIC_DEFAULT_RING_SIZE;
	o->state_size = EMBNIC_DEFAULT_STATE_SIZE;
	o->state_timeout_ms = EMBNIC_DEFAULT_STATE_TIMEOUT_MS;
	o->burst = EMBNIC_DEFAULT_BURST;
	o->state_lcores = 1;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
		for (i = 0; i < RTE_DIM(nums) && nums[i].opt != opt; i++)
			;
		if (i < RTE_DIM(nums)) {
			ret = embnic_parse_u32(optarg, nums[i].lo, nums[i].hi,
					       (uint32_t *)((char *)o +
							    nums[i].off));
			if (ret == 0 && opt == O_RING &&
			    !rte_is_power_of_2(o->ring_size))
				ret = -EINVAL;
		} else if (opt == O_CTL) {
			o->ctl_path = optarg;
		} else if (opt == O_PORT_IP) {
			ret = parse_port_ip(optarg, o);
		} else if (opt == O_PAUSED) {
			o->paused = true;
		} else {	/* --help, or getopt already said what is wrong */
			return -EINVAL;
		}
		if (ret != 0) {
			fprintf(stderr, "embnic-dp: bad value for "
					"--%s: '%s'\n", lopts[opt - O_CTL].name,
					optarg ? optarg : "");
			return -EINVAL;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "embnic-dp: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	return 0;
}

/*
 * Lcore roles (docs/control-socket.md: lcores, --state-lcores); 0, or
 * -EINVAL when there are fewer lcores than state lcores.
 */
static int
assign_lcores(struct embnic_app *a)
{
	unsigned int lc, w[RTE_MAX_LCORE], nw = 0, s = a->opts.state_lcores;
	unsigned int k, first;

	a->main_lcore = rte_get_main_lcore();
	a->nb_lcores = rte_lcore_count();
	a->nb_workers = s;
	RTE_LCORE_FOREACH_WORKER(lc)
		w[nw++] = lc;
	if (s == 1) {
		a->rx_lcore = nw >= 1 ? w[0] : a->main_lcore;
		a->w[0].lcore = nw >= 2 ? w[1] : a->main_lcore;
	} else if (a->nb_lcores < s) {
		return -EINVAL;
	} else if (nw >= s + 1) {	/* RX on a worker of its own */
		a->rx_lcore = w[0];
		for (k = 0; k < s; k++)
			a->w[k].lcore = w[1 + k];
	} else {			/* RX on main; main runs one too if short */
		a->rx_lcore = a->main_lcore;
		first = nw >= s ? 0 : 1;
		a->w[0].lcore = a->main_lcore;
		for (k = first; k < s; k++)
			a->w[k].lcore = w[k - first];
	}
	a->tx_lcore = a->w[0].lcore;
	return 0;
}


/* The state lcore running on lcore lc, or NULL. */
static struct embnic_worker *
worker_of(struct embnic_app *a, unsigned int lc)
{
	unsigned int k;

	for (k = 0; k < a->nb_workers; k++)
		if (a->w[k].lcore == lc)
			return &a->w[k];
	return NULL;
}

/*
 * RX and state lcore w on one lcore: each port's burst is taken off the
 * header ring before the next port is read (why: README, "Run").
 * Returns frames handled.
 */
static unsigned int
run_to_completion(struct embnic_app *a, struct embnic_worker *w,
		  struct embnic_lcore_stats *st)
{
	unsigned int work = 0, n;
	uint16_t p;

	for (p = 0; p < a->nb_ports; p++) {
		n = embnic_rx_port(a, p, st);
		if (n == 0)
			continue;
		work += n;
		do {
			n = embnic_tx_stage(a, w, st);
		} while (n == a->opts.burst && !rte_ring_empty(w->ring));
	}
	/* nothing came in: the expiry step, and what a paused TX left */
	return work > 0 ? work : embnic_tx_stage(a, w, st);
}

/* The loop of every lcore; what it runs depends on its role. */
static int
lcore_main(void *arg)
{
	struct embnic_app *a = arg;
	unsigned int lc = rte_lcore_id();
	struct embnic_lcore_stats *st = &a->stats[lc];
	struct embnic_worker *w = worker_of(a, lc);
	bool do_rx = lc == a->rx_lcore, do_tx = w != NULL;
	bool rtc = do_rx && do_tx;
	bool do_ctl = lc == a->main_lcore;
	/* TX of the state lcores on other lcores, by the RX lcore */
	bool do_io = do_rx && a->nb_workers > 1;
	/* the main lcore writes the tables, so it never waits for itself */
	bool reader = do_tx && lc != a->main_lcore;
	uint64_t ctl_period = a->tsc_hz / 1000000 * CTL_PERIOD_US;
	uint64_t next_ctl = 0, now;
	unsigned int work;

	if (!do_rx && !do_tx && !do_ctl)
		return 0;
	if (reader) {
		rte_rcu_qsbr_thread_register(a->qsbr, lc);
		rte_rcu_qsbr_thread_online(a->qsbr, lc);
	}
	printf("embnic-dp: lcore %u:%s%s", lc, do_rx ? " rx" : "",
	       do_io || (do_tx && a->nb_workers == 1) ? " tx" : "");
	if (do_tx && a->nb_workers > 1)
		printf(" state%u", w->id);
	printf("%s\n", do_ctl ? " ctl" : "");
	fflush(stdout);

	while (!force_quit) {
		work = 0;
		if (rtc) {
			work += run_to_completion(a, w, st);
		} else {
			if (do_rx)
				work += embnic_rx_stage(a, st);
			if (do_tx)
				work += embnic_tx_stage(a, w, st);
		}
		if (do_io)
			work += embnic_io_tx(a, st);
		if (reader)
			rte_rcu_qsbr_quiescent(a->qsbr, lc);
		if (do_ctl) {
			if (!do_rx && !do_tx && !do_io) {
				embnic_ctl_poll(a->ctl, 10);
			} else {
				now = rte_rdtsc();
				if (now >= next_ctl) {
					embnic_ctl_poll(a->ctl, 0);
					next_ctl = now + ctl_period;
				}
			}
		}
		if (work == 0 && a->opts.idle_us > 0)
			rte_delay_us_sleep(a->opts.idle_us);
	}

	if (reader) {
		rte_rcu_qsbr_thread_offline(a->qsbr, lc);
		rte_rcu_qsbr_thread_unregister(a->qsbr, lc);
	}
	return 0;
}


int
main(int argc, char **argv)
{
	uint16_t nb_txq[EMBNIC_MAX_PORTS];
	struct timespec ts;
	uint16_t port;
	unsigned int lc;
	int ret;

	ret = rte_eal_init(argc, argv);
	if (ret < 0)
		rte_exit(EXIT_FAILURE, "EAL init failed: %s\n",
			 rte_strerror(rte_errno));
	argc -= ret;
	argv += ret;
	if (parse_args(argc, argv, &app.opts) != 0) {
		usage(argv[0]);
		rte_exit(2, "invalid arguments\n");
	}
	embnic_quit_on_signals();

	app.nb_ports = rte_eth_dev_count_avail();
	if (app.nb_ports == 0 || app.nb_ports > EMBNIC_MAX_PORTS)
		rte_exit(EXIT_FAILURE, "need 1..%u ports, found %u (add "
			 "--vdev or bind a NIC)\n", EMBNIC_MAX_PORTS,
			 app.nb_ports);
	RTE_ETH_FOREACH_DEV(port)
		if (port >= app.nb_ports)
			rte_exit(EXIT_FAILURE, "port ids must be 0..%u, got "
				 "%u\n", app.nb_ports - 1, port);
	for (port = app.nb_ports; port < EMBNIC_MAX_PORTS; port++)
		if (app.opts.port_ip[port] != 0)
			rte_exit(2, "--port-ip names port %u but there are "
				 "only %u ports\n", port, app.nb_ports);
	if (assign_lcores(&app) != 0) {
		fprintf(stderr, "embnic-dp: --state-lcores %u: EAL -l must give "
			"at least %u lcores, got %u\n", app.opts.state_lcores,
			app.opts.state_lcores, app.nb_lcores);
		rte_exit(2, "invalid arguments\n");
	}
	app.tsc_hz = rte_get_tsc_hz();
	clock_gettime(CLOCK_REALTIME, &ts);
	app.start_tsc = rte_rdtsc();
	app.start_ns = (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
	app.paused = app.opts.paused;

	RTE_ETH_FOREACH_DEV(port) {
		struct rte_eth_dev_info info;

		if (rte_eth_dev_info_get(port, &info) == 0 &&
		    strcmp(info.driver_name, "net_af_xdp") == 0)
			app.page_per_mbuf = true;
	}
	if (app.page_per_mbuf && app.opts.mtu != 0 &&
	    app.opts.mtu + RTE_ETHER_HDR_LEN > embnic_af_xdp_max_frame())
		rte_exit(2, "--mtu %u: a net_af_xdp port receives at most "
			 "%u-byte frames (one %d-byte page per frame, DPDK "
			 "22.11): MTU <= %u, or run the port on "
			 "net_af_packet\n", app.opts.mtu,
			 embnic_af_xdp_max_frame(), getpagesize(),
			 embnic_af_xdp_max_frame() - RTE_ETHER_HDR_LEN);
	app.pool = embnic_pool_create(&app);
	if (app.pool == NULL)
		rte_exit(EXIT_FAILURE, "cannot create the mbuf pool: %s\n",
			 rte_strerror(rte_errno));

	ret = embnic_txq_plan(&app, nb_txq);
	if (ret != 0)
		rte_exit(EXIT_FAILURE, "cannot query the ports: %s\n",
			 rte_strerror(-ret));
	for (port = 0; port < app.nb_ports; port++) {
		ret = embnic_port_init(&app, port, nb_txq[port]);
		if (ret != 0)
			rte_exit(EXIT_FAILURE, "cannot init port %u: %s\n",
				 port, rte_strerror(-ret));
	}

	/* after the ports, so the PMDs' own dynamic fields come first */
	app.meta_off = rte_mbuf_dynfield_register(&(const struct
		rte_mbuf_dynfield){ .name = EMBNIC_RX_META_NAME,
				    .size = sizeof(struct embnic_rx_meta),
				    .align = __alignof__(struct embnic_rx_meta) });
	if (app.meta_off < 0)
		rte_exit(EXIT_FAILURE, "no room in the mbuf for the card's "
			 "%zu-byte dynamic field: %s\n",
			 sizeof(struct embnic_rx_meta), rte_strerror(rte_errno));

	/* each partition ceil(state_size / state lcores) entries */
	ret = embnic_tables_init(&app, EMBNIC_ROUTE_TABLE_SIZE,
				 EMBNIC_CLIENT_TABLE_SIZE,
				 RTE_MAX((app.opts.state_size + app.nb_workers -
					  1) / app.nb_workers,
					 (uint32_t)EMBNIC_STATE_SIZE_MIN));
	if (ret != 0)
		rte_exit(EXIT_FAILURE, "cannot create ring and tables: %s\n",
			 rte_strerror(-ret));
	if (embnic_telemetry_init(&app) != 0)
		printf("embnic-dp: telemetry commands not registered\n");
	app.ctl = embnic_ctl_init(&app, app.opts.ctl_path);
	if (app.ctl == NULL)
		rte_exit(EXIT_FAILURE, "cannot serve the control socket %s: "
			 "%s\n", app.opts.ctl_path, strerror(errno));

	printf("embnic-dp: %u ports, %u lcores (%s), %u state lcores, ring %u, "
	       "state %u, mbufs %u (%s), ctl %s%s\n", app.nb_ports,
	       app.nb_lcores, app.nb_workers > 1 ? "partitioned" :
	       app.rx_lcore == app.tx_lcore ? "run to completion" :
	       "pipeline", app.nb_workers, app.opts.ring_size,
	       app.opts.state_size,
	       app.pool->size, rte_mempool_get_ops(app.pool->ops_index)->name,
	       app.opts.ctl_path,
	       app.paused ? ", paused" : "");
	fflush(stdout);

	RTE_LCORE_FOREACH_WORKER(lc)
		rte_eal_remote_launch(lcore_main, &app, lc);
	lcore_main(&app);
	rte_eal_mp_wait_lcore();

	for (port = 0; port < app.nb_ports; port++) {
		ret = rte_eth_dev_stop(port);
		if (ret != 0)
			printf("embnic-dp: port %u stop: %s\n", port,
			       rte_strerror(-ret));
		rte_eth_dev_close(port);
	}
	embnic_ctl_free(app.ctl);
	embnic_tables_free(&app);
	rte_mempool_free(app.pool);
	rte_eal_cleanup();
	printf("embnic-dp: bye\n");
	return 0;
}
