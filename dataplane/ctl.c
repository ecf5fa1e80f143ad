/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket's commands (docs/control-socket.md): a request
 * parsed, its command looked up in the table, the answer written; the
 * commands on the card as a whole. The other commands and the split:
 * include/embnic_ctl.h; the connections: conn.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include <rte_common.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "embnic_buildinfo.h"
#include "embnic_conn.h"
#include "embnic_ctl.h"

/* ---- commands on the card as a whole ---- */

static int
cmd_ping(struct embnic_ctl *c __rte_unused, json_t *req __rte_unused,
	 json_t *resp)
{
	json_object_set_new(resp, "pid", json_integer(getpid()));
	return 0;
}

static json_t *
buildinfo_json(void)
{
	const struct embnic_buildinfo *b = &embnic_buildinfo;
	json_t *fields = json_array();
	uint32_t i;

	for (i = 0; i < b->n_fields && i < EMBNIC_BUILDINFO_MAX_FIELDS; i++)
		json_array_append_new(fields, json_pack("{s:s%, s:I, s:I}",
			"name", b->fields[i].name,
			strnlen(b->fields[i].name, EMBNIC_BUILDINFO_NAME_LEN),
			"offset", (json_int_t)b->fields[i].offset,
			"size", (json_int_t)b->fields[i].size));
	return json_pack("{s:s%, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			 " s:o, s:s, s:s}",
		"magic", b->magic, sizeof(b->magic),
		"info_version", (json_int_t)b->info_version,
		"proto_version", (json_int_t)b->proto_version,
		"hdr_len", (json_int_t)b->hdr_len,
		"udp_port", (json_int_t)b->udp_port,
		"ring_size", (json_int_t)b->ring_size,
		"route_table_size", (json_int_t)b->route_table_size,
		"client_table_size", (json_int_t)b->client_table_size,
		"state_table_size", (json_int_t)b->state_table_size,
		"n_fields", (json_int_t)b->n_fields,
		"fields", fields,
		"git_rev", b->git_rev,
		"dpdk_version", b->dpdk_version);
}

static int
cmd_info(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	struct embnic_app *app = c->app;
	json_t *ports = json_array(), *state_lcores;
	unsigned int k;
	uint16_t i;

	for (i = 0; i < app->nb_ports; i++) {
		const struct embnic_port *p = &app->ports[i];

		json_array_append_new(ports, json_pack(
			"{s:I, s:s, s:o, s:o, s:I, s:I, s:s}",
			"port", (json_int_t)p->id, "name", p->name,
			"mac", ctl_mac_json(&p->mac), "ip", ctl_ip_json(p->ip),
			"tx_queues", (json_int_t)p->nb_txq,
			"max_frame", (json_int_t)p->max_frame,
			"max_frame_by",
			embnic_frame_limit_name(p->max_frame_by)));
	}
	json_object_set_new(resp, "build", buildinfo_json());
	json_object_set_new(resp, "ports", ports);
	json_object_set_new(resp, "lcores", json_integer(app->nb_lcores));
	json_object_set_new(resp, "mode", json_string(
		app->nb_workers > 1 ? "partitioned" :
		app->rx_lcore == app->tx_lcore ? "run_to_completion" :
		"pipeline"));
	json_object_set_new(resp, "rx_lcore", json_integer(app->rx_lcore));
	json_object_set_new(resp, "tx_lcore", json_integer(app->tx_lcore));
	json_object_set_new(resp, "state_lcores",
			    json_integer(app->nb_workers));
	state_lcores = json_array();
	for (k = 0; k < app->nb_workers; k++)
		json_array_append_new(state_lcores,
				      json_integer(app->w[k].lcore));
	json_object_set_new(resp, "state_lcore_ids", state_lcores);
	json_object_set_new(resp, "main_lcore", json_integer(app->main_lcore));
	json_object_set_new(resp, "paused", json_boolean(app->paused));
	json_object_set_new(resp, "tx_paused", json_boolean(app->tx_paused));
	json_object_set_new(resp, "ring_size",
			    json_integer(rte_ring_get_capacity(app->w[0].ring)));
	json_object_set_new(resp, "state_size",
			    json_integer(app->opts.state_size));
	json_object_set_new(resp, "state_timeout_ms",
			    json_integer(app->opts.state_timeout_ms));
	json_object_set_new(resp, "burst", json_integer(app->opts.burst));
	json_object_set_new(resp, "mempool_ops", json_string(
		rte_mempool_get_ops(app->pool->ops_index)->name));
	json_object_set_new(resp, "pid", json_integer(getpid()));
	return 0;
}

static int
cmd_reset_counters(struct embnic_ctl *c, json_t *req __rte_unused,
		   json_t *resp __rte_unused)
{
	embnic_counters_reset(c->app);
	return 0;
}

/*
 * The stage a pause/resume names ({stage}: "rx" or "tx"): 0 rx, 1 tx, or
 * absent when the field is; -1 (error set) for anything else.
 */
