/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket's commands (docs/control-socket.md): a request
 * parsed, its command looked up in the table, the answer written (JSON,
 * jansson); the connections: conn.c. The commands read the card in place
 * on the main lcore: no lock, no stage waits.
 *
 * A command reads its fields from req, sets its answer's fields in resp and
 * returns 0, or -1 with the error message set by ctl_refuse() (the request
 * is wrong: a missing or malformed field, a value out of range, an absent
 * entry; the answer's "kind" is "argument") or ctl_fail() (a well-formed
 * request the card could not carry out: a full table, no memory; "kind"
 * "failure"). Either way the request changed nothing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include <rte_byteorder.h>
#include <rte_common.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
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
	char err[256];		/* the failed request's message */
	const char *err_kind;	/* its kind: "argument" or "failure" */
};

/* ---- request fields ---- */

#define ctl_fail(c, ...) ctl_error((c), "failure", __VA_ARGS__)
#define ctl_refuse(c, ...) ctl_error((c), "argument", __VA_ARGS__)

/* Set the request's error message (printf format) and kind; returns -1. */
static int __attribute__((format(printf, 3, 4)))
ctl_error(struct embnic_ctl *c, const char *kind, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	c->err_kind = kind;
	return -1;
}

/*
 * The integer field name of req in [lo, hi] into *out; absent: *out = dflt
 * if dflt >= 0, else an error. 0, or -1 with the error set.
 */
static int
ctl_get_int(struct embnic_ctl *c, json_t *req, const char *name,
	    long long lo, long long hi, long long dflt, long long *out)
{
	json_t *v = json_object_get(req, name);

	if (v == NULL) {
		if (dflt >= 0) {
			*out = dflt;
			return 0;
		}
		return ctl_refuse(c, "missing field '%s'", name);
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo ||
	    json_integer_value(v) > hi)
		return ctl_refuse(c, "field '%s' must be an integer %lld..%lld",
				name, lo, hi);
	*out = json_integer_value(v);
	return 0;
}

/* The string field name of req (owned by req), or NULL with the error set. */
static const char *
ctl_get_str(struct embnic_ctl *c, json_t *req, const char *name)
{
	json_t *v = json_object_get(req, name);

	if (v == NULL || !json_is_string(v)) {
		ctl_refuse(c, "field '%s' must be a string", name);
		return NULL;
	}
	return json_string_value(v);
}

/* A "AA:BB:CC:DD:EE:FF" string (new reference). */
#define ctl_mac_json(mac) json_sprintf(RTE_ETHER_ADDR_PRT_FMT, RTE_ETHER_ADDR_BYTES(mac))

/* A dotted-quad string of a network-order IPv4 address (new reference). */
static json_t *
ctl_ip_json(uint32_t ip_be)
{
	char buf[INET_ADDRSTRLEN];
	struct in_addr a = { .s_addr = ip_be };

	inet_ntop(AF_INET, &a, buf, sizeof(buf));
	return json_string(buf);
}

/*
 * A peer from req's {<idname>, port, mac, ip, udp_port} (udp_port defaults
 * to dflt_udp if >= 0); 0, or -1 with the error set.
 */
static int
ctl_get_peer(struct embnic_ctl *c, json_t *req, const char *idname,
	     long long dflt_udp, struct embnic_peer *p)
{
	long long id = 0, port = 0, udp = 0;
	const char *mac, *ip;
	struct in_addr a;

	memset(p, 0, sizeof(*p));
	if (ctl_get_int(c, req, idname, 0, UINT16_MAX, -1, &id) ||
	    ctl_get_int(c, req, "port", 0, c->app->nb_ports - 1, -1, &port) ||
	    ctl_get_int(c, req, "udp_port", 1, UINT16_MAX, dflt_udp, &udp))
		return -1;
	mac = ctl_get_str(c, req, "mac");
	if (mac == NULL)
		return -1;
	if (rte_ether_unformat_addr(mac, &p->mac) != 0)
		return ctl_refuse(c, "field 'mac' is not a MAC address: '%s'",
				mac);
	ip = ctl_get_str(c, req, "ip");
	if (ip == NULL)
		return -1;
	if (inet_pton(AF_INET, ip, &a) != 1)
		return ctl_refuse(c, "field 'ip' is not an IPv4 address: '%s'",
				ip);
	p->id = (uint32_t)id;
	p->port = (uint16_t)port;
	p->udp_port = rte_cpu_to_be_16((uint16_t)udp);
	p->ip = a.s_addr;
	return 0;
}

