/* SPDX-License-Identifier: Apache-2.0
 *
 * Counters: each lcore (and state map partition) writes only its own; the
 * control path sums them. A reset records the current sums as a base that
 * later reads subtract, so no increment is lost to a race (the ring
 * high-water mark, a gauge, is zeroed). They are written in one place
 * (embnic_counters_emit) through a writer: JSON for the control socket,
 * DPDK telemetry here.
 */
#include <errno.h>
#include <string.h>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_telemetry.h>

#include "embnic_dp.h"

static const char *const type_names[EMBNIC_NB_TYPES] = {
	[EMBNIC_LOOKUP_REQ] = "LOOKUP_REQ",
	[EMBNIC_LOOKUP_REPLY] = "LOOKUP_REPLY",
	[EMBNIC_UPDATE_REQ] = "UPDATE_REQ",
	[EMBNIC_UPDATE_ACK] = "UPDATE_ACK",
	[EMBNIC_ERROR] = "ERROR",
	[EMBNIC_SIZE_REQ] = "SIZE_REQ",
	[EMBNIC_SIZE_ACK] = "SIZE_ACK",
	[EMBNIC_UPDATE_NACK] = "UPDATE_NACK",
};

const char *
embnic_type_name(unsigned int t)
{
	return t > 0 && t < EMBNIC_NB_TYPES ? type_names[t] : NULL;
}

const char *
embnic_frame_limit_name(unsigned int l)
{
	static const char *const names[] = {
		[EMBNIC_LIMIT_PMD] = "pmd",
		[EMBNIC_LIMIT_FRAMESZ] = "framesz",
		[EMBNIC_LIMIT_IF_MTU] = "interface_mtu",
	};

	return l < RTE_DIM(names) ? names[l] : "unknown";
}

/* The counters of an lcore as one array (EMBNIC_COUNTER_FIELDS). */
#define NB_COUNTERS \
	(offsetof(struct embnic_lcore_stats, ring_high_water) / sizeof(uint64_t))
static_assert(offsetof(struct embnic_lcore_stats, ring_high_water) ==
	      offsetof(struct embnic_totals, ring_high_water),
	      "lcore counters and totals share their layout");

/* dst[i] += src[i] (sign 1) or -= (sign -1) for n u64 words. */
static void
add_words(void *dst, const void *src, size_t n, int sign)
{
	uint64_t *d = dst;
	const uint64_t *v = src;
	size_t i;

	for (i = 0; i < n; i++)
		d[i] += sign > 0 ? v[i] : -v[i];
}

/* The raw sums, no base subtracted. */
static void
raw_sum(const struct embnic_app *app, struct embnic_totals *t)
{
	struct rte_eth_stats es;
	unsigned int lc, i;

	memset(t, 0, sizeof(*t));
	for (lc = 0; lc < RTE_MAX_LCORE; lc++) {
		const struct embnic_lcore_stats *s = &app->stats[lc];

		add_words(t, s, NB_COUNTERS, 1);
		if (s->ring_high_water > t->ring_high_water)
			t->ring_high_water = s->ring_high_water;
	}
	for (i = 0; i < app->nb_ports; i++)
		if (rte_eth_stats_get(i, &es) == 0)
			t->rx_nombuf[i] = es.rx_nombuf;
}

/* The counters summed over the lcores, less the reset base. */
static void
counters_sum(const struct embnic_app *app, struct embnic_totals *t)
{
	unsigned int i, p;

	raw_sum(app, t);
	/* the base's ring_high_water is 0 (a gauge: reset zeroes it) */
	add_words(t, &app->base, sizeof(*t) / sizeof(uint64_t), -1);
	for (p = 0; p < EMBNIC_MAX_PORTS; p++) {
		t->drops[p][EMBNIC_DROP_NO_MBUF] += t->rx_nombuf[p];
		for (i = 0; i < EMBNIC_DROP_MAX; i++)
			t->drop_sum[i] += t->drops[p][i];
	}
}

/* The raw statistics of slot summed over the partitions (no base). */
static void
shard_raw(const struct embnic_app *app, unsigned int slot,
	  struct embnic_shard_stats *out)
{
	unsigned int k;

