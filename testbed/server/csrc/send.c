/* SPDX-License-Identifier: Apache-2.0
 *
 * The shard's transmit queue sent: the replies in the order of the datagrams
 * that completed their requests, each cut into entries of at most 64 frames,
 * an entry of several frames one UDP GSO super-datagram, all with sendmmsg. A
 * kernel that refuses GSO turns it off for good (a->gso = 0); EAGAIN/ENOBUFS/
 * EINTR wait up to 10 ms and retry; any other refusal skips that entry
 * (send_errors).
 */
#define _GNU_SOURCE		/* sendmmsg, struct mmsghdr */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "shard.h"

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103		/* linux/udp.h */
#endif
#define GSO_MAX_SEGS 64		/* UDP_MAX_SEGMENTS of older kernels */
#define GSO_MAX_BYTES 65507	/* largest UDP payload */
#define CMSG_BYTES 24		/* CMSG_SPACE(sizeof(uint16_t)) */

static_assert(sizeof(struct mmsghdr) == 64, "struct mmsghdr: 64 bytes (LP64)");
static_assert(CMSG_SPACE(sizeof(uint16_t)) == CMSG_BYTES, "cmsg of one u16");

/* the queue's replies by datagram, ties in queue order (insertion sort:
 * the queue is nearly in order) */
static void
order_queue(struct embnic_answer *a)
{
	int64_t *o = a->rq_order;

	for (int64_t i = 0; i < a->nrq; i++) {
		int64_t j = i;

		while (j > 0 && a->rq_idx[o[j - 1]] > a->rq_idx[i]) {
			o[j] = o[j - 1];
			j--;
		}
		o[j] = i;
	}
}

#define BATCH 1024		/* entries per sendmmsg (UIO_MAXIOV) */

/* sendmmsg entries [0, e): returns the entries done; stops early (returning
 * fewer) only when GSO was refused, with a->gso now 0 */
static int64_t
send_entries(struct embnic_answer *a, struct mmsghdr *mm, int64_t e, const int64_t *ecount)
{
	int64_t i = 0;

	while (i < e) {
		int r;

		a->stats[EMBNIC_ST_SEND_CALLS]++;
		r = sendmmsg((int)a->fd, mm + i, (unsigned int)(e - i), 0);
		if (r > 0) {
			for (int k = 0; k < r; k++) {
				a->stats[EMBNIC_ST_SENT_FRAMES] += ecount[i + k];
				if (ecount[i + k] > 1)
					a->stats[EMBNIC_ST_GSO_SENDS]++;
			}
			i += r;
			continue;
		}
		if (errno == EAGAIN || errno == ENOBUFS || errno == EINTR) {
			struct pollfd pf = { .fd = (int)a->fd, .events = POLLOUT };

			poll(&pf, 1, 10);
			continue;
		}
		if ((errno == EIO || errno == EINVAL || errno == ENOPROTOOPT || errno == EOPNOTSUPP) &&
		    ecount[i] > 1 && a->gso) {
			a->gso = 0;
			a->stats[EMBNIC_ST_GSO_FALLBACKS]++;
			return i;
		}
		a->stats[EMBNIC_ST_SEND_ERRORS]++;
		i++;
	}
	return e;
}

/* entry e: rows row .. row+k-1 of the transmit buffer to name, one GSO
 * super-datagram when k > 1 */
static void
put_entry(struct embnic_answer *a, int64_t e, uint8_t *name, int64_t row, int64_t k)
{
	struct mmsghdr *mm = (struct mmsghdr *)a->mmsg + e;
	struct iovec *iov = (struct iovec *)a->iov + e;
	struct msghdr *h = &mm->msg_hdr;

	iov->iov_base = a->tx + row * a->width;
	iov->iov_len = (size_t)((k - 1) * a->width + a->txlen[row + k - 1]);
	h->msg_name = name;
	h->msg_namelen = sizeof(struct sockaddr_in);
	h->msg_iov = iov;
	h->msg_iovlen = 1;
	h->msg_flags = 0;
	if (k > 1) {
		uint8_t *cb = a->cmsg + e * CMSG_BYTES;
		struct cmsghdr *cm = (struct cmsghdr *)cb;
		uint16_t gso = (uint16_t)a->width;

		memset(cb, 0, CMSG_BYTES);
		cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
		cm->cmsg_level = SOL_UDP;
		cm->cmsg_type = UDP_SEGMENT;
		memcpy(CMSG_DATA(cm), &gso, sizeof(gso));
		h->msg_control = cb;
		h->msg_controllen = CMSG_BYTES;
	} else {
		h->msg_control = NULL;
		h->msg_controllen = 0;
	}
}

/* send entries [0, e) (counts: frames of each); what GSO refused goes again
 * frame by frame */
static void
flush(struct embnic_answer *a, int64_t e, int64_t *counts)
{
	struct mmsghdr *mm = (struct mmsghdr *)a->mmsg;
	int64_t done = send_entries(a, mm, e, counts);
	int64_t row0[BATCH], k0[BATCH];
	uint8_t *name0[BATCH];
	int64_t left = e - done, f = 0;

	if (left == 0)
		return;
	for (int64_t x = done; x < e; x++) {	/* what the entries not sent held */
		row0[x - done] = ((uint8_t *)((struct iovec *)a->iov)[x].iov_base - a->tx) / a->width;
		k0[x - done] = counts[x];
		name0[x - done] = mm[x].msg_hdr.msg_name;
	}
	for (int64_t x = 0; x < left; x++) {
		for (int64_t r = 0; r < k0[x]; r++) {
			put_entry(a, f, name0[x], row0[x] + r, 1);
			counts[f++] = 1;
			if (f == a->send_cap || f == BATCH) {
				send_entries(a, mm, f, counts);
				f = 0;
			}
		}
	}
	if (f)
		send_entries(a, mm, f, counts);
}

/*
 * Send every queued reply, then empty the queue and the transmit buffer.
 * Returns the frames handed to the kernel.
 */
int64_t
embnic_shard_send(struct embnic_answer *a)
{
	int64_t sent0 = a->stats[EMBNIC_ST_SENT_FRAMES];
	int64_t counts[BATCH];
	int64_t e = 0;

	if (a->nrq == 0 || a->fd < 0)
		goto done;
	order_queue(a);
	for (int64_t i = 0; i < a->ntx; i++)
		a->stats[EMBNIC_ST_TX_BYTES] += a->txlen[i];
	a->stats[EMBNIC_ST_TX_FRAMES] += a->ntx;
	for (int64_t qi = 0; qi < a->nrq; qi++) {
		int64_t q = a->rq_order[qi], row = a->rq_start[q], left = a->rq_count[q];
		uint8_t *name = a->rq_name + q * 16;

		while (left > 0) {
			/* frames per entry: as many of width bytes as one UDP datagram holds */
			int64_t g = a->gso && a->width <= GSO_MAX_BYTES ? GSO_MAX_BYTES / a->width : 1;
			int64_t k;

			g = g > GSO_MAX_SEGS ? GSO_MAX_SEGS : g;
			k = left < g ? left : g;
			put_entry(a, e, name, row, k);
			counts[e++] = k;
			row += k;
			left -= k;
			if (e == a->send_cap || e == BATCH) {
				flush(a, e, counts);
				e = 0;
			}
		}
	}
	if (e)
		flush(a, e, counts);
done:
	a->ntx = 0;
	a->nrq = 0;
	return a->stats[EMBNIC_ST_SENT_FRAMES] - sent0;
}
