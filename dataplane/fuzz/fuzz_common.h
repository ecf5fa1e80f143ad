/* SPDX-License-Identifier: Apache-2.0
 *
 * What the card's libFuzzer targets share (fuzz_card.c, fuzz_ctl.c): EAL
 * started once in memory (a file prefix per process: forked fuzzing jobs
 * never meet), and a card built the way main() builds one, on net_ring
 * ports whose rings the harness fills and drains, with small tables and
 * two state map partitions, of which fuzz_card turns the second on per
 * input (its frames go back through its txr: net_ring has one TX queue).
 */
#ifndef EMBNIC_FUZZ_COMMON_H
#define EMBNIC_FUZZ_COMMON_H

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "embnic_dp.h"

#ifndef FZ_TARGET
#error "define FZ_TARGET (the target's name) before including fuzz_common.h"
#endif

/* Report a broken invariant (prefixed with the target's name) and abort: libFuzzer keeps the input. */
static void
fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn, unused));

static void
fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, FZ_TARGET ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

#define FZ_PORTS	3		/* net_ring ports made */
/* a port's largest frame as port_frame_limit() gives a PMD without one */
#define FZ_MAX_FRAME	(RTE_ETHER_HDR_LEN + UINT16_MAX)
#define FZ_PORT_RING	64		/* each port's RX ring */
#define FZ_PORT_TX_RING	16		/* each port's TX ring: a burst overflows it */
#define FZ_HDR_RING	64		/* the header ring */
#define FZ_TABLE_SIZE	8		/* route and client tables */
#define FZ_STATE_SIZE	16		/* state map entries */
#define FZ_STATE_TIMEOUT_MS 3
#define FZ_TSC_HZ	1000000ULL	/* the harness clock: 1 tick = 1 us */
#define FZ_MBUFS	512

volatile bool force_quit;	/* main.c's; ctl.c's quit sets it */

static struct embnic_app fz_app;
static struct rte_ring *fz_rx[FZ_PORTS], *fz_tx[FZ_PORTS];

static void
fz_die(const char *what)
{
	fprintf(stderr, "fuzz harness setup: %s: %s\n", what,
		rte_strerror(rte_errno));
	abort();
}

/*
 * EAL's runtime directory (/var/run/dpdk/<prefix>) is not used after init
 * with --no-shconf (no IPC, no shared files): removed at once, so a crashed
 * or killed fuzzing job leaves nothing behind.
 */
static void
fz_rm_runtime_dir(void)
{
	const char *dir = rte_eal_get_runtime_dir();
	struct dirent *e;
	DIR *d = opendir(dir);

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	rmdir(dir);
}

static void
fz_eal_init(void)
{
	char prefix[64];
	char *argv[] = { "embnic-fuzz", "--no-huge", "--no-pci", "--no-shconf",
			 "-m", "128", "-l", "0", "--no-telemetry",
			 "--log-level=*:error", prefix, NULL };

	snprintf(prefix, sizeof(prefix), "--file-prefix=embnic-fz%d",
		 (int)getpid());
	if (rte_eal_init((int)RTE_DIM(argv) - 1, argv) < 0)
		fz_die("rte_eal_init");
	fz_rm_runtime_dir();
}

/* One net_ring port, then configured and started by embnic_port_init(). */
static void
fz_port_init(struct embnic_app *a, uint16_t i)
{
	char name[32];

	snprintf(name, sizeof(name), "fzrx%u", i);
	fz_rx[i] = rte_ring_create(name, FZ_PORT_RING, 0,
				   RING_F_SP_ENQ | RING_F_SC_DEQ);
	snprintf(name, sizeof(name), "fztx%u", i);
	fz_tx[i] = rte_ring_create(name, FZ_PORT_TX_RING, 0,
				   RING_F_SP_ENQ | RING_F_SC_DEQ);
	if (fz_rx[i] == NULL || fz_tx[i] == NULL)
		fz_die("port rings");
	snprintf(name, sizeof(name), "net_fz%u", i);
	if (rte_eth_from_rings(name, &fz_rx[i], 1, &fz_tx[i], 1, 0) != i)
		fz_die("rte_eth_from_rings (port ids must be 0..n-1)");
	if (embnic_port_init(a, i, 1) != 0 || a->ports[i].max_frame != FZ_MAX_FRAME)
		fz_die("port setup");
}