	memset(out, 0, sizeof(*out));
	for (k = 0; k < app->nb_workers; k++)
		add_words(out, &embnic_state_shard_stats(app->w[k].state)[slot],
			  sizeof(*out) / sizeof(uint64_t), 1);
}

void
embnic_ring_use(const struct embnic_app *app, unsigned int *size,
		unsigned int *count)
{
	unsigned int k;

	*size = *count = 0;
	for (k = 0; k < app->nb_workers; k++) {
		*size += rte_ring_get_capacity(app->w[k].ring);
		*count += rte_ring_count(app->w[k].ring);
	}
}

/* The statistics of slot (since the last reset) into out. */
static void
shard_stats_sum(const struct embnic_app *app, unsigned int slot,
		struct embnic_shard_stats *out)
{
	shard_raw(app, slot, out);
	add_words(out, &app->shard_base[slot], sizeof(*out) / sizeof(uint64_t),
		  -1);
}

uint16_t
embnic_shard_slot_assign(struct embnic_app *app, uint32_t id)
{
	uint16_t slot = app->shard_slot[id];

	if (slot != 0 || app->nb_slots >= EMBNIC_SHARD_SLOTS)
		return slot;
	slot = (uint16_t)app->nb_slots++;
	app->slot_shard[slot] = id;
	__atomic_store_n(&app->shard_slot[id], slot, __ATOMIC_RELEASE);
	return slot;
}

void
embnic_counters_reset(struct embnic_app *app)
{
	unsigned int lc, k;

	raw_sum(app, &app->base);
	app->base.ring_high_water = 0;
	for (k = 0; k < app->nb_slots; k++)
		shard_raw(app, k, &app->shard_base[k]);
	for (lc = 0; lc < RTE_MAX_LCORE; lc++)
		__atomic_store_n(&app->stats[lc].ring_high_water, 0,
				 __ATOMIC_RELAXED);
}

/* One partition of the map in list "by_partition" (its completed and
 * expired counts since the card started: reset_counters keeps them). */
static void
partition_emit(const struct embnic_app *app, unsigned int k,
	       const struct embnic_emit *e)
{
	const struct embnic_shard_stats *ss =
		embnic_state_shard_stats(app->w[k].state);
	struct embnic_state_summary sum;
	uint64_t done = 0, expired = 0;
	unsigned int slot, i;

	embnic_state_summarise(app->w[k].state, false, &sum);
	for (slot = 0; slot < app->nb_slots; slot++) {
		for (i = 0; i < EMBNIC_NB_TYPES; i++)
			done += ss[slot].completed[i];
		expired += ss[slot].expired;
	}
	e->item(e->ctx, "by_partition", "partition", k);
	e->u64(e->ctx, "partition", k);
	e->u64(e->ctx, "lcore", app->w[k].lcore);
	e->u64(e->ctx, "entries", sum.entries);
	e->u64(e->ctx, "capacity", sum.capacity);
	e->u64(e->ctx, "completed_since_start", done);
	e->u64(e->ctx, "expired_since_start", expired);
}

/* The state map summary into the current record; with by_state (a scan
 * of the map; top level only) also records by_state and by_partition. */
static void
state_emit(const struct embnic_app *app, const struct embnic_totals *t,
	   bool by_state, const struct embnic_emit *e)
{
	struct embnic_state_summary s, p;
	unsigned int i, k;

	memset(&s, 0, sizeof(s));
	for (k = 0; k < app->nb_workers; k++) {
		embnic_state_summarise(app->w[k].state, by_state, &p);
		s.entries += p.entries;
		s.capacity += p.capacity;
		for (i = 0; i < EMBNIC_NB_STATES; i++)
			s.by_state[i] += p.by_state[i];
	}
	e->u64(e->ctx, "entries", s.entries);
	e->u64(e->ctx, "partitions", app->nb_workers);
	e->u64(e->ctx, "capacity", s.capacity);
	e->u64(e->ctx, "overflow", t->state_overflow);
	e->u64(e->ctx, "expired", t->state_expired);
	if (!by_state)
		return;
	e->record(e->ctx, "by_state");
	for (i = 1; i < EMBNIC_NB_STATES; i++)
		e->u64(e->ctx, embnic_state_name(i), s.by_state[i]);
	e->record(e->ctx, NULL);
	for (k = 0; k < app->nb_workers; k++)
		partition_emit(app, k, e);
	e->record(e->ctx, NULL);
}

