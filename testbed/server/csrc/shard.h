/* SPDX-License-Identifier: Apache-2.0
 *
 * The parameter-server shard's C library (the package's libembnic_shard): what
 * its files share. Python (testbed/server/canswer.py) fills the
 * structs below as numpy structured arrays with the same layout: every field
 * 8 bytes wide, offsets pinned by the static_asserts here and checked from
 * Python against embnic_shard_layout() before the library is used.
 *
 *   intake.c  header checks, grouping of fragments by message
 *   answer.c  lookups answered (directory, checks, one gather, reply
 *             frames), reply frames of any type, the transmit queue
 *   send.c    the queue sent: sendmmsg, multi-frame replies as UDP GSO
 *
 * No allocation and no locks anywhere: every buffer is the caller's.
 */
#ifndef EMBNIC_SHARD_H
#define EMBNIC_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "embnic_proto.h"
#include "store.h"	/* the row store (client_lib/csrc/store.c) */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the shard library copies little-endian bodies (keys, rows) as they are"
#endif

/* field indices of a row of cols (int64 header fields), in the order of EMBNIC_HDR_FIELDS */
enum {
#define EMBNIC_F_INDEX(f, off, size) F_##f,
	EMBNIC_HDR_FIELDS(EMBNIC_F_INDEX)
#undef EMBNIC_F_INDEX
	F_END
};

/* a header field of size bytes between host and network order (either way) */
#define HDR_SWAP(x, size) \
	((size) == 1 ? (x) : (size) == 2 ? embnic_ntoh16((uint16_t)(x)) : embnic_ntoh32((uint32_t)(x)))

/* What the shard knows about table ids (ShardState's per-table-id arrays,
 * 65536 entries each) and its place in the cluster. */
struct embnic_shard_tables {
	const int64_t *dim;	/* -1: no such table */
	const int64_t *dtype;	/* the table's wire dtype */
	const uint64_t *rows;	/* its rows bound ... */
	const uint8_t *has_rows;	/* ... if it has one */
	const uint8_t *owns_all;	/* every key of the table is this shard's */
	const int64_t *li;	/* local index in the store; -1: not in it */
	const int64_t *shard_ids;	/* hash sharding: shard id of each index */
	int64_t nshards;
	int64_t hash_sharding;	/* owner of key k of table t: splitmix64 */
	int64_t shard_id;
};

/* Counters of the C path, cumulative (added to the engine's counters). */
enum {
	EMBNIC_ST_RX_FRAMES,	/* request frames answered here */
	EMBNIC_ST_RX_BYTES,
	EMBNIC_ST_MESSAGES,	/* lookups answered from the receive buffer */
	EMBNIC_ST_WHOLE,	/* of them of several fragments, gathered whole */
	EMBNIC_ST_LOOKUP_KEYS,
	EMBNIC_ST_TX_FRAMES,	/* frames handed to sendmmsg (every reply) */
	EMBNIC_ST_TX_BYTES,
	EMBNIC_ST_SEND_CALLS,
	EMBNIC_ST_GSO_SENDS,
	EMBNIC_ST_SEND_ERRORS,
	EMBNIC_ST_GSO_FALLBACKS,
	EMBNIC_ST_SENT_FRAMES,
	EMBNIC_ST_ANSWERED,	/* lookups the engine reassembled, answered here */
	EMBNIC_NB_ST = 16
};

/*
 * One shard's C answer path: its buffers, where the transmit queue stands,
 * its counters. Fields marked (io) are read and written by both sides.
 */
