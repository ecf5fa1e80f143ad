/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket: a UNIX stream socket (mode 0600) polled by the main
 * lcore, one JSON object per line each way (docs/control-socket.md). Like
 * examples/ip_pipeline/conn.c it sits behind an opaque struct
 * (embnic_ctl_init / embnic_ctl_poll / embnic_ctl_free) and never blocks:
 * sockets are non-blocking, input is split into lines, output is queued
 * and flushed as the peer reads. JSON via jansson.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "embnic_buildinfo.h"
#include "embnic_dp.h"

#define CTL_MAX_CONNS	16
#define CTL_MAX_LINE	(64 * 1024)	/* bytes per request line */
#define CTL_MAX_OUT	(64u << 20)	/* queued response bytes per conn */
#define CTL_DUMP_LIMIT	1000		/* default state_dump limit */

struct ctl_conn {
	int fd;
	char *in;
	size_t in_len;
	char *out;
	size_t out_len, out_off, out_cap;
};

struct embnic_ctl {
	struct embnic_app *app;
	int lfd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char err[256];
	struct ctl_conn conns[CTL_MAX_CONNS];
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
	json_t *ports = json_array();
	uint16_t i;

	for (i = 0; i < app->nb_ports; i++) {
		const struct embnic_port *p = &app->ports[i];

		json_array_append_new(ports, json_pack("{s:I, s:s, s:o, s:o}",
			"port", (json_int_t)p->id, "name", p->name,
			"mac", mac_json(&p->mac), "ip", ip_json(p->ip)));
	}
	json_object_set_new(resp, "build", buildinfo_json());
	json_object_set_new(resp, "ports", ports);
	json_object_set_new(resp, "lcores", json_integer(app->nb_lcores));
	json_object_set_new(resp, "mode", json_string(
		app->rx_lcore == app->tx_lcore ? "run_to_completion" :
		"pipeline"));
	json_object_set_new(resp, "rx_lcore", json_integer(app->rx_lcore));
	json_object_set_new(resp, "tx_lcore", json_integer(app->tx_lcore));
	json_object_set_new(resp, "main_lcore", json_integer(app->main_lcore));
	json_object_set_new(resp, "paused", json_boolean(app->paused));
	json_object_set_new(resp, "ring_size",
			    json_integer(rte_ring_get_capacity(app->ring)));
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
table_add(struct embnic_ctl *c, struct embnic_table *t, json_t *req,
	  const char *idname, long long dflt_udp)
{
	struct embnic_peer p;
	int ret;

	if (get_peer(c, req, idname, dflt_udp, &p))
		return -1;
	ret = embnic_table_add(t, &p);
	if (ret == -ENOSPC)
		return ctl_fail(c, "%s table is full (%u entries)", idname,
				embnic_table_size(t));
	if (ret < 0)
		return ctl_fail(c, "cannot add %s %u: %s", idname, p.id,
				strerror(-ret));
	return 0;
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
	return table_add(c, c->app->routes, req, "shard", EMBNIC_UDP_PORT);
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
	return table_add(c, c->app->clients, req, "client", -1);
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

static json_t *
ring_json(const struct embnic_app *app, const struct embnic_totals *t)
{
	return json_pack("{s:I, s:I, s:I}",
		"size", (json_int_t)rte_ring_get_capacity(app->ring),
		"count", (json_int_t)rte_ring_count(app->ring),
		"high_water", (json_int_t)t->ring_high_water);
}

static json_t *
state_counts_json(const struct embnic_app *app, const struct embnic_totals *t,
		  const struct embnic_state_summary *s)
{
	json_t *o = json_pack("{s:I, s:I, s:I, s:I}",
		"entries", (json_int_t)s->entries,
		"capacity", (json_int_t)s->capacity,
		"overflow", (json_int_t)t->state_overflow,
		"expired", (json_int_t)t->state_expired);

	RTE_SET_USED(app);
	return o;
}

static int
cmd_counters(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	struct embnic_app *app = c->app;
	struct embnic_state_summary ss;
	struct embnic_totals t;
	json_t *ports = json_array(), *types = json_object();
	json_t *drops = json_object();
	unsigned int i, size, avail;

	embnic_counters_sum(app, &t);
	for (i = 0; i < app->nb_ports; i++)
		json_array_append_new(ports, json_pack(
			"{s:I, s:I, s:I, s:I, s:I}", "port", (json_int_t)i,
			"rx_frames", (json_int_t)t.rx_frames[i],
			"rx_bytes", (json_int_t)t.rx_bytes[i],
			"tx_frames", (json_int_t)t.tx_frames[i],
			"tx_bytes", (json_int_t)t.tx_bytes[i]));
	for (i = 1; i < EMBNIC_NB_TYPES; i++)
		json_object_set_new(types, embnic_type_name(i),
				    json_integer((json_int_t)t.types[i]));
	for (i = 1; i < EMBNIC_DROP_MAX; i++)
		json_object_set_new(drops, embnic_drop_name(i),
				    json_integer((json_int_t)t.drops[i]));
	size = app->pool->size;
	avail = rte_mempool_avail_count(app->pool);
	embnic_state_count(app->state, &ss);

	json_object_set_new(resp, "ports", ports);
	json_object_set_new(resp, "types", types);
	json_object_set_new(resp, "drops", drops);
	json_object_set_new(resp, "ring", ring_json(app, &t));
	json_object_set_new(resp, "mempool", json_pack("{s:I, s:I, s:I}",
		"size", (json_int_t)size, "available", (json_int_t)avail,
		"in_use", (json_int_t)(size - avail)));
	json_object_set_new(resp, "state", state_counts_json(app, &t, &ss));
	json_object_set_new(resp, "arp", json_pack("{s:I}", "replies",
		(json_int_t)t.arp_replies));
	return 0;
}

static int
cmd_state_summary(struct embnic_ctl *c, json_t *req __rte_unused,
		  json_t *resp)
{
	struct embnic_state_summary ss;
	struct embnic_totals t;
	json_t *by = json_object(), *counts;
	unsigned int i;

	embnic_counters_sum(c->app, &t);
	embnic_state_summarise(c->app->state, &ss);
	for (i = 1; i < EMBNIC_NB_STATES; i++)
		json_object_set_new(by, embnic_state_name(i),
				    json_integer(ss.by_state[i]));
	counts = state_counts_json(c->app, &t, &ss);
	json_object_update(resp, counts);
	json_decref(counts);
	json_object_set_new(resp, "by_state", by);
	return 0;
}

static int
cmd_state_dump(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	struct embnic_state_view *v;
	json_t *arr;
	long long limit = 0;
	unsigned int n, i;

	if (get_int(c, req, "limit", 0, c->app->opts.state_size,
		    CTL_DUMP_LIMIT, &limit))
		return -1;
	v = calloc(limit > 0 ? limit : 1, sizeof(*v));
	if (v == NULL)
		return ctl_fail(c, "out of memory");
	n = embnic_state_dump(c->app->state, v, (unsigned int)limit);
	arr = json_array();
	for (i = 0; i < n; i++)
		json_array_append_new(arr, json_pack(
			"{s:I, s:I, s:s, s:I, s:I, s:s?, s:I, s:I, s:I, s:I,"
			" s:I, s:I}",
			"client", (json_int_t)v[i].client_id,
			"msg_id", (json_int_t)v[i].msg_id,
			"state", embnic_state_name(v[i].state),
			"table", (json_int_t)v[i].table_id,
			"shard", (json_int_t)v[i].shard_id,
			"type", embnic_type_name(v[i].msg_type),
			"frames_in", (json_int_t)v[i].frames_in,
			"bytes_in", (json_int_t)v[i].bytes_in,
			"frames_out", (json_int_t)v[i].frames_out,
			"bytes_out", (json_int_t)v[i].bytes_out,
			"first_ns", (json_int_t)v[i].first_ns,
			"last_ns", (json_int_t)v[i].last_ns));
	free(v);
	json_object_set_new(resp, "entries", arr);
	return 0;
}

static int
cmd_ring_stats(struct embnic_ctl *c, json_t *req __rte_unused, json_t *resp)
{
	struct embnic_totals t;
	json_t *ring;

	embnic_counters_sum(c->app, &t);
	ring = ring_json(c->app, &t);
	json_object_update(resp, ring);
	json_decref(ring);
	return 0;
}

static int
cmd_reset_counters(struct embnic_ctl *c, json_t *req __rte_unused,
		   json_t *resp __rte_unused)
{
	embnic_counters_reset(c->app);
	return 0;
}

static int
cmd_pause(struct embnic_ctl *c, json_t *req __rte_unused,
	  json_t *resp __rte_unused)
{
	c->app->paused = true;
	return 0;
}

static int
cmd_resume(struct embnic_ctl *c, json_t *req __rte_unused,
	   json_t *resp __rte_unused)
{
	c->app->paused = false;
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

/* ---- connections ---- */

static void
conn_close(struct ctl_conn *k)
{
	if (k->fd >= 0)
		close(k->fd);
	free(k->in);
	free(k->out);
	memset(k, 0, sizeof(*k));
	k->fd = -1;
}

static int
conn_queue(struct ctl_conn *k, const char *s, size_t n)
{
	size_t need = k->out_len + n;
	char *p;

	if (need > CTL_MAX_OUT)
		return -1;
	if (need > k->out_cap) {
		size_t cap = k->out_cap ? k->out_cap : 4096;

		while (cap < need)
			cap *= 2;
		p = realloc(k->out, cap);
		if (p == NULL)
			return -1;
		k->out = p;
		k->out_cap = cap;
	}
	memcpy(k->out + k->out_len, s, n);
	k->out_len += n;
	return 0;
}

static int
conn_flush(struct ctl_conn *k)
{
	ssize_t w;

	while (k->out_off < k->out_len) {
		w = send(k->fd, k->out + k->out_off, k->out_len - k->out_off,
			 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		k->out_off += (size_t)w;
	}
	k->out_off = k->out_len = 0;
	return 0;
}

static int
conn_respond(struct embnic_ctl *c, struct ctl_conn *k, const char *line,
	     size_t len)
{
	json_t *resp = ctl_handle(c, line, len);
	char *s = json_dumps(resp, JSON_COMPACT);
	int ret = -1;

	json_decref(resp);
	if (s != NULL) {
		ret = conn_queue(k, s, strlen(s));
		if (ret == 0)
			ret = conn_queue(k, "\n", 1);
		free(s);
	}
	return ret;
}

static bool
blank(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
			return false;
	return true;
}

/* Read what is there and answer every complete line; -1 closes. */
static int
conn_read(struct embnic_ctl *c, struct ctl_conn *k)
{
	char *nl, *start;
	size_t rest;
	ssize_t r;

	for (;;) {
		r = recv(k->fd, k->in + k->in_len, CTL_MAX_LINE + 1 - k->in_len,
			 MSG_DONTWAIT);
		if (r == 0)
			return -1;
		if (r < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		k->in_len += (size_t)r;

		start = k->in;
		rest = k->in_len;
		while ((nl = memchr(start, '\n', rest)) != NULL) {
			size_t n = (size_t)(nl - start);

			if (!blank(start, n) && conn_respond(c, k, start, n))
				return -1;
			rest -= n + 1;
			start = nl + 1;
		}
		memmove(k->in, start, rest);
		k->in_len = rest;
		if (k->in_len > CTL_MAX_LINE) {
			const char *msg = "{\"ok\":false,\"error\":\"request "
				"line longer than 65536 bytes\"}\n";

			conn_queue(k, msg, strlen(msg));
			conn_flush(k);
			return -1;
		}
		if (conn_flush(k))
			return -1;
	}
}

static void
ctl_accept(struct embnic_ctl *c)
{
	unsigned int i;
	int fd;

	while ((fd = accept4(c->lfd, NULL, NULL,
			     SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		for (i = 0; i < CTL_MAX_CONNS; i++)
			if (c->conns[i].fd < 0)
				break;
		if (i == CTL_MAX_CONNS) {
			close(fd);	/* too many clients */
			continue;
		}
		c->conns[i].fd = fd;
		c->conns[i].in = malloc(CTL_MAX_LINE + 1);
		if (c->conns[i].in == NULL)
			conn_close(&c->conns[i]);
	}
}

void
embnic_ctl_poll(struct embnic_ctl *c, int timeout_ms)
{
	struct pollfd pfd[1 + CTL_MAX_CONNS];
	int map[1 + CTL_MAX_CONNS];
	unsigned int i, n = 1;

	pfd[0].fd = c->lfd;
	pfd[0].events = POLLIN;
	for (i = 0; i < CTL_MAX_CONNS; i++) {
		struct ctl_conn *k = &c->conns[i];

		if (k->fd < 0)
			continue;
		pfd[n].fd = k->fd;
		pfd[n].events = POLLIN |
			(k->out_len > k->out_off ? POLLOUT : 0);
		map[n++] = (int)i;
	}
	if (poll(pfd, n, timeout_ms) <= 0)
		return;
	for (i = 1; i < n; i++) {
		struct ctl_conn *k = &c->conns[map[i]];

		if ((pfd[i].revents & POLLOUT) && conn_flush(k)) {
			conn_close(k);
			continue;
		}
		if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
		    conn_read(c, k))
			conn_close(k);
	}
	if (pfd[0].revents & POLLIN)
		ctl_accept(c);
}

/* Is someone serving path already? */
static bool
path_in_use(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	bool used;
	int fd;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	strcpy(sa.sun_path, path);
	used = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return used;
}

struct embnic_ctl *
embnic_ctl_init(struct embnic_app *app, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct embnic_ctl *c;
	char dir[sizeof(sa.sun_path)];
	struct stat stt;
	char *slash;
	mode_t old;
	unsigned int i;
	int err;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	/* create the parent directory if it is missing (one level) */
	strcpy(dir, path);
	slash = strrchr(dir, '/');
	if (slash != NULL && slash != dir) {
		*slash = '\0';
		if (mkdir(dir, 0755) != 0 && errno != EEXIST)
			return NULL;
	}
	if (lstat(path, &stt) == 0) {
		if (!S_ISSOCK(stt.st_mode)) {
			errno = EEXIST;
			return NULL;
		}
		if (path_in_use(path)) {
			errno = EADDRINUSE;
			return NULL;
		}
		unlink(path);	/* stale socket of a dead card */
	}

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->app = app;
	for (i = 0; i < CTL_MAX_CONNS; i++)
		c->conns[i].fd = -1;
	snprintf(c->path, sizeof(c->path), "%s", path);
	strcpy(sa.sun_path, path);

	c->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->lfd < 0)
		goto fail;
	old = umask(0177);	/* the socket is born 0600 */
	err = bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (err != 0 || chmod(path, 0600) != 0 || listen(c->lfd, 16) != 0)
		goto fail;
	return c;
fail:
	err = errno;
	if (c->lfd >= 0)
		close(c->lfd);
	free(c);
	errno = err;
	return NULL;
}

void
embnic_ctl_free(struct embnic_ctl *c)
{
	unsigned int i;

	if (c == NULL)
		return;
	for (i = 0; i < CTL_MAX_CONNS; i++)
		if (c->conns[i].fd >= 0)
			conn_close(&c->conns[i]);
	close(c->lfd);
	unlink(c->path);
	free(c);
}
