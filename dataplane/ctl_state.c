/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket's commands on the state map (state_dump) and the
 * header rings and logs (ring_last); counters, state_summary and
 * ring_stats are counters.c's walks (ctl.c's table). They read in place
 * on the main lcore: no lock, no stage waits.
 */
#include <stdlib.h>

#include <jansson.h>

#include <rte_common.h>

#include "embnic_ctl.h"

#define CTL_DUMP_LIMIT	1000		/* default state_dump limit */

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
int
ctl_cmd_ring_last(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	struct embnic_hlog_entry *e;
	unsigned int lc[EMBNIC_HLOG_SIZE];
	long long last = 0;
	uint64_t logged, waiting;
	json_t *arr;
	unsigned int n, i, size, count;

	if (ctl_get_int(c, req, "last", 1, EMBNIC_HLOG_KEEP, 20, &last))
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
	embnic_ring_use(c->app, &size, &count);
	json_object_set_new(resp, "ring_size", json_integer(size));
	json_object_set_new(resp, "ring_count", json_integer(count));
	return 0;
}

int
ctl_cmd_state_dump(struct embnic_ctl *c, json_t *req, json_t *resp)
{
	struct embnic_state_view *v;
	unsigned int *part;
	json_t *arr;
	long long limit = 0;
	unsigned int n = 0, i, k, got;

	if (ctl_get_int(c, req, "limit", 0, c->app->opts.state_size,
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
