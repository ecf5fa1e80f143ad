/* SPDX-License-Identifier: Apache-2.0
 *
 * What the control socket's command files share (ctl*.c, by role:
 * dataplane/README.md, "Files"); the card's API is embnic_ctl_* in
 * embnic_dp.h.
 *
 * A command is a ctl_cmd_fn: it reads its fields from req, sets its answer's
 * fields in resp and returns 0, or -1 with the error message set by
 * ctl_refuse() (the request is wrong: a missing or malformed field, a value
 * out of range, an absent entry; the answer's "kind" is "argument") or
 * ctl_fail() (a well-formed request the card could not carry out: a full
 * table, no memory; "kind" "failure"). Either way the request changed nothing.
 */
#ifndef EMBNIC_CTL_H
#define EMBNIC_CTL_H

#include <stdint.h>

#include <jansson.h>

#include <rte_ether.h>

#include "embnic_dp.h"

struct embnic_conn;

struct embnic_ctl {
	struct embnic_app *app;
	struct embnic_conn *conn;
	char err[256];		/* the failed request's message */
	const char *err_kind;	/* its kind: "argument" or "failure" */
};

typedef int (*ctl_cmd_fn)(struct embnic_ctl *c, json_t *req, json_t *resp);

/* ---- ctl_json.c: request fields ---- */

/* Set the request's error message (printf format) and kind; returns -1. */
int ctl_error(struct embnic_ctl *c, const char *kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* ... kind "failure": a well-formed request the card could not carry out. */
#define ctl_fail(c, ...) ctl_error((c), "failure", __VA_ARGS__)
/* ... kind "argument": the request is wrong. */
#define ctl_refuse(c, ...) ctl_error((c), "argument", __VA_ARGS__)
/*
 * The integer field name of req in [lo, hi] into *out; absent: *out = dflt
 * if dflt >= 0, else an error. 0, or -1 with the error set.
 */
int ctl_get_int(struct embnic_ctl *c, json_t *req, const char *name,
		long long lo, long long hi, long long dflt, long long *out);
/* The string field name of req (owned by req), or NULL with the error set. */
const char *ctl_get_str(struct embnic_ctl *c, json_t *req, const char *name);
/*
 * A peer from req's {<idname>, port, mac, ip, udp_port} (udp_port defaults
 * to dflt_udp if >= 0); 0, or -1 with the error set.
 */
int ctl_get_peer(struct embnic_ctl *c, json_t *req, const char *idname,
		 long long dflt_udp, struct embnic_peer *p);

/* ---- ctl_json.c: answers ---- */

/* A dotted-quad string of a network-order IPv4 address (new reference). */
json_t *ctl_ip_json(uint32_t ip_be);
/* A "AA:BB:CC:DD:EE:FF" string (new reference). */
json_t *ctl_mac_json(const struct rte_ether_addr *mac);
/* {<idname>, port, mac, ip, udp_port} of p (new reference). */
json_t *ctl_peer_json(const struct embnic_peer *p, const char *idname);

/* The JSON writer of struct embnic_emit: records and lists in resp. */
struct ctl_json_emit {
	json_t *top, *cur;
};
struct embnic_emit ctl_json_emitter(json_t *resp, struct ctl_json_emit *w);

/*
 * The commands of ctl_tables.c (route_*, client_*) and ctl_state.c, each
 * X(name) a ctl_cmd_fn ctl_cmd_<name> that ctl.c's table lists as "name".
 */
#define CTL_FILE_CMDS(X)						\
	X(route_add) X(route_del) X(route_list)				\
	X(client_add) X(client_del) X(client_list)			\
	X(state_dump) X(ring_last)
#define CTL_CMD_DECLARE(name)						\
	int ctl_cmd_##name(struct embnic_ctl *c, json_t *req, json_t *resp);
CTL_FILE_CMDS(CTL_CMD_DECLARE)

#endif /* EMBNIC_CTL_H */
