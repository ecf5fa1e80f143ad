/* SPDX-License-Identifier: Apache-2.0
 *
 * What the files of the client's round share (private to libembnic_client:
 * client_lib/csrc/). The round sends a round's request messages and waits
 * for every answer — sendmmsg/recvmmsg on the client's UDP socket, reply
 * fragments copied straight to their rows in the caller's output buffer, the
 * send window, the retransmission timers and the loss detection and recovery
 * of docs/protocol.md "Reliability" (RACK by transmission order, RFC 6298
 * timers with Karn's rule and backoff, tail probes, lookup repairs, update
 * polls answered by UPDATE_ACK or UPDATE_NACK) — called through ctypes by
 * client_lib/native.py; each file's header says its part.
 *
 * tests/client_lib/pyround.py is the test oracle: test_native_round.py runs
 * both on the same rounds and compares the frames they send and the arrays
 * they return, loss-free and under loss, duplication and reordering.
 *
 * No allocation per frame: the round's message table grows only when a
 * repair or a tail probe adds a message; frames are built as iovecs over
 * the caller's arrays (header, directory, keys, values), never copied.
 */
#ifndef EMBNIC_CLIENT_ROUND_H
#define EMBNIC_CLIENT_ROUND_H

#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "embnic_parse.h"
#include "embnic_proto.h"

#define EC_RXB 32		/* datagrams per recvmmsg */
#define EC_SLOT 65536		/* bytes per receive slot: any UDP datagram */
#define EC_TXB 64		/* frames per sendmmsg */
#define EC_LATE 4096		/* answers of tail probes expected after their round */
#define EC_MAX_MSG_LEN (64u << 20)	/* a reply body above it: too_large */
#define EC_REO_WND_MIN 0.001	/* least reordering window, s (client_lib/rtt.py) */
#define EC_G 1e-6		/* RFC 6298 clock granularity, s */

/* Counters, in this order (embnic_client_stat_name(): client_lib/native.py reads their names). */
#define EC_STATS(X) \
	X(messages_sent) X(frames_sent) X(bytes_sent) X(messages_received) \
	X(frames_received) X(bytes_received) X(retransmits) X(timeouts) \
	X(fast_retransmits) X(repairs) X(probes) X(max_inflight_frames) \
	X(update_polls) X(nacks) X(tries_by_nack) X(frames_resent) \
	X(stale_replies) X(duplicates) \
	X(drop_too_short) X(drop_bad_magic) X(drop_bad_version) \
	X(drop_bad_type) X(drop_bad_length) X(drop_too_many_frags) \
	X(drop_frag_mismatch) X(drop_too_large) X(drop_wrong_shard_reply) \
	X(drop_mismatched_reply)

enum {
#define EC_STAT_ENUM(n) S_##n,
	EC_STATS(EC_STAT_ENUM)
#undef EC_STAT_ENUM
	S_END
};

/* Columns of a round's message table (client_lib/roundplan.py MSG_COLUMNS,
 * then the message id and type): one int64 row per message. */
enum {
	M_SHARD, M_DIR0, M_NT, M_KA, M_KB, M_NKEYS, M_VLEN, M_VOFF, M_MSGLEN,
	M_FRAMES, M_RFRAMES, M_ID, M_TYPE, M_NCOL
};

/* What a round returns in res[] (client_lib/native.py reads it). */
enum {
	R_KIND, R_SHARD, R_TABLE, R_STATUS, R_TRIES, R_TYPE, R_NMSG, R_BIG,
	R_ERRNO, R_ELAPSED_NS, R_NEXT_ID, R_NLAT, R_LARGEST, R_NCOL
};
enum { K_OK = 0, K_SHARD_ERROR = 1, K_GIVE_UP = 2, K_OS_ERROR = 3, K_INTERRUPTED = 4 };
/*
 * The longest one ppoll of a round waits (s) before the round goes back to
 * its caller, which runs the handlers of signals that came and resumes the
 * round at once: a signal that comes while the round is not in ppoll (Python's
 * C handler only sets a flag then) interrupts no ppoll, so without the slice a
 * Ctrl-C would wait for the round's retries (ppoll(2) describes the race;
 * blocking the signals instead would send a process-directed one to another
 * thread of the interpreter, which interrupts nothing either).
 */
#define EC_SIGNAL_SLICE_S 0.1

struct ec_round;
struct ec_ctx;
void embnic_client_abort(struct ec_ctx *c);

struct ec_rtt {
	double srtt;		/* < 0: no sample yet */
	double rttvar;
	double rto;
	double min_rtt;		/* < 0: no sample yet */
	int64_t samples;
};

