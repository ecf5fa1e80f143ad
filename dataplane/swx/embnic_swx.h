/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic-swx's state, shared by main.c (EAL, ports, the pipeline, the
 * polling loop) and ctl.c (the control socket's commands).
 */
#ifndef EMBNIC_SWX_H
#define EMBNIC_SWX_H

#include <stdbool.h>
#include <stdint.h>

#include <rte_cycles.h>
#include <rte_ethdev.h>

#define SWX_MAX_PORTS		16

struct swx_port_counters {
	uint64_t rx_frames, rx_bytes;	/* from the ethdev, into the pipeline */
	uint64_t rx_ring_full;		/* dropped: the pipeline's input ring was full */
	uint64_t rx_no_headroom;	/* dropped: no room for the rx pseudo-header */
	uint64_t tx_frames, tx_bytes;	/* sent on the ethdev */
	uint64_t tx_full;		/* dropped: the ethdev took fewer than offered */
	uint64_t tx_bad_meta;		/* dropped: shorter than the tx pseudo-header */
};

struct swx_port {
	uint16_t port_id;
	char name[RTE_ETH_NAME_MAX_LEN];
	struct rte_ring *rx_ring;	/* host -> pipeline */
	struct rte_ring *tx_ring;	/* pipeline -> host */
	struct swx_port_counters c;
};

struct swx_app {
	const char *lib_path;		/* the generated pipeline (.so) */
	const char *ctl_path;
	uint32_t burst;
	uint32_t mbufs;			/* mempool size */
	bool paused;			/* RX stopped until "resume" */
	uint16_t nb_ports;
	struct swx_port ports[SWX_MAX_PORTS];
	struct rte_mempool *pool;
	struct rte_swx_pipeline *p;
	struct rte_swx_ctl_pipeline *ctl;
	struct embnic_conn *conn;
	uint64_t start_tsc;
	uint64_t loops;
	volatile bool quit;		/* a "quit" command */
};

static inline uint64_t
now_us(const struct swx_app *a)
{
	return (rte_get_tsc_cycles() - a->start_tsc) * 1000000 / rte_get_tsc_hz();
}

/* ctl.c: conn.c's handler, one JSON request line answered (arg: the app). */
char *swx_ctl_handle(const char *line, size_t len, void *arg);

#endif /* EMBNIC_SWX_H */
