/* SPDX-License-Identifier: Apache-2.0
 *
 * Connections of the control socket: a UNIX stream socket (mode 0600)
 * polled by the main lcore, one request per line. Like
 * examples/ip_pipeline/conn.c it never blocks (sockets are non-blocking,
 * input is split into lines, output is queued and flushed as the peer
 * reads) and hands each line to a handler it knows nothing about (ctl.c).
 *
 * At most EMBNIC_CONN_MAX connections. When all are taken, a new one
 * takes the slot of the connection idle longest (no request line under way,
 * no answer waiting), which is told so in one JSON line and closed; so an
 * operator's command gets through while monitoring tools hold idle
 * connections. Only when every connection is busy is the new one refused,
 * with one JSON line before the close.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "embnic_conn.h"

#define CONN_MAX_OUT	(64u << 20)	/* queued answer bytes per connection */
#define CONN_STR_(x)	#x
#define CONN_STR(x)	CONN_STR_(x)

/* to a connection closed to make room for a new one */
static const char conn_evicted[] = "{\"ok\":false,\"error\":\"control "
	"connection closed while idle: a new connection took its slot (the card "
	"serves at most " CONN_STR(EMBNIC_CONN_MAX) " and closes the one idle "
	"longest to make room); reconnect\",\"kind\":\"failure\"}\n";
/* to a new connection when every one is busy */
static const char conn_busy[] = "{\"ok\":false,\"error\":\"the card serves "
	"at most " CONN_STR(EMBNIC_CONN_MAX) " control connections and every one "
	"is busy with a request: retry\",\"kind\":\"failure\"}\n";

struct conn {
	int fd;
	char *in;
	size_t in_len;
	char *out;
	size_t out_len, out_off, out_cap;
	uint64_t active;		/* embnic_conn.tick at its last request */
};

struct embnic_conn {
	int lfd;
	uint64_t tick;			/* connections accepted + lines answered */
	embnic_conn_handler handler;
	void *arg;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct conn conns[EMBNIC_CONN_MAX];
};

static void
conn_close(struct conn *k)
{
	if (k->fd >= 0)
		close(k->fd);
	free(k->in);
	free(k->out);
	memset(k, 0, sizeof(*k));
	k->fd = -1;
}

static int
conn_queue(struct conn *k, const char *s, size_t n)
{
	size_t need = k->out_len + n;
	char *p;

	if (need > CONN_MAX_OUT)
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
conn_flush(struct conn *k)
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
conn_respond(struct embnic_conn *c, struct conn *k, const char *line,
	     size_t len)
{
	char *s = c->handler(line, len, c->arg);
	int ret = -1;

	if (s != NULL) {
		ret = conn_queue(k, s, strlen(s));
		if (ret == 0)
			ret = conn_queue(k, "\n", 1);
		free(s);
	}
	return ret;
}

/* Read what is there and answer every complete line; -1 closes. */
static int
conn_read(struct embnic_conn *c, struct conn *k)
{
	char *nl, *start;
	size_t rest;
	ssize_t r;

	for (;;) {
		r = recv(k->fd, k->in + k->in_len,
			 EMBNIC_CONN_MAX_LINE + 1 - k->in_len, MSG_DONTWAIT);
		if (r == 0)
			return -1;
		if (r < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		k->in_len += (size_t)r;

		start = k->in;
		rest = k->in_len;
		while ((nl = memchr(start, '\n', rest)) != NULL) {
			size_t n = (size_t)(nl - start);

			if (!embnic_conn_line_blank(start, n) && conn_respond(c, k, start, n))
				return -1;
			k->active = ++c->tick;
			rest -= n + 1;
			start = nl + 1;
		}
		memmove(k->in, start, rest);
		k->in_len = rest;
		if (k->in_len > EMBNIC_CONN_MAX_LINE) {
			const char *msg = "{\"ok\":false,\"error\":\"request "
				"line longer than 65536 bytes\","
				"\"kind\":\"argument\"}\n";

			conn_queue(k, msg, strlen(msg));
			conn_flush(k);
			return -1;
		}
		if (conn_flush(k))
			return -1;
	}
}

/* Say line (best effort: never waits) and close fd. */
static void
say_close(int fd, const char *line)
{
	ssize_t w = send(fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);

	(void)w;
	close(fd);
}

/*
 * A slot for a new connection: a free one, else the one idle longest (no
 * partial request line, no answer waiting), whose connection is told why
 * and closed; EMBNIC_CONN_MAX when every connection is busy.
 */
static unsigned int
conn_slot(struct embnic_conn *c)
{
	unsigned int i, idle = EMBNIC_CONN_MAX;

	for (i = 0; i < EMBNIC_CONN_MAX; i++) {
		const struct conn *k = &c->conns[i];

		if (k->fd < 0)
			return i;
		if (k->in_len == 0 && k->out_off == k->out_len &&
		    (idle == EMBNIC_CONN_MAX || k->active < c->conns[idle].active))
			idle = i;
	}
	if (idle < EMBNIC_CONN_MAX) {
		say_close(c->conns[idle].fd, conn_evicted);
		c->conns[idle].fd = -1;
		conn_close(&c->conns[idle]);
	}
	return idle;
}

static void
conn_accept(struct embnic_conn *c)
{
	unsigned int i;
	int fd;

	while ((fd = accept4(c->lfd, NULL, NULL,
			     SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		i = conn_slot(c);
		if (i == EMBNIC_CONN_MAX) {
			say_close(fd, conn_busy);
			continue;
		}
		c->conns[i].fd = fd;
		c->conns[i].active = ++c->tick;
		c->conns[i].in = malloc(EMBNIC_CONN_MAX_LINE + 1);
		if (c->conns[i].in == NULL)
			conn_close(&c->conns[i]);
	}
}

void
embnic_conn_poll(struct embnic_conn *c, int timeout_ms)
{
	struct pollfd pfd[1 + EMBNIC_CONN_MAX];
	int map[1 + EMBNIC_CONN_MAX];
	unsigned int i, n = 1;

	pfd[0].fd = c->lfd;
	pfd[0].events = POLLIN;
	for (i = 0; i < EMBNIC_CONN_MAX; i++) {
		struct conn *k = &c->conns[i];

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
		struct conn *k = &c->conns[map[i]];

		if ((pfd[i].revents & POLLOUT) && conn_flush(k)) {
			conn_close(k);
			continue;
		}
		if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
		    conn_read(c, k))
			conn_close(k);
	}
	if (pfd[0].revents & POLLIN)
		conn_accept(c);
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

struct embnic_conn *
embnic_conn_init(const char *path, embnic_conn_handler handler, void *arg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct embnic_conn *c;
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
	c->handler = handler;
	c->arg = arg;
	for (i = 0; i < EMBNIC_CONN_MAX; i++)
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
embnic_conn_free(struct embnic_conn *c)
{
	unsigned int i;

	if (c == NULL)
		return;
	for (i = 0; i < EMBNIC_CONN_MAX; i++)
		if (c->conns[i].fd >= 0)
			conn_close(&c->conns[i]);
	close(c->lfd);
	unlink(c->path);
	free(c);
}
