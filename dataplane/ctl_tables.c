/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket's table commands: route_add / route_del / route_list
 * (shard id -> card port, MAC, IPv4, UDP port) and client_add / client_del
 * / client_list, on the tables of route.c. A refused request leaves its
 * table, and the shard statistics slots, as they were.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <rte_common.h>

#include "embnic_ctl.h"

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

	if (ctl_get_int(c, req, idname, 0, UINT16_MAX, -1, &id))
		return -1;
	if (embnic_table_del(t, (uint32_t)id) < 0)
		return ctl_refuse(c, "no %s %lld", idname, id);
	return 0;
}

static int
table_list(struct embnic_ctl *c, struct embnic_table *t, json_t *resp,
	   const char *idname, const char *listname)
{
	struct embnic_peer *v = calloc(embnic_table_size(t), sizeof(*v));
	json_t *arr;
	unsigned int i, n;

	if (v == NULL)
		return ctl_fail(c, "out of memory");
	arr = json_array();
	n = embnic_table_copy(t, v, embnic_table_size(t));
	for (i = 0; i < n; i++)
		json_array_append_new(arr, ctl_peer_json(&v[i], idname));
	free(v);
	json_object_set_new(resp, listname, arr);
	return 0;
}

int
ctl_cmd_route_add(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	struct embnic_peer p;

	if (ctl_get_peer(c, req, "shard", EMBNIC_UDP_PORT, &p))
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

int
ctl_cmd_route_del(struct embnic_ctl *c, json_t *req, json_t *resp __rte_unused)
{
	return table_del(c, c->app->routes, req, "shard");
}

int
ctl_cmd_route_list(struct embnic_ctl *c, json_t *req __rte_unused,
		   json_t *resp)
{
	return table_list(c, c->app->routes, resp, "shard", "routes");
}

int
ctl_cmd_client_add(struct embnic_ctl *c, json_t *req,
		   json_t *resp __rte_unused)
{
	struct embnic_peer p;

	if (ctl_get_peer(c, req, "client", -1, &p))
		return -1;
	return table_put(c, c->app->clients, &p, "client");
}

int
ctl_cmd_client_del(struct embnic_ctl *c, json_t *req,
		   json_t *resp __rte_unused)
{
	return table_del(c, c->app->clients, req, "client");
}

int
ctl_cmd_client_list(struct embnic_ctl *c, json_t *req __rte_unused,
		    json_t *resp)
{
	return table_list(c, c->app->clients, resp, "client", "clients");
}