/* {<idname>, port, mac, ip, udp_port} of p (new reference). */
static json_t *
ctl_peer_json(const struct embnic_peer *p, const char *idname)
{
	return json_pack("{s:I, s:I, s:o, s:o, s:I}", idname, (json_int_t)p->id,
			 "port", (json_int_t)p->port,
			 "mac", ctl_mac_json(&p->mac),
			 "ip", ctl_ip_json(p->ip),
			 "udp_port", (json_int_t)rte_be_to_cpu_16(p->udp_port));
}

/* ---- the JSON writer of struct embnic_emit: records and lists in resp ---- */

struct ctl_json_emit {
	json_t *top, *cur;
};

static void
json_record(void *ctx, const char *name)
{
	struct ctl_json_emit *w = ctx;

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
	struct ctl_json_emit *w = ctx;
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
	struct ctl_json_emit *w = ctx;

	json_object_set_new(w->cur, key, json_integer((json_int_t)v));
}

static void
json_list(void *ctx, const char *key, const uint64_t *v, unsigned int n)
{
	struct ctl_json_emit *w = ctx;
	json_t *arr = json_array();
	unsigned int i;

	for (i = 0; i < n; i++)
		json_array_append_new(arr, json_integer((json_int_t)v[i]));
	json_object_set_new(w->cur, key, arr);
}

static struct embnic_emit
ctl_json_emitter(json_t *resp, struct ctl_json_emit *w)
{
	w->top = w->cur = resp;
	return (struct embnic_emit){ .record = json_record, .item = json_item,
				     .u64 = json_u64, .list = json_list,
				     .ctx = w };
}


/* ---- the header logs (embnic_hlog), as ring_last reads them ---- */

struct hlog_item {
	struct embnic_hlog_entry e;
	uint64_t seq;			/* index in its log */
	unsigned int lcore;		/* its lcore (ring logs: its ring) */
};

/* Newest first: later TSC, then (same burst) later in the log. */
static int
hlog_cmp(const void *a, const void *b)
{
	const struct hlog_item *x = a, *y = b;

	if (x->e.tsc != y->e.tsc)
		return x->e.tsc < y->e.tsc ? 1 : -1;
	if (x->seq != y->seq)
		return x->seq < y->seq ? 1 : -1;
	return x->lcore < y->lcore ? -1 : x->lcore > y->lcore;
}

/*
 * Snapshot of nl logs (logs[j], tagged tag[j], entries with seq <
 * min_seq[j] left out) into a malloc'ed array, newest first; *n_out gets
 * its length, head[j] the entries ever written to logs[j]. NULL when out
 * of memory. Of each log the entries are copied, then those kept that no
 * write can have touched meanwhile: with head h2 after the copy, the
 * writer may be storing entry h2, in entry h2 - SIZE's slot. Never blocks
 * the lcores.
 */