struct embnic_answer {
	/* receive: the batch socket's buffers, the check's outputs */
	const uint8_t *rx;	/* n x slot bytes */
	int64_t slot;
	const int64_t *lens;
	const uint8_t *names;	/* n x 16: source sockaddr_in */
	int64_t *cols;		/* n x 19 header fields */
	uint8_t *ok;
	int64_t *p;
	int64_t *order;		/* grouping scratch (batch) */
	int64_t *grp;		/* batch x 6 */
	uint8_t *taken;		/* per frame: answered here */
	int64_t *mg;		/* scratch (batch): multi-fragment frames */
	/* transmit: frames (tx_cap x width) and the reply queue (rq_cap) */
	uint8_t *tx;
	int64_t *txlen;
	int64_t width;		/* EMBNIC_HDR_LEN + P */
	int64_t tx_cap;
	int64_t ntx;		/* (io) rows in use */
	int64_t *rq_idx;	/* the datagram that completed the request */
	int64_t *rq_start;	/* first row */
	int64_t *rq_count;	/* rows */
	uint8_t *rq_name;	/* rq_cap x 16: destination sockaddr_in */
	int64_t rq_cap;
	int64_t nrq;		/* (io) replies queued */
	int64_t *rq_order;	/* send scratch (rq_cap) */
	/* scratch for a whole request body and a reply body */
	uint8_t *req_buf;
	int64_t req_cap;
	uint8_t *rep_buf;
	int64_t rep_cap;
	uint8_t *work;		/* EMBNIC_SHARD_WORK bytes: a lookup's keys sorted */
	/* configuration */
	const struct embnic_shard_tables *tables;
	const struct embnic_store *store;
	int64_t P;		/* body bytes per frame */
	int64_t max_msg;	/* largest request body taken */
	int64_t max_reply;	/* largest lookup reply (value_len) */
	int64_t shard_id;
	int64_t pending_empty;	/* (io) 1: no message is being reassembled */
	int64_t serve;		/* 1: answer lookups here (else only check) */
	/* send */
	int64_t fd;
	int64_t gso;		/* (io) 0 once the kernel refused GSO */
	uint8_t *mmsg;		/* send_cap x 64: struct mmsghdr */
	uint8_t *iov;		/* send_cap x 16 */
	uint8_t *cmsg;		/* send_cap x 24 */
	int64_t send_cap;
	int64_t stats[EMBNIC_NB_ST];
};

/* bytes of struct embnic_answer's work buffer: 4096 sorted key records and
 * their scratch (16 bytes each), 4096 table segments (48), run bounds (4) */
#define EMBNIC_SHARD_WORK (4096 * (16 + 16 + 48) + 4 * 4097)

/* A reply the caller decided (an ERROR, an ack, a NACK, rows it gathered):
 * its frames are built by embnic_shard_emit(). */
struct embnic_reply_spec {
	int64_t idx;		/* the datagram that completed the request */
	const uint8_t *body;	/* NULL: none */
	int64_t body_len;
	uint32_t msg_id;
	uint16_t client_id;
	uint16_t num_tables;
	uint32_t num_keys;
	uint32_t value_len;
	uint16_t status;
	uint16_t table_id;
	uint8_t msg_type;
	uint8_t pad[3];
	uint8_t name[16];	/* destination sockaddr_in */
};

static_assert(sizeof(struct embnic_shard_tables) == 10 * 8, "embnic_shard_tables layout");
static_assert(offsetof(struct embnic_answer, stats) == 42 * 8, "embnic_answer layout");
static_assert(sizeof(struct embnic_answer) == (42 + EMBNIC_NB_ST) * 8, "embnic_answer layout");
static_assert(sizeof(struct embnic_reply_spec) == 64, "embnic_reply_spec layout");
static_assert(offsetof(struct embnic_reply_spec, name) == 48, "embnic_reply_spec layout");

/* intake.c */
int embnic_shard_check(const uint8_t *rx, int64_t slot, const int64_t *lens, int n, int64_t shard_id,
		       int64_t max_msg, int64_t max_reply, int64_t *cols, uint8_t *ok, int64_t *p);
int embnic_shard_whole(const int64_t *cols, const int64_t *p, const int64_t *mg, int m, int64_t *order,
		       int64_t *grp);

#endif /* EMBNIC_SHARD_H */
