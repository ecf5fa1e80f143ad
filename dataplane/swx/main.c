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
 * control socket every millisecond) until SIGINT/SIGTERM or "quit" ->
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
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <rte_byteorder.h>
#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_swx_ctl.h>
#include <rte_swx_pipeline.h>
#include <rte_swx_table.h>

#include "embnic_conn.h"
#include "embnic_main.h"

#define SWX_MAX_PORTS		16
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
#define REG_READ_MAX	(1u << 20)	/* cells per reg_read */
#define KEY_MAX		16		/* match values of an entry */
#define KEY_LEN		(KEY_MAX * 21 + 1)	/* match_key's key */

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

static inline uint64_t
now_us(const struct swx_app *a)
{
	return (rte_get_tsc_cycles() - a->start_tsc) * 1000000 / rte_get_tsc_hz();
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

/*
 * ---- the control socket ----
 *
 * One JSON object per line in, one out
 * ({"ok": true, ...} or {"ok": false, "error": "...", "kind": "usage" |
 * "failure"}). The commands are the SWX pipeline's own control API, by the
 * names p4c-dpdk gave the program's objects (its context JSON maps the P4
 * names to them: embnic.control.targets.p4dpdk.swx reads it):
 *
 *   {"cmd": "ping"}                  {"pid": the process id}
 *   {"cmd": "info"}                  ports, burst, paused, uptime, pipeline sizes
 *   {"cmd": "counters"}              per port: the host's counters (swx_port_counters) and the
 *                                    pipeline's input/output port statistics; the drop port's
 *   {"cmd": "table_add", "table": T, "entry": "match ... action A ARG V ..."}
 *   {"cmd": "table_delete", "table": T, "entry": "match ..."}
 *   {"cmd": "table_dump", "table": T}         {"entries": [the entry text of each, as added]}
 *   {"cmd": "reg_read", "name": R[, "index": I, "count": N]}   {"values": [u64, ...]}
 *                                    (default: the whole array)
 *   {"cmd": "reg_write", "name": R, "index": I, "value": V}
 *   {"cmd": "reg_clear", "name": R}           every cell 0 (a counter's reset)
 *   {"cmd": "pause"} / {"cmd": "resume"}     stop / start taking frames in
 *   {"cmd": "quit"}
 *
 * Table changes are committed at once (rte_swx_ctl_pipeline_commit, all or
 * nothing); the control socket runs on the pipeline's own lcore between
 * bursts, so no frame ever sees half a change. The entries of exact-match
 * tables are kept here as the text they were added with (keyed by table and
 * match values): DPDK's own table dump prints raw key and action-data bytes
 * without argument names, which only the table's layout could decode.
 */

/* The entries as added, [table, key (match_key), text] each. */
static json_t *shadows;

/*
 * The match values of an entry text ("match V ... [action ...]") as a
 * key: each in decimal and a space, into key (KEY_LEN bytes); -1 if the
 * text is not "match ...", has more than KEY_MAX values or one that is not
 * a number.
 */
static int
match_key(const char *line, char *key)
{
	char *copy = strdup(line), *tok, *save = NULL, *end;
	unsigned int n = 0;
	uint64_t v;
	int ret = -1;

	key[0] = '\0';
	if (copy == NULL)
		return -1;
	tok = strtok_r(copy, " \t", &save);
	if (tok != NULL && strcmp(tok, "match") == 0) {
		ret = 0;
		while ((tok = strtok_r(NULL, " \t", &save)) != NULL && strcmp(tok, "action") != 0 &&
		       strcmp(tok, "priority") != 0) {
			v = strtoull(tok, &end, 0);
			if (n++ == KEY_MAX || *end != '\0') {
				ret = -1;
				break;
			}
			key += sprintf(key, "%" PRIu64 " ", v);
		}
	}
	free(copy);
	return ret;
}

/* The index in shadows of table's entry of key; -1 if there is none. */
static int
shadow_find(const char *table, const char *key)
{
	json_t *e;
	size_t i;

	json_array_foreach(shadows, i, e)
		if (strcmp(json_string_value(json_array_get(e, 0)), table) == 0 &&
		    strcmp(json_string_value(json_array_get(e, 1)), key) == 0)
			return (int)i;
	return -1;
}

/* Record an added entry (replacing the one of the same key); -ENOMEM. */
static int
shadow_add(const char *table, const char *key, const char *text)
{
	int i = shadow_find(table, key);
	json_t *e = json_pack("[s, s, s]", table, key, text);

	if (shadows == NULL)
		shadows = json_array();
	if (e == NULL || shadows == NULL)
		return -ENOMEM;
	if (i >= 0)
		return json_array_set_new(shadows, (size_t)i, e) == 0 ? 0 : -ENOMEM;
	return json_array_append_new(shadows, e) == 0 ? 0 : -ENOMEM;
}

/* Forget an entry: the last one takes its place. */
static void
shadow_del(const char *table, const char *key)
{
	int i = shadow_find(table, key);
	size_t n = json_array_size(shadows);

	if (i < 0)
		return;
	json_array_set(shadows, (size_t)i, json_array_get(shadows, n - 1));
	json_array_remove(shadows, n - 1);
}

static json_t *
err(const char *kind, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:s, s:s}", "ok", 0, "error", msg, "kind", kind);
}

