/* SPDX-License-Identifier: Apache-2.0
 *
 * libFuzzer target for the control socket's commands: the input split into
 * lines as conn.c splits them, each through embnic_ctl_request() on a card
 * built as main() builds one (what it checks: dataplane/README.md,
 * "Fuzzing").
 *
 *   make -C dataplane fuzz FUZZ_SECONDS=60       (every target)
 *   build/fuzz-ctl -dict=fuzz/ctl.dict fuzz/seeds/ctl
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "embnic_conn.h"
#define FZ_TARGET "fuzz_ctl"	/* names the target in fail()'s report */
#include "fuzz_common.h"

static struct embnic_ctl *fz_ctl;

/* What a refused request must not change. */
struct snap {
	struct fz_walk routes, clients;
	uint32_t nb_slots;
	struct embnic_state_summary state;
};

static void
take(struct snap *s)
{
	memset(s, 0, sizeof(*s));
	fz_table_snapshot(fz_app.routes, &s->routes);
	fz_table_snapshot(fz_app.clients, &s->clients);
	s->nb_slots = fz_app.nb_slots;
	embnic_state_summarise(fz_app.w[0].state, true, &s->state);
}

/* The same peers (a snapshot: zeroed, then copied from the table)? */
static bool
same_table(const struct fz_walk *a, const struct fz_walk *b)
{
	return a->n == b->n && memcmp(a->v, b->v, a->n * sizeof(a->v[0])) == 0;
}

/* Check the answer to line; returns whether it said ok. */
static bool
check_answer(const char *line, size_t len, const char *ans)
{
	json_t *a, *ok, *err, *req, *id;
	json_error_t jerr;
	bool r;

	if (ans == NULL)
		fail("no answer (out of memory?)");
	a = json_loads(ans, 0, &jerr);
	if (a == NULL || !json_is_object(a))
		fail("answer is no JSON object: %s", ans);
	ok = json_object_get(a, "ok");
	err = json_object_get(a, "error");
	if (!json_is_boolean(ok))
		fail("answer without a boolean ok: %s", ans);
	r = json_is_true(ok);
	if (!r && !json_is_string(err))
		fail("refusal without an error string: %s", ans);
	/* the request's id comes back, whatever else went wrong */
	req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	id = json_is_object(req) ? json_object_get(req, "id") : NULL;
	if (id != NULL && !json_equal(id, json_object_get(a, "id")))
		fail("answer lost the request's id: %s", ans);
	json_decref(req);
	json_decref(a);
	return r;
}

static void
handle(const char *line, size_t len)
{
	struct snap before, after;
	char *ans;

	take(&before);
	ans = embnic_ctl_request(fz_ctl, line, len);
	if (!check_answer(line, len, ans)) {
		take(&after);
		if (!same_table(&before.routes, &after.routes) ||
		    !same_table(&before.clients, &after.clients))
			fail("a refused request changed a table: %s", ans);
		if (before.nb_slots != after.nb_slots)
			fail("a refused request assigned a shard slot: %s",
			     ans);
		if (memcmp(&before.state, &after.state, sizeof(before.state)))
			fail("a refused request changed the state map: %s",
			     ans);
	}
	free(ans);
}

int
LLVMFuzzerInitialize(int *argc __rte_unused, char ***argv __rte_unused)
{
	uint16_t p;

	fz_app_init();
	for (p = 0; p < FZ_PORTS; p++)
		fz_app.ports[p].ip = rte_cpu_to_be_32(0x0a010001u |
						      (uint32_t)p << 8);
	fz_ctl = embnic_ctl_init(&fz_app, NULL);
	if (fz_ctl == NULL)
		fz_die("embnic_ctl_init");
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *s = (const char *)data, *nl;
	size_t rest = size, n;

	/*
	 * like conn.c: line by line; what follows the last newline is taken
	 * as a line too (a connection would wait for its newline)
	 */
	while (rest > 0) {
		nl = memchr(s, '\n', rest);
		n = nl != NULL ? (size_t)(nl - s) : rest;
		if (!embnic_conn_line_blank(s, n)) {
			/* a copy of exactly n bytes: ASan sees a read past it */
			char *line = malloc(n ? n : 1);

			if (line == NULL)
				fail("out of memory");
			memcpy(line, s, n);
			handle(line, n);
			free(line);
		}
		if (nl == NULL)
			break;
		rest -= n + 1;
		s = nl + 1;
	}
	/* back to the card as built */
	fz_table_clear(fz_app.routes);
	fz_table_clear(fz_app.clients);
	memset(&fz_app.base, 0, sizeof(fz_app.base));
	memset(fz_app.shard_base, 0, sizeof(fz_app.shard_base[0]) *
	       fz_app.nb_slots);	/* reset_counters wrote these only */
	fz_slots_reset(&fz_app, 1);
	fz_app.paused = false;
	force_quit = false;
	return 0;
}
