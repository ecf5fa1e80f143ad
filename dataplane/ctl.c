/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket's commands: one JSON object per line each way
 * (docs/control-socket.md), JSON via jansson. The connections themselves
 * (socket, lines, queued output) are conn.c's, as examples/ip_pipeline
 * splits its cli.c from its conn.c; this file parses a request, runs its
 * command and writes the answer. Behind an opaque struct: embnic_ctl_init /
 * embnic_ctl_poll / embnic_ctl_free.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "embnic_buildinfo.h"
#include "embnic_conn.h"
#include "embnic_dp.h"

#define CTL_DUMP_LIMIT	1000		/* default state_dump limit */

struct embnic_ctl {
	struct embnic_app *app;
	struct embnic_conn *conn;
	char err[256];
};

/* ---- request helpers ---- */

static int
ctl_fail(struct embnic_ctl *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int
ctl_fail(struct embnic_ctl *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return -1;
}

/* An integer field in [lo, hi]; absent -> *out = dflt if dflt >= 0. */
static int
get_int(struct embnic_ctl *c, json_t *req, const char *name, long long lo,
	long long hi, long long dflt, long long *out)
{
	json_t *v = json_object_get(req, name);

	if (v == NULL) {
		if (dflt >= 0) {
			*out = dflt;
			return 0;
		}
		return ctl_fail(c, "missing field '%s'", name);
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo ||
	    json_integer_value(v) > hi)
		return ctl_fail(c, "field '%s' must be an integer %lld..%lld",
				name, lo, hi);
	*out = json_integer_value(v);
	return 0;
}

static const char *
get_str(struct embnic_ctl *c, json_t *req, const char *name)
{
	json_t *v = json_object_get(req, name);

	if (v == NULL || !json_is_string(v)) {
		ctl_fail(c, "field '%s' must be a string", name);
		return NULL;
	}
	return json_string_value(v);
}

static json_t *
ip_json(uint32_t ip_be)
{
	char buf[INET_ADDRSTRLEN];
	struct in_addr a = { .s_addr = ip_be };

	inet_ntop(AF_INET, &a, buf, sizeof(buf));
	return json_string(buf);
}

static json_t *
mac_json(const struct rte_ether_addr *mac)
{
	char buf[RTE_ETHER_ADDR_FMT_SIZE];

	rte_ether_format_addr(buf, sizeof(buf), mac);
	return json_string(buf);
}

/* A peer from {<idname>, port, mac, ip, udp_port}. */
static int
get_peer(struct embnic_ctl *c, json_t *req, const char *idname,
	 long long dflt_udp, struct embnic_peer *p)
{
	long long id = 0, port = 0, udp = 0;
	const char *mac, *ip;
	struct in_addr a;

	memset(p, 0, sizeof(*p));
	if (get_int(c, req, idname, 0, UINT16_MAX, -1, &id) ||
	    get_int(c, req, "port", 0, c->app->nb_ports - 1, -1, &port) ||
	    get_int(c, req, "udp_port", 1, UINT16_MAX, dflt_udp, &udp))
		return -1;
	mac = get_str(c, req, "mac");
	if (mac == NULL)
		return -1;
	if (rte_ether_unformat_addr(mac, &p->mac) != 0)
		return ctl_fail(c, "field 'mac' is not a MAC address: '%s'",
				mac);
	ip = get_str(c, req, "ip");
	if (ip == NULL)
		return -1;
	if (inet_pton(AF_INET, ip, &a) != 1)
		return ctl_fail(c, "field 'ip' is not an IPv4 address: '%s'",
				ip);
	p->id = (uint32_t)id;
	p->port = (uint16_t)port;
	p->udp_port = rte_cpu_to_be_16((uint16_t)udp);
	p->ip = a.s_addr;
	return 0;
}

static json_t *
peer_json(const struct embnic_peer *p, const char *idname)
{
	return json_pack("{s:I, s:I, s:o, s:o, s:I}", idname, (json_int_t)p->id,
			 "port", (json_int_t)p->port, "mac", mac_json(&p->mac),
			 "ip", ip_json(p->ip), "udp_port",
			 (json_int_t)rte_be_to_cpu_16(p->udp_port));
}

/* ---- commands ---- */

typedef int (*ctl_cmd_fn)(struct embnic_ctl *c, json_t *req, json_t *resp);

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

		json_array_append_new(ports, json_pack("{s:I, s:s, s:o, s:o, s:I}",
			"port", (json_int_t)p->id, "name", p->name,
			"mac", mac_json(&p->mac), "ip", ip_json(p->ip),
			"tx_queues", (json_int_t)p->nb_txq));
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

/* Add or replace validated peer p; on failure the table is unchanged. */
static int
table_put(struct embnic_ctl *c, struct embnic_table *t,
	  const struct embnic_peer *p, const char *idname)
{
	int ret = embnic_table_add(t, p);

	if (ret == -ENOSPC)
		return ctl_fail(c, "%s table is full (%u entries)", idname,
				embnic_table_size(t));
	if (ret < 0)
		return ctl_fail(c, "cannot add %s %u: %s", idname, p->id,
				strerror(-ret));
	return 0;
}

/* Is there room in t for p (a new id needs a free entry)? */
static bool
table_has_room(struct embnic_table *t, const struct embnic_peer *p)
{
	const struct embnic_peer *found = NULL;

	if (embnic_table_count(t) < embnic_table_size(t))
		return true;
	embnic_table_lookup_bulk(t, &p->id, 1, &found);
	return found != NULL;
}

static int
table_del(struct embnic_ctl *c, struct embnic_table *t, json_t *req,
	  const char *idname)
{
	long long id = 0;

	if (get_int(c, req, idname, 0, UINT16_MAX, -1, &id))
		return -1;
	if (embnic_table_del(t, (uint32_t)id) < 0)
		return ctl_fail(c, "no %s %lld", idname, id);
	return 0;
}

struct walk_arg {
	struct embnic_peer *v;
	unsigned int n, max;
};

static void
walk_collect(const struct embnic_peer *p, void *arg)
{
	struct walk_arg *w = arg;

	if (w->n < w->max)
		w->v[w->n++] = *p;
}

static int
peer_cmp(const void *a, const void *b)
{
	const struct embnic_peer *x = a, *y = b;

	return (x->id > y->id) - (x->id < y->id);
}

static int
table_list(struct embnic_ctl *c, struct embnic_table *t, json_t *resp,
	   const char *idname, const char *listname)
{
	struct walk_arg w = { .max = embnic_table_size(t) };
	json_t *arr = json_array();
	unsigned int i;

	w.v = calloc(w.max, sizeof(*w.v));
	if (w.v == NULL)
		return ctl_fail(c, "out of memory");
	embnic_table_walk(t, walk_collect, &w);
	qsort(w.v, w.n, sizeof(*w.v), peer_cmp);
	for (i = 0; i < w.n; i++)
		json_array_append_new(arr, peer_json(&w.v[i], idname));
	free(w.v);
	json_object_set_new(resp, listname, arr);
	return 0;
}

static int
cmd_route_add(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	struct embnic_peer p;

	if (get_peer(c, req, "shard", EMBNIC_UDP_PORT, &p))
		return -1;
	if (!table_has_room(c->app->routes, &p))
		return ctl_fail(c, "shard table is full (%u entries)",
				embnic_table_size(c->app->routes));
	/*
	 * The shard's statistics slot exists before its first frame passes;
	 * a refused request (above) assigns none.
	 */
	embnic_shard_slot_assign(c->app, p.id);
	return table_put(c, c->app->routes, &p, "shard");
}

static int
cmd_route_del(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	return table_del(c, c->app->routes, req, "shard");
}

static int
cmd_route_list(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	return table_list(c, c->app->routes, resp, "shard", "routes");
}

static int
cmd_client_add(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	struct embnic_peer p;

	if (get_peer(c, req, "client", -1, &p))
		return -1;
	return table_put(c, c->app->clients, &p, "client");
}

static int
cmd_client_del(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	return table_del(c, c->app->clients, req, "client");
}

static int
cmd_client_list(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	return table_list(c, c->app->clients, resp, "client", "clients");
}

/*
 * The JSON writer of struct embnic_emit: records and lists of records in
 * the response object.
 */
struct json_emit {
	json_t *top, *cur;
};

static void
json_record(void *ctx, const char *name)
{
	struct json_emit *w = ctx;

	w->cur = w->top;
	if (name == NULL)
		return;
	w->cur = json_object();
	json_object_set_new(w->top, name, w->cur);
}

static void
json_item(void *ctx, const char *list, const char *item __rte_unused,
	  unsigned int index __rte_unused)
{
	struct json_emit *w = ctx;
	json_t *arr = json_object_get(w->top, list);

	if (arr == NULL) {
		arr = json_array();
		json_object_set_new(w->top, list, arr);
	}
	w->cur = json_object();
	json_array_append_new(arr, w->cur);
}

static void
json_u64(void *ctx, const char *key, uint64_t v)
{
	struct json_emit *w = ctx;

	json_object_set_new(w->cur, key, json_integer((json_int_t)v));
}

static void
json_list(void *ctx, const char *key, const uint64_t *v, unsigned int n)
{
	struct json_emit *w = ctx;
	json_t *arr = json_array();
	unsigned int i;

	for (i = 0; i < n; i++)
		json_array_append_new(arr, json_integer((json_int_t)v[i]));
	json_object_set_new(w->cur, key, arr);
}

static struct embnic_emit
json_emitter(json_t *resp, struct json_emit *w)
{
	w->top = w->cur = resp;
	return (struct embnic_emit){ .record = json_record, .item = json_item,
				     .u64 = json_u64, .list = json_list,
				     .ctx = w };
}

static int
cmd_counters(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	struct json_emit w;
	struct embnic_emit e = json_emitter(resp, &w);

	embnic_counters_emit(c->app, &e);
	return 0;
}

static int
cmd_state_summary(struct embnic_ctl *c, json_t *req __rte_unused,
		  json_t *resp)
{
	struct json_emit w;
	struct embnic_emit e = json_emitter(resp, &w);
	struct embnic_totals t;

	embnic_counters_sum(c->app, &t);
	embnic_state_emit(c->app, &t, true, &e);
	return 0;
}

static int
cmd_ring_stats(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	struct embnic_totals t;

	embnic_counters_sum(c->app, &t);
	json_object_set_new(resp, "size", json_integer(
		embnic_ring_capacity(c->app)));
	json_object_set_new(resp, "count", json_integer(
		embnic_ring_count(c->app)));
	json_object_set_new(resp, "high_water", json_integer(
		(json_int_t)t.ring_high_water));
	json_object_set_new(resp, "rings", json_integer(c->app->nb_workers));
	return 0;
}

/* One header log entry as JSON; lcore < 0 and no egress port for the ring. */
static json_t *
hlog_entry_json(const struct embnic_app *app,
		const struct embnic_hlog_entry *e, int lcore)
{
	json_t *o = json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
		" s:I, s:I, s:I, s:I, s:I, s:I}",
		"msg_type", (json_int_t)e->msg_type,
		"flags", (json_int_t)e->flags,
		"msg_id", (json_int_t)e->msg_id,
		"client_id", (json_int_t)e->client_id,
		"table_id", (json_int_t)e->table_id,
		"shard_id", (json_int_t)e->shard_id,
		"num_keys", (json_int_t)e->num_keys,
		"msg_len", (json_int_t)e->msg_len,
		"frag_index", (json_int_t)e->frag_index,
		"frag_count", (json_int_t)e->frag_count,
		"frag_len", (json_int_t)e->frag_len,
		"dim", (json_int_t)e->dim,
		"status", (json_int_t)e->status,
		"ingress_port", (json_int_t)e->in_port,
		"time_us", (json_int_t)(embnic_tsc_to_ns(app, e->tsc) / 1000),
		"time_ns", (json_int_t)embnic_tsc_to_ns(app, e->tsc));

	if (o != NULL && lcore >= 0) {
		json_object_set_new(o, "egress_port",
				    json_integer(e->out_port));
		json_object_set_new(o, "lcore", json_integer(lcore));
	}
	return o;
}

