/* SPDX-License-Identifier: Apache-2.0
 *
 * Connections of the control socket (conn.c): lines in, a handler's
 * answers out; no JSON, no commands (ctl.c, swx/ctl.c).
 */
#ifndef EMBNIC_CONN_H
#define EMBNIC_CONN_H

#include <stdbool.h>
#include <stddef.h>

#define EMBNIC_CONN_MAX		16		/* connections at a time */
#define EMBNIC_CONN_MAX_LINE	(64 * 1024)	/* bytes per request line */

/*
 * Answer one request line (without its '\n', len bytes, not NUL-terminated).
 * Returns a malloc'ed, NUL-terminated answer without the trailing newline,
 * or NULL (the connection is closed).
 */
typedef char *(*embnic_conn_handler)(const char *line, size_t len, void *arg);

struct embnic_conn;

/* True if a request line holds only spaces, tabs and CRs: it is skipped, not answered. */
static inline bool
embnic_conn_line_blank(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
			return false;
	return true;
}

/*
 * Listen on path (mode 0600; its parent directory is created if missing, a
 * stale socket of a dead process replaced). NULL with errno set on failure:
 * EADDRINUSE if a live process serves path, EEXIST if path is not a socket,
 * ENAMETOOLONG.
 */
struct embnic_conn *embnic_conn_init(const char *path,
				     embnic_conn_handler handler, void *arg);
/* Accept, read, answer and flush whatever is ready; waits up to timeout_ms. */
void embnic_conn_poll(struct embnic_conn *c, int timeout_ms);
/* Close every connection and the socket, and remove its path. */
void embnic_conn_free(struct embnic_conn *c);

#endif /* EMBNIC_CONN_H */