static void
ring_emit(const struct embnic_app *app, const struct embnic_totals *t,
	  const struct embnic_emit *e)
{
	unsigned int size, count;

	embnic_ring_use(app, &size, &count);
	e->u64(e->ctx, "size", size);
	e->u64(e->ctx, "count", count);
	e->u64(e->ctx, "high_water", t->ring_high_water);
	e->u64(e->ctx, "rings", app->nb_workers);
}

/*
 * Per shard: messages completed by reply type, expired, latency sum and
 * histogram. Slot 0 (shards past the table's size) only when it counted.
 */
static void
shards_emit(const struct embnic_app *app, const struct embnic_emit *e)
{
	struct embnic_shard_stats ss;
	unsigned int k, i, n = 0;
	uint64_t any;

	for (k = 0; k < app->nb_slots; k++) {
		shard_stats_sum(app, k, &ss);
		any = ss.expired;
		for (i = 0; i < EMBNIC_NB_TYPES; i++)
			any |= ss.completed[i];
		if (k == 0 && any == 0)
			continue;
		e->item(e->ctx, "shards", "shard", n++);
		e->u64(e->ctx, "shard", k == 0 ? UINT64_MAX :
		       app->slot_shard[k]);
		for (i = 1; i < EMBNIC_NB_TYPES; i++)
			if (!embnic_is_request((uint8_t)i))
				e->u64(e->ctx, type_names[i], ss.completed[i]);
		e->u64(e->ctx, "expired", ss.expired);
		e->u64(e->ctx, "latency_sum_ns", ss.latency_sum_ns);
		e->list(e->ctx, "latency_hist", ss.latency_hist,
			EMBNIC_LAT_BUCKETS);
	}
}

void
embnic_counters_emit(const struct embnic_app *app, enum embnic_walk what,
		     const struct embnic_emit *e)
{
	unsigned int i, avail, size = app->pool->size;
	struct embnic_totals t;

	counters_sum(app, &t);
	if (what == EMBNIC_WALK_RING)
		ring_emit(app, &t, e);
	else if (what == EMBNIC_WALK_STATE)
		state_emit(app, &t, true, e);
	if (what != EMBNIC_WALK_COUNTERS)
		return;
	for (i = 0; i < app->nb_ports; i++) {
		e->item(e->ctx, "ports", "port", i);
		e->u64(e->ctx, "port", i);
		e->u64(e->ctx, "rx_frames", t.rx_frames[i]);
		e->u64(e->ctx, "rx_bytes", t.rx_bytes[i]);
		e->u64(e->ctx, "tx_frames", t.tx_frames[i]);
		e->u64(e->ctx, "tx_bytes", t.tx_bytes[i]);
		e->u64(e->ctx, "too_long_for_port", t.too_long[i]);
		e->u64(e->ctx, "max_frame", app->ports[i].max_frame);
	}
	e->record(e->ctx, "types");
	for (i = 1; i < EMBNIC_NB_TYPES; i++)
		e->u64(e->ctx, type_names[i], t.types[i]);
	e->record(e->ctx, "drops");
	for (i = 1; i < EMBNIC_DROP_MAX; i++)
		e->u64(e->ctx, embnic_drop_name(i), t.drop_sum[i]);
	e->record(e->ctx, "completed");
	for (i = 1; i < EMBNIC_NB_TYPES; i++)
		if (!embnic_is_request((uint8_t)i))
			e->u64(e->ctx, type_names[i], t.completed[i]);
	e->record(e->ctx, "ring");
	ring_emit(app, &t, e);
	e->record(e->ctx, "mempool");
	avail = rte_mempool_avail_count(app->pool);
	e->u64(e->ctx, "size", size);
	e->u64(e->ctx, "available", avail);
	e->u64(e->ctx, "in_use", size - avail);
	e->record(e->ctx, "state");
	state_emit(app, &t, false, e);
	e->record(e->ctx, "arp");
	e->u64(e->ctx, "replies", t.arp_replies);
	shards_emit(app, e);
	for (i = 0; i < app->nb_ports; i++) {
		unsigned int r;

		e->item(e->ctx, "drops_by_port", "drops_port", i);
		e->u64(e->ctx, "port", i);
		for (r = 1; r < EMBNIC_DROP_MAX; r++)
			e->u64(e->ctx, embnic_drop_name(r), t.drops[i][r]);
	}
	e->record(e->ctx, NULL);
}