/*
 * ring_last {last}: the headers of the last `last` message frames the card
 * forwarded, newest first (every lcore's header log merged by time), and
 * those of up to `last` message frames still waiting in the header ring,
 * newest first (from the RX stage's ring log: the ring itself holds mbuf
 * pointers that the TX lcore dequeues and frees while this thread would
 * read them), with how full the ring is.
 */
static int
cmd_ring_last(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	struct embnic_hlog_entry *e;
	unsigned int lc[EMBNIC_HLOG_SIZE];
	long long last = 0;
	uint64_t logged, waiting;
	json_t *arr;
	unsigned int n, i;

	if (get_int(c, req, "last", 1, EMBNIC_HLOG_KEEP, 20, &last))
		return -1;
	e = calloc((size_t)last, sizeof(*e));
	if (e == NULL)
		return ctl_fail(c, "out of memory");
	n = embnic_ring_read(c->app, e, (unsigned int)last, &waiting);
	arr = json_array();
	for (i = 0; i < n; i++)
		json_array_append_new(arr, hlog_entry_json(c->app, &e[i], -1));
	json_object_set_new(resp, "in_ring", arr);
	json_object_set_new(resp, "in_ring_count",
			    json_integer((json_int_t)waiting));
	n = embnic_hlog_read(c->app, e, lc, (unsigned int)last, &logged);
	arr = json_array();
	for (i = 0; i < n; i++)
		json_array_append_new(arr, hlog_entry_json(c->app, &e[i],
							   (int)lc[i]));
	free(e);
	json_object_set_new(resp, "entries", arr);
	json_object_set_new(resp, "log_size", json_integer(EMBNIC_HLOG_KEEP));
	json_object_set_new(resp, "logged", json_integer((json_int_t)logged));
	json_object_set_new(resp, "ring_size", json_integer(
		embnic_ring_capacity(c->app)));
	json_object_set_new(resp, "ring_count", json_integer(
		embnic_ring_count(c->app)));
	return 0;
}