/* The string member name of req, or NULL. */
#define get_str(req, name) json_string_value(json_object_get((req), (name)))

/* A non-negative integer member (default def when absent); -1 when it is not one. */
static int64_t
get_uint(json_t *req, const char *name, int64_t def)
{
	json_t *v = json_object_get(req, name);

	if (v == NULL)
		return def;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	return json_integer_value(v);
}

static void
entry_free(struct rte_swx_table_entry *e)
{
	/* rte_swx_ctl.c's table_entry_free is not exported in DPDK 22.11 */
	if (e == NULL)
		return;
	free(e->key);
	free(e->key_mask);
	free(e->action_data);
	free(e);
}

static json_t *
cmd_table(struct swx_app *a, json_t *req, const char *cmd)
{
	const char *table = get_str(req, "table"), *line = get_str(req, "entry");
	bool add = strcmp(cmd, "table_add") == 0;
	struct rte_swx_table_entry *e;
	char key[KEY_LEN];
	int blank = 0, ret;

	if (table == NULL || line == NULL)
		return err("usage", "%s needs \"table\" and \"entry\" (strings)", cmd);
	if (match_key(line, key) != 0)
		return err("usage", "%s %s: \"%s\" is not \"match V ...%s\" (at most %u numbers)", cmd,
			   table, line, add ? " action NAME [ARG V] ..." : "", KEY_MAX);
	if (!add && shadow_find(table, key) < 0)
		return err("usage", "table_delete %s: no entry \"%s\"", table, line);
	e = rte_swx_ctl_pipeline_table_entry_read(a->ctl, table, line, &blank);
	if (e == NULL)
		return err("usage", "table %s: cannot read entry \"%s\" (no such table, or a match "
			   "field, action or argument it does not have)", table, line);
	if (add)
		ret = rte_swx_ctl_pipeline_table_entry_add(a->ctl, table, e);
	else
		ret = rte_swx_ctl_pipeline_table_entry_delete(a->ctl, table, e);
	entry_free(e);
	if (ret == 0)
		ret = rte_swx_ctl_pipeline_commit(a->ctl, 1);
	else
		rte_swx_ctl_pipeline_abort(a->ctl);
	if (ret == 0 && add)
		ret = shadow_add(table, key, line);
	else if (ret == 0)
		shadow_del(table, key);
	if (ret != 0)
		return err("failure", "%s %s \"%s\": %s", cmd, table, line, strerror(-ret));
	return json_pack("{s:b}", "ok", 1);
}

static json_t *
cmd_table_dump(struct swx_app *a, json_t *req)
{
	const char *table = get_str(req, "table");
	struct rte_swx_ctl_pipeline_info pi;
	struct rte_swx_ctl_table_info ti;
	json_t *entries, *e;
	bool found = false;
	uint32_t i;
	size_t n;

	if (table == NULL)
		return err("usage", "table_dump needs \"table\"");
	if (rte_swx_ctl_pipeline_info_get(a->p, &pi) == 0)
		for (i = 0; i < pi.n_tables && !found; i++)
			found = rte_swx_ctl_table_info_get(a->p, i, &ti) == 0 && strcmp(ti.name, table) == 0;
	if (!found)
		return err("usage", "table_dump: no table %s", table);
	entries = json_array();
	json_array_foreach(shadows, n, e)
		if (strcmp(json_string_value(json_array_get(e, 0)), table) == 0)
			json_array_append(entries, json_array_get(e, 2));
	return json_pack("{s:b, s:o}", "ok", 1, "entries", entries);
}