static int
stage_arg(struct embnic_ctl *c, json_t *req, int absent)
{
	json_t *v = json_object_get(req, "stage");
	const char *stage = json_string_value(v);

	if (v == NULL)
		return absent;
	if (stage != NULL && strcmp(stage, "rx") == 0)
		return 0;
	if (stage != NULL && strcmp(stage, "tx") == 0)
		return 1;
	return ctl_refuse(c, "field 'stage' must be \"rx\" or \"tx\"");
}

/*
 * pause {stage}: "rx" (default) stops the RX stage polling the ports;
 * "tx" stops the TX stage taking frames off the header ring, so accepted
 * frames wait there (ring_last lists them; a full ring drops as ring_full).
 */
static int
cmd_pause(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	int s = stage_arg(c, req, 0);

	if (s < 0)
		return -1;
	if (s == 0)
		c->app->paused = true;
	else
		c->app->tx_paused = true;
	return 0;
}

/* resume {stage}: that stage runs again; without stage, both do. */
static int
cmd_resume(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	int s = stage_arg(c, req, 2);

	if (s < 0)
		return -1;
	if (s != 1)
		c->app->paused = false;
	if (s != 0)
		c->app->tx_paused = false;
	return 0;
}

static int
cmd_quit(struct embnic_ctl *c __rte_unused, json_t *req __rte_unused,
	 json_t *resp __rte_unused)
{
	force_quit = true;
	return 0;
}

static const struct {
	const char *name;
	ctl_cmd_fn fn;
	/* or: the answer is this walk of counters.c's, written as JSON */
	void (*walk)(const struct embnic_app *app, const struct embnic_emit *e);
} ctl_cmds[] = {
	{ "ping", .fn = cmd_ping },
	{ "info", .fn = cmd_info },
#define CTL_CMD_ENTRY(name) { #name, .fn = ctl_cmd_##name },
	CTL_FILE_CMDS(CTL_CMD_ENTRY)
	{ "counters", .walk = embnic_counters_emit },
	{ "state_summary", .walk = embnic_state_summary_emit },
	{ "ring_stats", .walk = embnic_ring_stats_emit },
	{ "reset_counters", .fn = cmd_reset_counters },
	{ "pause", .fn = cmd_pause },
	{ "resume", .fn = cmd_resume },
	{ "quit", .fn = cmd_quit },
};

/* Handle one request line; returns the response object. */
static json_t *
ctl_handle(struct embnic_ctl *c, const char *line, size_t len)
{
	json_t *req, *resp = json_object(), *id;
	json_error_t jerr;
	const char *cmd;
	unsigned int i;
	int ret = -1;

	c->err[0] = '\0';
	c->err_kind = "failure";
	req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (req == NULL) {
		ctl_refuse(c, "invalid JSON: %s", jerr.text);
		goto out;
	}
	id = json_object_get(req, "id");
	if (id != NULL)
		json_object_set(resp, "id", id);
	if (!json_is_object(req) ||
	    !json_is_string(json_object_get(req, "cmd"))) {
		ctl_refuse(c, "a request is a JSON object with a string \"cmd\"");
		goto out;
	}
	cmd = json_string_value(json_object_get(req, "cmd"));
	for (i = 0; i < RTE_DIM(ctl_cmds); i++)
		if (strcmp(cmd, ctl_cmds[i].name) == 0)
			break;
	if (i == RTE_DIM(ctl_cmds)) {
		ctl_refuse(c, "unknown cmd '%s'", cmd);
		goto out;
	}
	if (ctl_cmds[i].walk != NULL) {
		struct ctl_json_emit w;
		struct embnic_emit e = ctl_json_emitter(resp, &w);

		ctl_cmds[i].walk(c->app, &e);
		ret = 0;
	} else {
		ret = ctl_cmds[i].fn(c, req, resp);
	}
out:
	json_decref(req);
	json_object_set_new(resp, "ok", json_boolean(ret == 0));
	if (ret != 0) {
		json_object_set_new(resp, "error", json_string(c->err));
		json_object_set_new(resp, "kind", json_string(c->err_kind));
	}
	return resp;
}

char *
embnic_ctl_request(struct embnic_ctl *c, const char *line, size_t len)
{
	json_t *resp = ctl_handle(c, line, len);
	char *s = json_dumps(resp, JSON_COMPACT);

	json_decref(resp);
	return s;
}

/* conn.c's handler: one request line in, its answer (malloc'ed) out. */
static char *
ctl_line(const char *line, size_t len, void *arg)
{
	return embnic_ctl_request(arg, line, len);
}

struct embnic_ctl *
embnic_ctl_init(struct embnic_app *app, const char *path)
{
	struct embnic_ctl *c = calloc(1, sizeof(*c));
	int err;

	if (c == NULL)
		return NULL;
	c->app = app;
	if (path == NULL)
		return c;	/* requests through embnic_ctl_request() only */
	c->conn = embnic_conn_init(path, ctl_line, c);
	if (c->conn == NULL) {
		err = errno;
		free(c);
		errno = err;
		return NULL;
	}
	return c;
}

void
embnic_ctl_poll(struct embnic_ctl *c, int timeout_ms)
{
	if (c->conn != NULL)
		embnic_conn_poll(c->conn, timeout_ms);
}

void
embnic_ctl_free(struct embnic_ctl *c)
{
	if (c == NULL)
		return;
	embnic_conn_free(c->conn);
	free(c);
}
