/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket's JSON (jansson): reading a request's fields and
 * peers, writing addresses, peers and the counters and state records of
 * struct embnic_emit into an answer. Shared by the command files
 * (include/embnic_ctl.h).
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include <rte_byteorder.h>
#include <rte_common.h>
#include <rte_ether.h>

#include "embnic_ctl.h"

/* ---- request fields ---- */

int
ctl_error(struct embnic_ctl *c, const char *kind, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	c->err_kind = kind;
	return -1;
}

int
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

const char *
ctl_get_str(struct embnic_ctl *c, json_t *req, const char *name)
{
	json_t *v = json_object_get(req, name);

	if (v == NULL || !json_is_string(v)) {
		ctl_refuse(c, "field '%s' must be a string", name);
		return NULL;
	}
	return json_string_value(v);
}

json_t *
ctl_ip_json(uint32_t ip_be)
{
	char buf[INET_ADDRSTRLEN];
	struct in_addr a = { .s_addr = ip_be };

	inet_ntop(AF_INET, &a, buf, sizeof(buf));
	return json_string(buf);
}

json_t *
ctl_mac_json(const struct rte_ether_addr *mac)
{
	char buf[RTE_ETHER_ADDR_FMT_SIZE];

	rte_ether_format_addr(buf, sizeof(buf), mac);
	return json_string(buf);
}

/* A peer from {<idname>, port, mac, ip, udp_port}. */
int
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

json_t *
ctl_peer_json(const struct embnic_peer *p, const char *idname)
{
	return json_pack("{s:I, s:I, s:o, s:o, s:I}", idname, (json_int_t)p->id,
			 "port", (json_int_t)p->port,
			 "mac", ctl_mac_json(&p->mac),
			 "ip", ctl_ip_json(p->ip),
			 "udp_port", (json_int_t)rte_be_to_cpu_16(p->udp_port));
}

/* ---- the JSON writer of struct embnic_emit ---- */

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

struct embnic_emit
ctl_json_emitter(json_t *resp, struct ctl_json_emit *w)
{
	w->top = w->cur = resp;
	return (struct embnic_emit){ .record = json_record, .item = json_item,
				     .u64 = json_u64, .list = json_list,
				     .ctx = w };
}