static struct hlog_item *
hlog_collect(const struct embnic_hlog *const *logs, const unsigned int *tag,
	     const uint64_t *min_seq, unsigned int nl, unsigned int *n_out,
	     uint64_t *head)
{
	struct hlog_item *it;
	unsigned int j, n = 0, k, m;
	uint64_t h1, i;

	*n_out = 0;
	for (j = 0; j < nl; j++)
		head[j] = 0;
	it = malloc(sizeof(*it) * EMBNIC_HLOG_SIZE * nl);
	if (it == NULL)
		return NULL;
	for (j = 0; j < nl; j++) {
		const struct embnic_hlog *l = logs[j];

		h1 = __atomic_load_n(&l->head, __ATOMIC_ACQUIRE);
		m = n;
		for (i = h1 > EMBNIC_HLOG_SIZE ? h1 - EMBNIC_HLOG_SIZE : 0; i < h1; i++)
			it[m++] = (struct hlog_item){
				.e = l->e[i & (EMBNIC_HLOG_SIZE - 1)],
				.seq = i, .lcore = tag[j] };
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		head[j] = __atomic_load_n(&l->head, __ATOMIC_RELAXED);
		for (k = n; k < m; k++)
			if (it[k].seq + EMBNIC_HLOG_SIZE > head[j] &&
			    it[k].seq >= min_seq[j])
				it[n++] = it[k];
	}
	qsort(it, n, sizeof(*it), hlog_cmp);
	*n_out = n;
	return it;
}

/* Unix time in ns from a TSC value. */
static uint64_t
tsc_to_ns(const struct embnic_app *app, uint64_t tsc)
{
	return app->start_ns +
		(uint64_t)((double)(tsc - app->start_tsc) * 1e9 /
			   (double)app->tsc_hz);
}

/* One header log entry as JSON; lcore < 0 and no egress port for the ring. */
static json_t *
hlog_entry_json(const struct embnic_app *app,
		const struct embnic_hlog_entry *e, int lcore)
{
	json_t *o = json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
		" s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		"msg_type", (json_int_t)e->msg.msg_type,
		"flags", (json_int_t)e->msg.flags,
		"msg_id", (json_int_t)e->msg.msg_id,
		"client_id", (json_int_t)e->msg.client_id,
		"shard_id", (json_int_t)e->msg.shard_id,
		"num_tables", (json_int_t)e->msg.num_tables,
		"table_id", (json_int_t)e->msg.table_id,
		"num_keys", (json_int_t)e->msg.num_keys,
		"value_len", (json_int_t)e->msg.value_len,
		"msg_len", (json_int_t)e->msg.msg_len,
		"frag_index", (json_int_t)e->msg.frag_index,
		"frag_count", (json_int_t)e->msg.frag_count,
		"frag_len", (json_int_t)e->msg.frag_len,
		"status", (json_int_t)e->msg.status,
		"ingress_port", (json_int_t)e->in_port,
		"time_us", (json_int_t)(tsc_to_ns(app, e->tsc) / 1000),
		"time_ns", (json_int_t)tsc_to_ns(app, e->tsc));

	if (o != NULL && lcore >= 0) {
		json_object_set_new(o, "egress_port",
				    json_integer(e->out_port));
		json_object_set_new(o, "lcore", json_integer(lcore));
	}
	return o;
}

/*
 * ring_last {last}: the headers of up to `last` message frames still
 * waiting in the header rings, newest first (from the RX stage's ring logs:
 * a ring itself holds mbuf pointers that its state lcore dequeues and frees
 * while this thread would read them; ARP frames left out), with how many
 * frames the rings held (ARP included, may exceed what the logs keep); and
 * those of the last `last` message frames the card forwarded, newest first
 * (every lcore's header log merged by time), with how full the rings are.
 */