struct ec_ctx {
	int fd;
	uint16_t client_id;
	uint32_t p;		/* body bytes per fragment at the MTU */
	int64_t window;
	int retries;
	double timeout_s, rto_min, rto_max;
	int tail_probes;
	int fixed_length;
	int nshards;
	struct sockaddr_in *dest;	/* per shard index */
	uint16_t *shard_ids;	/* per shard index: its id */
	struct ec_rtt *rtt;	/* [shard][3]: LOOKUP, UPDATE, SIZE */
	int64_t largest_answered;
	uint64_t stats[S_END];
	uint32_t late[EC_LATE];	/* probe ids after their round; 0: free */
	int late_head;
	/* receive and send scratch */
	uint8_t *rxbuf;
	struct mmsghdr rx[EC_RXB];
	struct iovec rxiov[EC_RXB];
	struct embnic_hdr txh[EC_TXB];
	struct iovec txiov[EC_TXB][5];
	struct mmsghdr tx[EC_TXB];
	struct ec_round *cur;	/* a round a signal interrupted, to resume */
};

enum { Q_QUEUED, Q_PENDING, Q_DONE, Q_REPLACED, Q_LATE };

struct ec_msg {
	uint32_t msg_id;
	uint8_t type;
	uint8_t probe;
	uint8_t state;
	int shard;
	uint16_t num_tables;
	uint32_t num_keys, value_len, msg_len;
	uint32_t frames, reply_frames;
	int64_t cost, datagram;
	const uint8_t *seg[3];
	uint64_t seglen[3];
	const uint8_t *dirp;	/* its directory (num_tables entries) */
	const uint64_t *keyp;	/* its keys (num_keys) */
	int64_t ka, kb;		/* rows: grouped keys ka..kb-1, or kidx[] */
	int64_t *kidx;		/* a repair's keys (grouped positions), or NULL */
	int64_t *kso;		/* a repair's row offsets in its reply (nk+1) */
	int root;		/* a repair: the round message it completes */
	double t_first, t_sent, deadline, rto, lost_at;
	int tries;
	int64_t seq0, seq;
	uint64_t got[4], dup[4];
	uint32_t ngot, ndup, rp, rfc;
	uint8_t *own;		/* a repair's or probe's body */
	int next;		/* next message in its shard's queue */
};

struct ec_round {
	struct ec_ctx *c;
	struct ec_msg *m;
	int n, cap;
	int *pend;		/* pending message indices, insertion order; -1: removed */
	int npend, cap_pend, live_pend;
	int *hash;		/* msg_id -> index, open addressing */
	uint32_t hmask;
	int *qhead, *qtail;	/* per shard: its queue */
	int64_t *inflight;
	int *probe_src;		/* per shard: message a probe follows, or -1 */
	int *probe_order;	/* shards due a probe, in insertion order */
	int nprobe;
	int64_t *partial, *ev;
	int any_partial;
	int *first_fired;
	int *done;
	int ndone, cap_done;
	int64_t live;
	int64_t seqs;
	uint32_t next_id;
	/* the caller's arrays */
	const uint64_t *keys;
	const int64_t *dst, *rb, *so;
	uint8_t *out;
	int record_latency;
	double *lat;
	int64_t nlat;
	int64_t *res;
	double t0;
};

/* A message's row k: its grouped position and its offset in the reply. */
static inline int64_t
row_pos(const struct ec_msg *m, int64_t k)
{
	return m->kidx ? m->kidx[k] : m->ka + k;
}

static inline int64_t
row_off(const struct ec_round *r, const struct ec_msg *m, int64_t k)
{
	return m->kidx ? m->kso[k] : r->so[m->ka + k] - r->so[m->ka];
}


/* Shared between the files (hidden: the library exports embnic_client_* only). */
#pragma GCC visibility push(hidden)
/* context.c */
double ec_mono(void);
struct ec_rtt *ec_rtt_of(const struct ec_ctx *c, int shard, uint8_t type);
void ec_rtt_sample(struct ec_ctx *c, struct ec_rtt *e, double r);
/* table.c */
int ec_find(const struct ec_round *r, uint32_t id);
int ec_add_msg(struct ec_round *r, uint32_t id);
uint32_t ec_alloc_id(struct ec_round *r);
int ec_pend_add(struct ec_round *r, int i);
void ec_pend_del(struct ec_round *r, int i, int state);
void ec_geometry(const struct ec_ctx *c, struct ec_msg *m);
void ec_late_add(struct ec_ctx *c, uint32_t id);
int ec_late_take(struct ec_ctx *c, uint32_t id);
/* frames.c */
int ec_send_msg(struct ec_round *r, int i, const int *list, int n, int retransmit);
int ec_drain(struct ec_round *r);
/* recovery.c */
int ec_fill(struct ec_round *r, int s);
int ec_after_drain(struct ec_round *r, double now);
int ec_fast_retransmit(struct ec_round *r);
int ec_probes_due(struct ec_round *r);
int ec_expire(struct ec_round *r, double now);
#pragma GCC visibility pop

#endif