/* ---- DPDK telemetry: the writer, and the commands ---- */

static struct embnic_app *tel_app;

/* The top-level dict and the record being written (a dict in top). */
struct tel_emit {
	struct rte_tel_data *top, *cur;
};

static void
tel_record(void *ctx, const char *name)
{
	struct tel_emit *w = ctx;
	struct rte_tel_data *c;

	w->cur = w->top;
	if (name == NULL)
		return;
	c = rte_tel_data_alloc();
	if (c == NULL)
		return;
	rte_tel_data_start_dict(c);
	if (rte_tel_data_add_dict_container(w->top, name, c, 0) != 0) {
		rte_tel_data_free(c);
		return;
	}
	w->cur = c;
}

static void
tel_item(void *ctx, const char *list __rte_unused, const char *item,
	 unsigned int index)
{
	char name[RTE_TEL_MAX_STRING_LEN];

	snprintf(name, sizeof(name), "%s%u", item, index);
	tel_record(ctx, name);
}

static void
tel_u64(void *ctx, const char *key, uint64_t v)
{
	struct tel_emit *w = ctx;

	rte_tel_data_add_dict_u64(w->cur, key, v);
}

static void
tel_list(void *ctx, const char *key, const uint64_t *v, unsigned int n)
{
	struct tel_emit *w = ctx;
	char name[RTE_TEL_MAX_STRING_LEN];
	struct rte_tel_data *a;
	unsigned int i;

	if (w->cur != w->top) {	/* no containers inside containers */
		for (i = 0; i < n; i++) {
			snprintf(name, sizeof(name), "%s_%u", key, i);
			rte_tel_data_add_dict_u64(w->cur, name, v[i]);
		}
		return;
	}
	a = rte_tel_data_alloc();
	if (a == NULL)
		return;
	rte_tel_data_start_array(a, RTE_TEL_U64_VAL);
	for (i = 0; i < n; i++)
		rte_tel_data_add_array_u64(a, v[i]);
	if (rte_tel_data_add_dict_container(w->top, key, a, 0) != 0)
		rte_tel_data_free(a);
}

static void
tel_emitter(struct rte_tel_data *d, struct tel_emit *w, struct embnic_emit *e)
{
	rte_tel_data_start_dict(d);
	w->top = w->cur = d;
	*e = (struct embnic_emit){ .record = tel_record, .item = tel_item,
				   .u64 = tel_u64, .list = tel_list,
				   .ctx = w };
}

/* The card's DPDK telemetry commands: each writes one walk. */
static const struct {
	const char *cmd, *help;
	enum embnic_walk what;
} tel_cmds[] = {
	{ "/embnic/counters", "embnic card counters: ports, types, drops, "
	  "completed, ring, mempool, state, arp, shards", EMBNIC_WALK_COUNTERS },
	{ "/embnic/ring", "embnic header ring: size, count, high_water",
	  EMBNIC_WALK_RING },
	{ "/embnic/state", "embnic message state map summary",
	  EMBNIC_WALK_STATE },
};

static int
tel_cb(const char *cmd, const char *params __rte_unused,
       struct rte_tel_data *d)
{
	struct embnic_emit e;
	struct tel_emit w;
	unsigned int i;

	for (i = 0; i < RTE_DIM(tel_cmds); i++)
		if (strcmp(cmd, tel_cmds[i].cmd) == 0) {
			tel_emitter(d, &w, &e);
			embnic_counters_emit(tel_app, tel_cmds[i].what, &e);
			return 0;
		}
	return -EINVAL;
}

int
embnic_telemetry_init(struct embnic_app *app)
{
	unsigned int i;
	int ret = 0;

	tel_app = app;
	for (i = 0; i < RTE_DIM(tel_cmds) && ret == 0; i++)
		ret = rte_telemetry_register_cmd(tel_cmds[i].cmd, tel_cb,
						 tel_cmds[i].help);
	return ret;
}