static int
cmd_ring_last(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	static const uint64_t zero[RTE_MAX_LCORE];
	const struct embnic_app *app = c->app;
	const struct embnic_hlog *logs[RTE_MAX_LCORE];
	unsigned int tag[RTE_MAX_LCORE], nl = 0, n, i, k, got, size, count;
	uint64_t dequeued[EMBNIC_MAX_STATE_LCORES], head[RTE_MAX_LCORE];
	uint64_t waiting = 0, logged = 0;
	struct hlog_item *it;
	long long last = 0;
	json_t *arr;

	if (ctl_get_int(c, req, "last", 1, EMBNIC_HLOG_KEEP, 20, &last))
		return -1;
	/* dequeued first: an entry past it was still in its ring then */
	for (k = 0; k < app->nb_workers; k++) {
		dequeued[k] = __atomic_load_n(&app->w[k].ring_dequeued,
					      __ATOMIC_ACQUIRE);
		logs[k] = &app->w[k].rxlog;
		tag[k] = k;
	}
	it = hlog_collect(logs, tag, dequeued, app->nb_workers, &n, head);
	for (k = 0; k < app->nb_workers; k++)
		if (head[k] > dequeued[k])
			waiting += head[k] - dequeued[k];
	arr = json_array();
	for (i = 0, got = 0; i < n && got < last; i++) {
		if (it[i].e.msg.msg_type == 0)
			continue;	/* an ARP frame: not listed */
		json_array_append_new(arr, hlog_entry_json(app, &it[i].e, -1));
		got++;
	}
	free(it);
	json_object_set_new(resp, "in_ring", arr);
	json_object_set_new(resp, "in_ring_count",
			    json_integer((json_int_t)waiting));
	/* an lcore that starts logging after this is left out */
	for (k = 0; k < RTE_MAX_LCORE; k++)
		if (__atomic_load_n(&app->stats[k].hlog.head,
				    __ATOMIC_RELAXED) > 0) {
			logs[nl] = &app->stats[k].hlog;
			tag[nl++] = k;
		}
	it = hlog_collect(logs, tag, zero, nl, &n, head);
	for (k = 0; k < nl; k++)
		logged += head[k];
	arr = json_array();
	for (i = 0; i < n && i < last; i++)
		json_array_append_new(arr, hlog_entry_json(app, &it[i].e,
							   (int)it[i].lcore));
	free(it);
	json_object_set_new(resp, "entries", arr);
	json_object_set_new(resp, "log_size", json_integer(EMBNIC_HLOG_KEEP));
	json_object_set_new(resp, "logged", json_integer((json_int_t)logged));
	embnic_ring_use(app, &size, &count);
	json_object_set_new(resp, "ring_size", json_integer(size));
	json_object_set_new(resp, "ring_count", json_integer(count));
	return 0;
}

/* state_dump {limit}: up to limit live entries of every partition. */
static int
cmd_state_dump(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	struct embnic_state_view *v;
	json_t *arr;
	long long limit = 0;
	unsigned int n = 0, i, k, got;

	if (ctl_get_int(c, req, "limit", 0, c->app->opts.state_size,
		    CTL_DUMP_LIMIT, &limit))
		return -1;
	v = calloc(limit > 0 ? limit : 1, sizeof(*v));
	if (v == NULL)
		return ctl_fail(c, "out of memory");
	arr = json_array();
	/* every partition, read in place: no lock, no state lcore waits */
	for (k = 0; k < c->app->nb_workers && n < limit; k++, n += got) {
		got = embnic_state_dump(c->app->w[k].state, v,
					(unsigned int)limit - n);
		for (i = 0; i < got; i++)
			json_array_append_new(arr, json_pack(
				"{s:I, s:I, s:s, s:I, s:s?, s:s?, s:I, s:I, s:I, s:I,"
				" s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
				" s:I}",
				"client", (json_int_t)v[i].client_id,
				"msg_id", (json_int_t)v[i].msg_id,
				"state", embnic_state_name(v[i].state),
				"shard", (json_int_t)v[i].shard_id,
				"type", embnic_type_name(v[i].msg_type),
				"reply_type", embnic_type_name(v[i].rep_type),
				"num_tables", (json_int_t)v[i].num_tables,
				"num_keys", (json_int_t)v[i].num_keys,
				"value_len", (json_int_t)v[i].value_len,
				"msg_len", (json_int_t)v[i].msg_len,
				"frag_count", (json_int_t)v[i].frag_count,
				"frags_in", (json_int_t)v[i].frags_in,
				"frames_in", (json_int_t)v[i].frames_in,
				"bytes_in", (json_int_t)v[i].bytes_in,
				"reply_frag_count", (json_int_t)v[i].rep_frag_count,
				"frags_out", (json_int_t)v[i].frags_out,
				"frames_out", (json_int_t)v[i].frames_out,
				"bytes_out", (json_int_t)v[i].bytes_out,
				"first_ns", (json_int_t)tsc_to_ns(c->app,
								v[i].first_tsc),
				"last_ns", (json_int_t)tsc_to_ns(c->app,
								v[i].last_tsc),
				"partition", (json_int_t)k));
	}
	free(v);
	json_object_set_new(resp, "entries", arr);
	return 0;
}