/* The size of register array name; 0 when there is none. */
static uint32_t
regarray_size(struct swx_app *a, const char *name)
{
	struct rte_swx_ctl_pipeline_info pi;
	struct rte_swx_ctl_regarray_info ri;
	uint32_t i;

	if (rte_swx_ctl_pipeline_info_get(a->p, &pi) != 0)
		return 0;
	for (i = 0; i < pi.n_regarrays; i++)
		if (rte_swx_ctl_regarray_info_get(a->p, i, &ri) == 0 && strcmp(ri.name, name) == 0)
			return ri.size;
	return 0;
}

static json_t *
cmd_reg_read(struct swx_app *a, json_t *req)
{
	const char *name = get_str(req, "name");
	uint32_t size = name ? regarray_size(a, name) : 0;
	int64_t index = get_uint(req, "index", 0);
	int64_t count = get_uint(req, "count", (int64_t)size - (index < 0 ? 0 : index));
	json_t *values;
	int64_t i;

	if (name == NULL)
		return err("usage", "reg_read needs \"name\"");
	if (size == 0)
		return err("usage", "reg_read: no register array %s", name);
	if (index < 0 || count < 0 || index + count > size || count > REG_READ_MAX)
		return err("usage", "reg_read %s: cells %" PRId64 "..+%" PRId64 " outside 0..%u "
			   "(at most %u a read)", name, index, count, size, REG_READ_MAX);
	values = json_array();
	for (i = index; i < index + count; i++) {
		uint64_t v = 0;

		if (rte_swx_ctl_pipeline_regarray_read(a->p, name, (uint32_t)i, &v) != 0) {
			json_decref(values);
			return err("failure", "reg_read %s[%" PRId64 "] failed", name, i);
		}
		json_array_append_new(values, json_integer((json_int_t)v));
	}
	return json_pack("{s:b, s:o}", "ok", 1, "values", values);
}

static json_t *
cmd_reg_write(struct swx_app *a, json_t *req)
{
	const char *name = get_str(req, "name");
	int64_t index = get_uint(req, "index", -1), value = get_uint(req, "value", -1);
	int ret;

	if (name == NULL || index < 0 || value < 0)
		return err("usage", "reg_write needs \"name\", \"index\" and \"value\" (>= 0)");
	ret = rte_swx_ctl_pipeline_regarray_write(a->p, name, (uint32_t)index, (uint64_t)value);
	if (ret != 0)
		return err("usage", "reg_write %s[%" PRId64 "]: %s", name, index, strerror(-ret));
	return json_pack("{s:b}", "ok", 1);
}

static json_t *
cmd_reg_clear(struct swx_app *a, json_t *req)
{
	const char *name = get_str(req, "name");
	uint32_t size = name ? regarray_size(a, name) : 0, i;

	if (size == 0)
		return err("usage", "reg_clear needs \"name\", a register array of the pipeline");
	for (i = 0; i < size; i++)
		if (rte_swx_ctl_pipeline_regarray_write(a->p, name, i, 0) != 0)
			return err("failure", "reg_clear %s[%u] failed", name, i);
	return json_pack("{s:b}", "ok", 1);
}

static json_t *
cmd_info(struct swx_app *a)
{
	struct rte_swx_ctl_pipeline_info pi;
	json_t *ports = json_array();
	uint16_t i;

	for (i = 0; i < a->nb_ports; i++) {
		struct rte_ether_addr mac;
		char buf[RTE_ETHER_ADDR_FMT_SIZE] = "";

		if (rte_eth_macaddr_get(a->ports[i].port_id, &mac) == 0)
			rte_ether_format_addr(buf, sizeof(buf), &mac);
		json_array_append_new(ports, json_pack("{s:i, s:s, s:s}", "port", i, "name",
						       a->ports[i].name, "mac", buf));
	}
	memset(&pi, 0, sizeof(pi));
	rte_swx_ctl_pipeline_info_get(a->p, &pi);
	return json_pack("{s:b, s:s, s:o, s:i, s:b, s:I, s:I, s:{s:i, s:i, s:i, s:i, s:i}}",
			 "ok", 1, "mode", "swx", "ports", ports, "burst", (int)a->burst,
			 "paused", a->paused,
			 "uptime_us", (json_int_t)now_us(a),
			 "loops", (json_int_t)a->loops, "pipeline",
			 "ports_in", (int)pi.n_ports_in, "ports_out", (int)pi.n_ports_out,
			 "tables", (int)pi.n_tables, "actions", (int)pi.n_actions,
			 "regarrays", (int)pi.n_regarrays);
}

