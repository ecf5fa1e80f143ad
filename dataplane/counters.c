/* SPDX-License-Identifier: Apache-2.0
 *
 * Counters: each lcore writes only its own cache-aligned struct
 * embnic_lcore_stats; the control path (control socket, DPDK telemetry)
 * sums them. A reset does not touch the lcores' counters: it records the
 * current sums as a base that later reads subtract, so no increment is
 * lost to a race. The ring high-water mark is a gauge and is zeroed.
 *
 * Telemetry commands (dpdk-telemetry.py): /embnic/counters, /embnic/ring,
 * /embnic/state.
 */
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
};

const char *
embnic_type_name(unsigned int t)
{
	return t > 0 && t < EMBNIC_NB_TYPES ? type_names[t] : NULL;
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

		for (i = 0; i < EMBNIC_MAX_PORTS; i++) {
			t->rx_frames[i] += s->rx_frames[i];
			t->rx_bytes[i] += s->rx_bytes[i];
			t->tx_frames[i] += s->tx_frames[i];
			t->tx_bytes[i] += s->tx_bytes[i];
		}
		for (i = 0; i < EMBNIC_NB_TYPES; i++)
			t->types[i] += s->types[i];
		for (i = 0; i < EMBNIC_DROP_MAX; i++)
			t->drops[i] += s->drops[i];
		t->arp_replies += s->arp_replies;
		t->state_overflow += s->state_overflow;
		t->state_expired += s->state_expired;
		if (s->ring_high_water > t->ring_high_water)
			t->ring_high_water = s->ring_high_water;
	}
	for (i = 0; i < app->nb_ports; i++)
		if (rte_eth_stats_get(i, &es) == 0)
			t->rx_nombuf[i] = es.rx_nombuf;
}

void
embnic_counters_sum(const struct embnic_app *app, struct embnic_totals *t)
{
	const struct embnic_totals *b = &app->base;
	unsigned int i;

	raw_sum(app, t);
	for (i = 0; i < EMBNIC_MAX_PORTS; i++) {
		t->rx_frames[i] -= b->rx_frames[i];
		t->rx_bytes[i] -= b->rx_bytes[i];
		t->tx_frames[i] -= b->tx_frames[i];
		t->tx_bytes[i] -= b->tx_bytes[i];
		t->rx_nombuf[i] -= b->rx_nombuf[i];
		t->drops[EMBNIC_DROP_NO_MBUF] += t->rx_nombuf[i];
	}
	for (i = 0; i < EMBNIC_NB_TYPES; i++)
		t->types[i] -= b->types[i];
	for (i = 0; i < EMBNIC_DROP_MAX; i++)
		t->drops[i] -= b->drops[i];
	t->arp_replies -= b->arp_replies;
	t->state_overflow -= b->state_overflow;
	t->state_expired -= b->state_expired;
}

void
embnic_counters_reset(struct embnic_app *app)
{
	unsigned int lc;

	raw_sum(app, &app->base);
	for (lc = 0; lc < RTE_MAX_LCORE; lc++)
		__atomic_store_n(&app->stats[lc].ring_high_water, 0,
				 __ATOMIC_RELAXED);
}

/* ---- DPDK telemetry ---- */

static struct embnic_app *tel_app;

static struct rte_tel_data *
tel_dict(void)
{
	struct rte_tel_data *d = rte_tel_data_alloc();

	if (d != NULL)
		rte_tel_data_start_dict(d);
	return d;
}

static void
tel_add(struct rte_tel_data *parent, const char *name, struct rte_tel_data *c)
{
	if (c != NULL && rte_tel_data_add_dict_container(parent, name, c, 0))
		rte_tel_data_free(c);
}

static void
tel_ring(struct rte_tel_data *d)
{
	struct embnic_totals t;

	embnic_counters_sum(tel_app, &t);
	rte_tel_data_add_dict_u64(d, "size",
				  rte_ring_get_capacity(tel_app->ring));
	rte_tel_data_add_dict_u64(d, "count", rte_ring_count(tel_app->ring));
	rte_tel_data_add_dict_u64(d, "high_water", t.ring_high_water);
}