/* ---- route_* and client_* on the tables of route.c ---- */

/* The route table (shard id -> peer) and the client table (client id -> peer). */
struct ctl_table {
	const char *id, *list;	/* its id field, its list's name */
	long long dflt_udp;	/* udp_port when absent (-1: required) */
};
static const struct ctl_table ctl_routes = { "shard", "routes", EMBNIC_UDP_PORT };
static const struct ctl_table ctl_clients = { "client", "clients", -1 };

enum ctl_table_op { TABLE_ADD, TABLE_DEL, TABLE_LIST };

/*
 * <table>_add {<id>, port, mac, ip, udp_port}, <table>_del {<id>},
 * <table>_list on the table tt names. A refused request leaves its table,
 * and the shard statistics slots, as they were.
 */
static int
table_cmd(struct embnic_ctl *c, const struct ctl_table *tt, enum ctl_table_op op,
	  json_t *req, json_t *resp)
{
	struct embnic_table *t = tt == &ctl_routes ? c->app->routes :
		c->app->clients;
	const struct embnic_peer *found = NULL;
	struct embnic_peer p, *v;
	long long id = 0;
	unsigned int i, n;
	json_t *arr;
	int ret = -ENOSPC;

	if (op == TABLE_DEL) {
		if (ctl_get_int(c, req, tt->id, 0, UINT16_MAX, -1, &id))
			return -1;
		if (embnic_table_del(t, (uint32_t)id) < 0)
			return ctl_refuse(c, "no %s %lld", tt->id, id);
		return 0;
	}
	if (op == TABLE_LIST) {
		v = calloc(embnic_table_size(t), sizeof(*v));
		if (v == NULL)
			return ctl_fail(c, "out of memory");
		arr = json_array();
		n = embnic_table_copy(t, v, embnic_table_size(t));
		for (i = 0; i < n; i++)
			json_array_append_new(arr, ctl_peer_json(&v[i], tt->id));
		free(v);
		json_object_set_new(resp, tt->list, arr);
		return 0;
	}
	if (ctl_get_peer(c, req, tt->id, tt->dflt_udp, &p))
		return -1;
	if (embnic_table_count(t) >= embnic_table_size(t))	/* full: only a known id */
		embnic_table_lookup_bulk(t, &p.id, 1, &found);
	else
		found = &p;
	if (found != NULL) {
		/*
		 * A shard's statistics slot exists before its first frame
		 * passes; a refused request (no room) assigns none.
		 */
		if (t == c->app->routes)
			embnic_shard_slot_assign(c->app, p.id);
		ret = embnic_table_add(t, &p);
	}
	if (ret == -ENOSPC)
		return ctl_fail(c, "%s table is full (%u entries)", tt->id,
				embnic_table_size(t));
	if (ret < 0)
		return ctl_fail(c, "cannot add %s %u: %s", tt->id, p.id,
				strerror(-ret));
	return 0;
}

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
	json_t *ports = json_array(), *state_lcores = json_array();
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
	for (k = 0; k < app->nb_workers; k++)
		json_array_append_new(state_lcores,
				      json_integer(app->w[k].lcore));
	json_object_update_new(resp, json_pack(
		"{s:o, s:o, s:I, s:s, s:I, s:I, s:I, s:o, s:I, s:b, s:b, s:I,"
		" s:I, s:I, s:I, s:s, s:I}",
		"build", buildinfo_json(), "ports", ports,
		"lcores", (json_int_t)app->nb_lcores,
		"mode", app->nb_workers > 1 ? "partitioned" :
		app->rx_lcore == app->tx_lcore ? "run_to_completion" :
		"pipeline",
		"rx_lcore", (json_int_t)app->rx_lcore,
		"tx_lcore", (json_int_t)app->tx_lcore,
		"state_lcores", (json_int_t)app->nb_workers,
		"state_lcore_ids", state_lcores,
		"main_lcore", (json_int_t)app->main_lcore,
		"paused", (int)app->paused, "tx_paused", (int)app->tx_paused,
		"ring_size",
		(json_int_t)rte_ring_get_capacity(app->w[0].ring),
		"state_size", (json_int_t)app->opts.state_size,
		"state_timeout_ms", (json_int_t)app->opts.state_timeout_ms,
		"burst", (json_int_t)app->opts.burst,
		"mempool_ops", rte_mempool_get_ops(app->pool->ops_index)->name,
		"pid", (json_int_t)getpid()));
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
 * pause {stage}: "rx" (default) stops the RX stage polling the ports;
 * "tx" stops the TX stage taking frames off the header ring, so accepted
 * frames wait there (ring_last lists them; a full ring drops as ring_full).
 * resume {stage}: that stage runs again; without stage, both do.
 */
