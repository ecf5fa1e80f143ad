/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic-swx's control socket (main.c: the rest of the process).
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
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <rte_swx_ctl.h>

#include "embnic_swx.h"

#define REG_READ_MAX	(1u << 20)	/* cells per reg_read */
#define KEY_MAX		16		/* match values of an entry */
#define KEY_LEN		(KEY_MAX * 21 + 1)	/* match_key's key */

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
char *
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