static json_t *
cmd_counters(struct swx_app *a)
{
	json_t *ports = json_array();
	struct rte_swx_port_out_stats drop;
	uint16_t i;

	for (i = 0; i < a->nb_ports; i++) {
		struct swx_port_counters *c = &a->ports[i].c;
		struct rte_swx_port_in_stats in;
		struct rte_swx_port_out_stats out;

		memset(&in, 0, sizeof(in));
		memset(&out, 0, sizeof(out));
		rte_swx_ctl_pipeline_port_in_stats_read(a->p, i, &in);
		rte_swx_ctl_pipeline_port_out_stats_read(a->p, i, &out);
		json_array_append_new(ports, json_pack(
			"{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			"port", i, "rx_frames", (json_int_t)c->rx_frames,
			"rx_bytes", (json_int_t)c->rx_bytes, "rx_ring_full", (json_int_t)c->rx_ring_full,
			"rx_no_headroom", (json_int_t)c->rx_no_headroom,
			"tx_frames", (json_int_t)c->tx_frames, "tx_bytes", (json_int_t)c->tx_bytes,
			"tx_full", (json_int_t)c->tx_full, "tx_bad_meta", (json_int_t)c->tx_bad_meta,
			"pipeline_in_frames", (json_int_t)in.n_pkts,
			"pipeline_in_bytes", (json_int_t)in.n_bytes,
			"pipeline_out_frames", (json_int_t)out.n_pkts,
			"pipeline_out_bytes", (json_int_t)out.n_bytes));
	}
	memset(&drop, 0, sizeof(drop));
	rte_swx_ctl_pipeline_port_out_stats_read(a->p, a->nb_ports, &drop);
	return json_pack("{s:b, s:o, s:I}", "ok", 1, "ports", ports,
			 "pipeline_dropped", (json_int_t)drop.n_pkts_drop);
}

static json_t *
dispatch(struct swx_app *a, json_t *req)
{
	const char *cmd = get_str(req, "cmd");

	if (cmd == NULL)
		return err("usage", "a request is a JSON object with a \"cmd\" string");
	if (strcmp(cmd, "ping") == 0)
		return json_pack("{s:b, s:i}", "ok", 1, "pid", (int)getpid());
	if (strcmp(cmd, "info") == 0)
		return cmd_info(a);
	if (strcmp(cmd, "counters") == 0)
		return cmd_counters(a);
	if (strcmp(cmd, "table_add") == 0 || strcmp(cmd, "table_delete") == 0)
		return cmd_table(a, req, cmd);
	if (strcmp(cmd, "table_dump") == 0)
		return cmd_table_dump(a, req);
	if (strcmp(cmd, "reg_read") == 0)
		return cmd_reg_read(a, req);
	if (strcmp(cmd, "reg_write") == 0)
		return cmd_reg_write(a, req);
	if (strcmp(cmd, "reg_clear") == 0)
		return cmd_reg_clear(a, req);
	if (strcmp(cmd, "pause") == 0 || strcmp(cmd, "resume") == 0) {
		a->paused = strcmp(cmd, "pause") == 0;
		return json_pack("{s:b}", "ok", 1);
	}
	if (strcmp(cmd, "quit") == 0) {
		a->quit = true;
		return json_pack("{s:b}", "ok", 1);
	}
	return err("usage", "unknown command \"%s\" (ping, info, counters, table_add, table_delete, "
		   "table_dump, reg_read, reg_write, reg_clear, pause, resume, quit)", cmd);
}

/* conn.c's handler: answer one JSON request line. */
static char *
swx_ctl_handle(const char *line, size_t len, void *arg)
{
	json_error_t jerr;
	json_t *req = json_loadb(line, len, 0, &jerr), *resp;
	char *out;

	if (req == NULL || !json_is_object(req))
		resp = err("usage", "not a JSON object: %s", req ? "another JSON value" : jerr.text);
	else
		resp = dispatch(arg, req);
	json_decref(req);
	out = json_dumps(resp, JSON_COMPACT);
	json_decref(resp);
	return out;
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