/*
 * The card as main() builds it (the pool, the dynfield,
 * embnic_tables_init())
 * with the sizes above. Its mbufs carry no frame data: every frame the
 * harness makes is an external buffer of exactly its size (the pool's
 * data room, a bare headroom, is there for the PMD's checks only).
 */
static void
fz_app_init(void)
{
	struct embnic_app *a = &fz_app;
	uint16_t i;

	fz_eal_init();
	a->opts.ctl_path = "(none)";
	a->opts.ring_size = FZ_HDR_RING;
	a->opts.state_size = FZ_STATE_SIZE;
	a->opts.state_timeout_ms = FZ_STATE_TIMEOUT_MS;
	a->opts.burst = EMBNIC_DEFAULT_BURST;
	a->main_lcore = a->rx_lcore = a->tx_lcore = rte_get_main_lcore();
	a->nb_lcores = 1;
	a->opts.state_lcores = 1;
	a->w[0].lcore = a->w[1].lcore = a->main_lcore;
	for (i = 0; i < EMBNIC_MAX_PORTS; i++)
		a->w[1].txq[i] = EMBNIC_TXQ_NONE;
	a->tsc_hz = FZ_TSC_HZ;
	a->pool = rte_pktmbuf_pool_create("fz_mbufs", FZ_MBUFS, 0, 0,
					  RTE_PKTMBUF_HEADROOM, 0);
	if (a->pool == NULL)
		fz_die("mbuf pool");
	for (i = 0; i < FZ_PORTS; i++)
		fz_port_init(a, i);
	a->nb_ports = FZ_PORTS;
	a->meta_off = rte_mbuf_dynfield_register(&(const struct
		rte_mbuf_dynfield){ .name = EMBNIC_RX_META_NAME,
				    .size = sizeof(struct embnic_rx_meta),
				    .align = __alignof__(struct embnic_rx_meta) });
	if (a->meta_off < 0)
		fz_die("dynfield");
	/* two partitions made, of which each input uses one or both */
	a->nb_workers = 2;
	if (embnic_tables_init(a, FZ_TABLE_SIZE, FZ_TABLE_SIZE,
			       FZ_STATE_SIZE) != 0)
		fz_die("ring and tables");
	a->nb_workers = 1;
}

struct fz_walk {
	struct embnic_peer v[FZ_TABLE_SIZE + 1];
	unsigned int n;
};

/* A copy of a table's peers, sorted by id; returns how many. */
static unsigned int
fz_table_snapshot(struct embnic_table *t, struct fz_walk *w)
{
	memset(w, 0, sizeof(*w));
	w->n = embnic_table_copy(t, w->v, RTE_DIM(w->v));
	return w->n;
}

/* Empty a table (through its own delete). */
static void
fz_table_clear(struct embnic_table *t)
{
	struct fz_walk w;
	unsigned int i;

	fz_table_snapshot(t, &w);
	for (i = 0; i < w.n; i++)
		if (embnic_table_del(t, w.v[i].id) != 0)
			abort();
	if (embnic_table_count(t) != 0)
		abort();
}

/* Give back the statistics slots assigned since slot n (route_add's). */
static void
fz_slots_reset(struct embnic_app *a, uint32_t n)
{
	while (a->nb_slots > n) {
		a->nb_slots--;
		a->shard_slot[a->slot_shard[a->nb_slots]] = 0;
		a->slot_shard[a->nb_slots] = 0;
	}
}

#endif /* EMBNIC_FUZZ_COMMON_H */