static int
cmd_pause_resume(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	bool pause = strcmp(json_string_value(json_object_get(req, "cmd")),
			    "pause") == 0;
	json_t *v = json_object_get(req, "stage");
	const char *stage = json_string_value(v);
	bool rx = v == NULL || (stage != NULL && strcmp(stage, "rx") == 0);
	bool tx = (v == NULL && !pause) ||
		(stage != NULL && strcmp(stage, "tx") == 0);

	if (!rx && !tx)
		return ctl_refuse(c, "field 'stage' must be \"rx\" or \"tx\"");
	if (rx)
		c->app->paused = pause;
	if (tx)
		c->app->tx_paused = pause;
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
	int (*fn)(struct embnic_ctl *c, json_t *req, json_t *resp);
	/* or: the answer is this walk of counters.c's, written as JSON */
	enum embnic_walk walk;
	/* or: table_cmd's op on this table */
	const struct ctl_table *table;
	enum ctl_table_op op;
} ctl_cmds[] = {
	{ "ping", .fn = cmd_ping },
	{ "info", .fn = cmd_info },
	{ "route_add", .table = &ctl_routes, .op = TABLE_ADD },
	{ "route_del", .table = &ctl_routes, .op = TABLE_DEL },
	{ "route_list", .table = &ctl_routes, .op = TABLE_LIST },
	{ "client_add", .table = &ctl_clients, .op = TABLE_ADD },
	{ "client_del", .table = &ctl_clients, .op = TABLE_DEL },
	{ "client_list", .table = &ctl_clients, .op = TABLE_LIST },
	{ "state_dump", .fn = cmd_state_dump },
	{ "ring_last", .fn = cmd_ring_last },
	{ "counters", .walk = EMBNIC_WALK_COUNTERS },
	{ "state_summary", .walk = EMBNIC_WALK_STATE },
	{ "ring_stats", .walk = EMBNIC_WALK_RING },
	{ "reset_counters", .fn = cmd_reset_counters },
	{ "pause", .fn = cmd_pause_resume },
	{ "resume", .fn = cmd_pause_resume },
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
	if (ctl_cmds[i].walk != 0) {
		struct ctl_json_emit w;
		struct embnic_emit e = ctl_json_emitter(resp, &w);

		embnic_counters_emit(c->app, ctl_cmds[i].walk, &e);
		ret = 0;
	} else if (ctl_cmds[i].table != NULL) {
		ret = table_cmd(c, ctl_cmds[i].table, ctl_cmds[i].op, req, resp);
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