static int
cmd_state_dump(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	struct embnic_state_view *v;
	unsigned int *part;
	json_t *arr;
	long long limit = 0;
	unsigned int n = 0, i, k, got;

	if (get_int(c, req, "limit", 0, c->app->opts.state_size,
		    CTL_DUMP_LIMIT, &limit))
		return -1;
	v = calloc(limit > 0 ? limit : 1, sizeof(*v));
	part = calloc(limit > 0 ? limit : 1, sizeof(*part));
	if (v == NULL || part == NULL) {
		free(v);
		free(part);
		return ctl_fail(c, "out of memory");
	}
	/* every partition, read in place: no lock, no state lcore waits */
	for (k = 0; k < c->app->nb_workers && n < limit; k++) {
		got = embnic_state_dump(c->app->w[k].state, v + n,
					(unsigned int)limit - n);
		for (i = n; i < n + got; i++)
			part[i] = k;
		n += got;
	}
	arr = json_array();
	for (i = 0; i < n; i++)
		json_array_append_new(arr, json_pack(
			"{s:I, s:I, s:s, s:I, s:I, s:s?, s:s?, s:I, s:I, s:I,"
			" s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			"client", (json_int_t)v[i].client_id,
			"msg_id", (json_int_t)v[i].msg_id,
			"state", embnic_state_name(v[i].state),
			"table", (json_int_t)v[i].table_id,
			"shard", (json_int_t)v[i].shard_id,
			"type", embnic_type_name(v[i].msg_type),
			"reply_type", embnic_type_name(v[i].rep_type),
			"msg_len", (json_int_t)v[i].msg_len,
			"frag_count", (json_int_t)v[i].frag_count,
			"frags_in", (json_int_t)v[i].frags_in,
			"frames_in", (json_int_t)v[i].frames_in,
			"bytes_in", (json_int_t)v[i].bytes_in,
			"reply_frag_count", (json_int_t)v[i].rep_frag_count,
			"frags_out", (json_int_t)v[i].frags_out,
			"frames_out", (json_int_t)v[i].frames_out,
			"bytes_out", (json_int_t)v[i].bytes_out,
			"first_ns", (json_int_t)embnic_tsc_to_ns(c->app,
							v[i].first_tsc),
			"last_ns", (json_int_t)embnic_tsc_to_ns(c->app,
							v[i].last_tsc),
			"partition", (json_int_t)part[i]));
	free(v);
	free(part);
	json_object_set_new(resp, "entries", arr);
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
	return ctl_fail(c, "field 'stage' must be \"rx\" or \"tx\"");
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
} ctl_cmds[] = {
	{ "ping", cmd_ping },
	{ "info", cmd_info },
	{ "route_add", cmd_route_add },
	{ "route_del", cmd_route_del },
	{ "route_list", cmd_route_list },
	{ "client_add", cmd_client_add },
	{ "client_del", cmd_client_del },
	{ "client_list", cmd_client_list },
	{ "counters", cmd_counters },
	{ "state_summary", cmd_state_summary },
	{ "state_dump", cmd_state_dump },
	{ "ring_stats", cmd_ring_stats },
	{ "ring_last", cmd_ring_last },
	{ "reset_counters", cmd_reset_counters },
	{ "pause", cmd_pause },
	{ "resume", cmd_resume },
	{ "quit", cmd_quit },
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
	req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (req == NULL) {
		ctl_fail(c, "invalid JSON: %s", jerr.text);
		goto out;
	}
	id = json_object_get(req, "id");
	if (id != NULL)
		json_object_set(resp, "id", id);
	if (!json_is_object(req) ||
	    !json_is_string(json_object_get(req, "cmd"))) {
		ctl_fail(c, "a request is a JSON object with a string \"cmd\"");
		goto out;
	}
	cmd = json_string_value(json_object_get(req, "cmd"));
	for (i = 0; i < RTE_DIM(ctl_cmds); i++)
		if (strcmp(cmd, ctl_cmds[i].name) == 0)
			break;
	if (i == RTE_DIM(ctl_cmds)) {
		ctl_fail(c, "unknown cmd '%s'", cmd);
		goto out;
	}
	ret = ctl_cmds[i].fn(c, req, resp);
out:
	json_decref(req);
	json_object_set_new(resp, "ok", json_boolean(ret == 0));
	if (ret != 0)
		json_object_set_new(resp, "error", json_string(c->err));
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
