/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic-swx: the card's P4 program, compiled for PNA by p4c-dpdk, run in
 * DPDK's SWX pipeline by a DPDK process of the project's own (main.c: EAL,
 * ports, the polling loop; ctl.c: the control socket). Shared state.
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
#ifndef EMBNIC_SWX_H
#define EMBNIC_SWX_H

#include <stdbool.h>
#include <stdint.h>

#include <rte_common.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_swx_ctl.h>
#include <rte_swx_pipeline.h>

#define SWX_MAX_PORTS		16
#define SWX_RX_META_LEN		16	/* embnic_rx_meta_t */
#define SWX_TX_META_LEN		4	/* embnic_tx_meta_t */
#define SWX_DEFAULT_BURST	32
#define SWX_RING_SIZE		1024

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

/* ctl.c: answer one JSON request line (see ctl.c for the commands). */
char *swx_ctl_handle(const char *line, size_t len, void *arg);

#endif /* EMBNIC_SWX_H */