static void
tel_state(struct rte_tel_data *d, const struct embnic_totals *t)
{
	struct embnic_state_summary s;
	unsigned int i;

	embnic_state_summarise(tel_app->state, &s);
	rte_tel_data_add_dict_u64(d, "entries", s.entries);
	rte_tel_data_add_dict_u64(d, "capacity", s.capacity);
	rte_tel_data_add_dict_u64(d, "overflow", t->state_overflow);
	rte_tel_data_add_dict_u64(d, "expired", t->state_expired);
	for (i = 1; i < EMBNIC_NB_STATES; i++)
		rte_tel_data_add_dict_u64(d, embnic_state_name(i),
					  s.by_state[i]);
}

static int
tel_counters_cb(const char *cmd __rte_unused, const char *params __rte_unused,
		struct rte_tel_data *d)
{
	struct rte_tel_data *c;
	struct embnic_totals t;
	char name[16];
	unsigned int i;

	embnic_counters_sum(tel_app, &t);
	rte_tel_data_start_dict(d);
	for (i = 0; i < tel_app->nb_ports; i++) {
		c = tel_dict();
		if (c == NULL)
			return -ENOMEM;
		rte_tel_data_add_dict_u64(c, "rx_frames", t.rx_frames[i]);
		rte_tel_data_add_dict_u64(c, "rx_bytes", t.rx_bytes[i]);
		rte_tel_data_add_dict_u64(c, "tx_frames", t.tx_frames[i]);
		rte_tel_data_add_dict_u64(c, "tx_bytes", t.tx_bytes[i]);
		snprintf(name, sizeof(name), "port%u", i);
		tel_add(d, name, c);
	}
	c = tel_dict();
	if (c != NULL) {
		for (i = 1; i < EMBNIC_NB_TYPES; i++)
			rte_tel_data_add_dict_u64(c, type_names[i], t.types[i]);
		tel_add(d, "types", c);
	}
	c = tel_dict();
	if (c != NULL) {
		for (i = 1; i < EMBNIC_DROP_MAX; i++)
			rte_tel_data_add_dict_u64(c, embnic_drop_name(i),
						  t.drops[i]);
		tel_add(d, "drops", c);
	}
	c = tel_dict();
	if (c != NULL) {
		tel_ring(c);
		tel_add(d, "ring", c);
	}
	c = tel_dict();
	if (c != NULL) {
		unsigned int size = tel_app->pool->size;
		unsigned int avail = rte_mempool_avail_count(tel_app->pool);

		rte_tel_data_add_dict_u64(c, "size", size);
		rte_tel_data_add_dict_u64(c, "available", avail);
		rte_tel_data_add_dict_u64(c, "in_use", size - avail);
		tel_add(d, "mempool", c);
	}
	c = tel_dict();
	if (c != NULL) {
		tel_state(c, &t);
		tel_add(d, "state", c);
	}
	rte_tel_data_add_dict_u64(d, "arp_replies", t.arp_replies);
	return 0;
}

static int
tel_ring_cb(const char *cmd __rte_unused, const char *params __rte_unused,
	    struct rte_tel_data *d)
{
	rte_tel_data_start_dict(d);
	tel_ring(d);
	return 0;
}

static int
tel_state_cb(const char *cmd __rte_unused, const char *params __rte_unused,
	     struct rte_tel_data *d)
{
	struct embnic_totals t;

	embnic_counters_sum(tel_app, &t);
	rte_tel_data_start_dict(d);
	tel_state(d, &t);
	return 0;
}

int
embnic_telemetry_init(struct embnic_app *app)
{
	int ret;

	tel_app = app;
	ret = rte_telemetry_register_cmd("/embnic/counters", tel_counters_cb,
		"embnic card counters: ports, types, drops, ring, mempool, state");
	if (ret == 0)
		ret = rte_telemetry_register_cmd("/embnic/ring", tel_ring_cb,
			"embnic header ring: size, count, high_water");
	if (ret == 0)
		ret = rte_telemetry_register_cmd("/embnic/state", tel_state_cb,
			"embnic message state map summary");
	return ret;
}
