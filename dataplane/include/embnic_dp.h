/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic-dp: shared structs, constants and the functions each file exports
 * (the files by role: dataplane/README.md, "Files").
 */
#ifndef EMBNIC_DP_H
#define EMBNIC_DP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rte_common.h>
#include <rte_debug.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_hash.h>
#include <rte_hash_crc.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>

#include "embnic_limits.h"
#include "embnic_parse.h"
#include "embnic_proto.h"

#define EMBNIC_MAX_PORTS		8
#define EMBNIC_MAX_BURST		64	/* = RTE_HASH_LOOKUP_BULK_MAX */
#define EMBNIC_DEFAULT_BURST		32
#define EMBNIC_DEFAULT_RING_SIZE	4096
#define EMBNIC_ROUTE_TABLE_SIZE		4096
#define EMBNIC_CLIENT_TABLE_SIZE	4096
#define EMBNIC_DEFAULT_STATE_SIZE	65536
#define EMBNIC_DEFAULT_STATE_TIMEOUT_MS	5000
/* per-shard statistics: one slot per shard id ever routed, slot 0 the rest */
#define EMBNIC_SHARD_SLOTS		(EMBNIC_ROUTE_TABLE_SIZE + 1)
#define EMBNIC_LAT_BUCKETS		24	/* latency histogram buckets */
#define EMBNIC_DEFAULT_CTL_PATH		"/run/embnic/embnic-dp.sock"
#define EMBNIC_RX_DESC			1024
#define EMBNIC_TX_DESC			1024
#define EMBNIC_CARD_TTL			64
#define EMBNIC_MAX_MTU			16000	/* --mtu: a frame fits a 16-bit mbuf */
/* embnic_worker.txq[p]: the port has no TX queue for it (hand off) */
#define EMBNIC_TXQ_NONE			0xffff
/* seed of the partition hash (not the tables' 0: independent bits) */
#define EMBNIC_PART_SEED		0x9e3779b9u

extern volatile bool force_quit;

/*
 * The key of every hash table of the card (route, client, state map): 16
 * bytes, because rte_hash compares 16-byte keys with one vector compare and
 * other small lengths with memcmp(). Unused bytes are 0.
 */
struct embnic_key16 {
	uint64_t lo, hi;
};

static inline struct embnic_key16
embnic_key16(uint64_t lo)
{
	return (struct embnic_key16){ .lo = lo };
}

/*
 * The tables' hash function, rte_hash_crc(k, 16, 0), inlined: two CRC32C
 * steps instead of a call through the hash's function pointer per key
 * (embnic_key16_hash_create checks that both agree).
 */
static inline hash_sig_t
embnic_key16_hash(const struct embnic_key16 *k)
{
	return rte_hash_crc_8byte(k->hi, rte_hash_crc_8byte(k->lo, 0));
}

/*
 * A hash table of the card (route.c, state.c) of struct embnic_key16 keys;
 * extra_flag as rte_hash takes it. NULL with rte_errno set on failure.
 */
static inline struct rte_hash *
embnic_key16_hash_create(const char *name, uint32_t entries,
			 uint8_t extra_flag)
{
	struct rte_hash_parameters hp = {
		.name = name,
		.entries = entries,
		.key_len = sizeof(struct embnic_key16),
		.hash_func = rte_hash_crc,
		.hash_func_init_val = 0,
		.socket_id = (int)rte_socket_id(),
		.extra_flag = extra_flag,
	};
	struct embnic_key16 k = { .lo = 0x123456789abcdefULL, .hi = 42 };

	RTE_VERIFY(embnic_key16_hash(&k) == hp.hash_func(&k, sizeof(k), 0));
	return rte_hash_create(&hp);
}

/*
 * The state map partition of message (client_id, msg_id) among n state
 * lcores: CRC32C of the map's key with its own seed, reduced by
 * multiply-shift (its high bits, so a partition's own hash table, which
 * indexes by the low bits of another CRC, sees every bucket).
 */
static inline unsigned int
embnic_partition(uint16_t client_id, uint32_t msg_id, unsigned int n)
{
	uint32_t h = rte_hash_crc_8byte((uint64_t)client_id << 32 | msg_id,
					EMBNIC_PART_SEED);

	return (unsigned int)(((uint64_t)h * n) >> 32);
}

/* What sets the largest frame a port sends (struct embnic_port). */
enum embnic_frame_limit {
	EMBNIC_LIMIT_PMD = 0,		/* the PMD's max_rx_pktlen less the CRC */
	EMBNIC_LIMIT_FRAMESZ = 1,	/* net_af_packet's devarg framesz */
	EMBNIC_LIMIT_IF_MTU = 2,	/* the kernel interface's MTU */
};

/* A card port: DPDK port id, its MAC and the card's IPv4 on it. */
struct embnic_port {
	uint16_t id;
	struct rte_ether_addr mac;
	uint32_t ip;			/* network order, 0 = none */
	uint16_t nb_txq;		/* TX queues (embnic_txq_plan(), port.c) */
	/* the largest frame it sends, no CRC (port_frame_limit()); the TX
	 * stage drops a longer one (too_long_for_port) */
	uint32_t max_frame;
	uint8_t max_frame_by;		/* enum embnic_frame_limit */
	char name[64];
};

/* Where a shard (route table) or a client (client table) is reached. */
struct embnic_peer {
	uint32_t id;			/* shard id or client id */
	uint16_t port;			/* card port to send on */
	rte_be16_t udp_port;		/* network order */
	uint32_t ip;			/* network order */
	struct rte_ether_addr mac;
};

/*
 * The header ring carries mbuf pointers; the parsed header fields past the
 * frame's first cache line ride in an mbuf dynamic field, the rest is read
 * back from that line (README, "What crosses the ring").
 */
enum embnic_desc_kind {
	EMBNIC_DESC_MSG = 0,		/* an embnic frame to route */
	EMBNIC_DESC_ARP = 1,		/* an ARP reply to send back on m->port */
};

struct embnic_rx_meta {
	uint32_t num_keys;		/* embnic header, host order */
	uint32_t value_len;
	uint16_t frag_index;
	uint16_t frag_count;
	uint16_t frag_len;
	uint8_t kind;			/* enum embnic_desc_kind */
	uint8_t trim;			/* frame longer than 14 + IPv4 total
					 * length (padding) */
};
static_assert(sizeof(struct embnic_rx_meta) == 16, "rx meta is 16 bytes");

#define EMBNIC_RX_META_NAME	"embnic_dynfield_rx_meta"

/* The meta of m; off is the dynfield offset (app->meta_off). */
static inline struct embnic_rx_meta *
embnic_rx_meta(struct rte_mbuf *m, int off)
{
	return RTE_MBUF_DYNFIELD(m, off, struct embnic_rx_meta *);
}

/*
 * A header log of one lcore, written with no allocation and no lock, used
 * twice: the headers of the message frames an lcore forwarded (hlog), and
 * of every frame the RX stage put on a header ring, in ring order (rxlog;
 * ARP frames as msg_type 0). The ring has one producer, so entry i is the
 * i-th frame ever enqueued: those at or past ring_dequeued are still in
 * the ring. Entry i lives in e[i % EMBNIC_HLOG_SIZE]; the owner stores it,
 * then head = i + 1 (release); reader: ring_last (ctl.c).
 */
#define EMBNIC_HLOG_SIZE		256	/* slots, a power of 2 */
/* entries a reader gets: the slot of the oldest may be mid-overwrite */
#define EMBNIC_HLOG_KEEP		(EMBNIC_HLOG_SIZE - 1)
/* out_port of a ring log entry: not routed yet */
#define EMBNIC_HLOG_NO_PORT		0xff

struct embnic_hlog_entry {
	uint64_t tsc;			/* TX stage burst time */
	struct embnic_msg msg;		/* the header as the RX stage decoded
					 * it (msg.table_id: an ERROR's table,
					 * else 0xFFFF) */
	uint8_t in_port;		/* card port it came in on */
	uint8_t out_port;		/* card port it left on */
};
static_assert(sizeof(struct embnic_hlog_entry) == 56, "hlog entry is 56 bytes");
static_assert((EMBNIC_HLOG_SIZE & (EMBNIC_HLOG_SIZE - 1)) == 0,
	      "EMBNIC_HLOG_SIZE is a power of 2");

struct embnic_hlog {
	uint64_t head;			/* entries ever written */
	struct embnic_hlog_entry e[EMBNIC_HLOG_SIZE];
} __rte_cache_aligned;

/* Log msg (forwarded from in_port to out_port at tsc); owning lcore only. */
static inline void
embnic_hlog_put(struct embnic_hlog *l, const struct embnic_msg *m,
		uint16_t in_port, uint16_t out_port, uint64_t tsc)
{
	uint64_t h = l->head;
	struct embnic_hlog_entry *e = &l->e[h & (EMBNIC_HLOG_SIZE - 1)];

	e->tsc = tsc;
	e->msg = *m;
	e->in_port = (uint8_t)in_port;
	e->out_port = (uint8_t)out_port;
	__atomic_store_n(&l->head, h + 1, __ATOMIC_RELEASE);
}

/*
 * The counters, every one a u64, in the same order in an lcore's struct
 * and in the totals, so counters.c sums and subtracts them as one array.
 * drops: by port (the one it came in on; tx_full: the one it could not
 * leave by) and reason; too_long: too_long_for_port, by the port it was
 * for; completed: messages, by reply type.
 */
#define EMBNIC_COUNTER_FIELDS						\
	uint64_t rx_frames[EMBNIC_MAX_PORTS];				\
	uint64_t rx_bytes[EMBNIC_MAX_PORTS];				\
	uint64_t tx_frames[EMBNIC_MAX_PORTS];				\
	uint64_t tx_bytes[EMBNIC_MAX_PORTS];				\
	uint64_t too_long[EMBNIC_MAX_PORTS];				\
	uint64_t types[EMBNIC_NB_TYPES];	/* forwarded, by type */	\
	uint64_t drops[EMBNIC_MAX_PORTS][EMBNIC_DROP_MAX];		\
	uint64_t completed[EMBNIC_NB_TYPES];				\
	uint64_t arp_replies;						\
	uint64_t state_overflow;	/* adds that found the map full */	\
	uint64_t state_expired;		/* entries timed out unanswered */ \
	/* gauge: max count seen in a header ring this lcore enqueued to */ \
	uint64_t ring_high_water;

/* Counters of one lcore; only that lcore writes them (own cache lines). */
struct embnic_lcore_stats {
	EMBNIC_COUNTER_FIELDS
	struct embnic_hlog hlog;	/* forwarded headers (not a counter) */
} __rte_cache_aligned;

/* Frames to send on one port, with their lengths (a PMD may free a frame
 * as soon as it sent it). */
struct embnic_txq {
	uint16_t n;
	struct rte_mbuf *m[EMBNIC_MAX_BURST];
	uint32_t len[EMBNIC_MAX_BURST];
};

static inline void
embnic_txq_add(struct embnic_txq *q, struct rte_mbuf *m, uint32_t len)
{
	q->len[q->n] = len;
	q->m[q->n++] = m;
}

/* Send q on TX queue qid of port p, counted; what the PMD does not take is
 * freed and counted (tx_full). Empties q. */
static inline void
embnic_txq_send(uint16_t p, uint16_t qid, struct embnic_txq *q,
		struct embnic_lcore_stats *st)
{
	uint16_t sent = rte_eth_tx_burst(p, qid, q->m, q->n), i;
	uint64_t bytes = 0;

	for (i = 0; i < sent; i++)
		bytes += q->len[i];
	st->tx_frames[p] += sent;
	st->tx_bytes[p] += bytes;
	if (unlikely(sent < q->n)) {
		st->drops[p][EMBNIC_DROP_TX_FULL] += q->n - sent;
		rte_pktmbuf_free_bulk(&q->m[sent], q->n - sent);
	}
	q->n = 0;
}

/* What the control path reports: the sum over lcores minus the reset base. */
struct embnic_totals {
	EMBNIC_COUNTER_FIELDS
	uint64_t rx_nombuf[EMBNIC_MAX_PORTS];	/* from ethdev stats */
	uint64_t drop_sum[EMBNIC_DROP_MAX];	/* over every port */
};

struct embnic_state;
struct embnic_table;
struct embnic_ctl;

/* Options from the command line (docs/control-socket.md). */
struct embnic_opts {
	const char *ctl_path;
	uint32_t port_ip[EMBNIC_MAX_PORTS];	/* network order */
	uint32_t ring_size;
	uint32_t state_size;
	uint32_t state_timeout_ms;
	uint32_t burst;
	uint32_t idle_us;
	uint32_t nb_mbufs;
	uint32_t mtu;			/* 0: each port's default */
	uint32_t state_lcores;		/* state map partitions, one lcore each */
	bool paused;
};

/*
 * A state lcore: the TX stage over one partition of the state map, which
 * it alone touches (README, "Several state lcores"). It sends on TX queue
 * txq[p] of port p, or, where the port has no queue for it, hands its
 * frames (m->port: where to) through txr to the RX lcore (embnic_io_tx).
 */
struct embnic_worker {
	struct rte_ring *ring;		/* header ring: RX lcore -> this */
	struct rte_ring *txr;		/* this -> RX lcore; NULL: not needed */
	struct embnic_state *state;	/* its partition of the map */
	uint16_t txq[EMBNIC_MAX_PORTS];	/* its TX queue per port, or
					 * EMBNIC_TXQ_NONE: through txr */
	unsigned int lcore;
	unsigned int id;		/* partition index */
	/* written by this state lcore only */
	uint64_t next_expire_tsc __rte_cache_aligned;	/* next expiry step */
	/* frames taken off ring, ever (not reset) */
	uint64_t ring_dequeued;
	/* written by the RX lcore only: the ring log of ring (embnic_hlog) */
	struct embnic_hlog rxlog;
} __rte_cache_aligned;

/* The whole card. One instance, built by main(). */
struct embnic_app {
	struct embnic_opts opts;
	uint16_t nb_ports;
	struct embnic_port ports[EMBNIC_MAX_PORTS];
	struct rte_mempool *pool;
	int meta_off;			/* mbuf dynfield of struct embnic_rx_meta */
	struct embnic_table *routes;	/* shard -> peer */
	struct embnic_table *clients;	/* client -> peer */
	struct embnic_worker w[EMBNIC_MAX_STATE_LCORES];
	unsigned int nb_workers;	/* state lcores (opts.state_lcores) */
	struct embnic_ctl *ctl;
	struct rte_rcu_qsbr *qsbr;	/* readers of routes/clients */
	struct embnic_lcore_stats *stats;	/* [RTE_MAX_LCORE] */
	struct embnic_totals base;	/* counters at the last reset */
	struct embnic_shard_stats *shard_base;	/* [EMBNIC_SHARD_SLOTS] */
	/* shard id -> its statistics slot, assigned by route_add (ctl.c) */
	uint16_t shard_slot[UINT16_MAX + 1];
	uint32_t slot_shard[EMBNIC_SHARD_SLOTS];	/* slot -> shard id */
	uint32_t nb_slots;		/* slots in use, slot 0 included */
	/* rx_lcore: RX (and with several state lcores, TX); tx_lcore: state
	 * lcore 0's */
	unsigned int rx_lcore, tx_lcore, main_lcore, nb_lcores;
	volatile bool paused;		/* RX stage does not poll */
	volatile bool tx_paused;	/* TX stage does not dequeue */
	uint64_t tsc_hz;
	uint64_t start_tsc, start_ns;	/* for Unix-time timestamps */
	/* a port is net_af_xdp: every mbuf one page (port.c) */
	bool page_per_mbuf;
};

/* port.c: the ports and the mbuf pool, set up by main() */
int embnic_txq_plan(struct embnic_app *app, uint16_t *nb_txq);
int embnic_port_init(struct embnic_app *app, uint16_t port, uint16_t nb_txq);
uint32_t embnic_af_xdp_max_frame(void);
/* The mbuf pool for app's ports and lcores; NULL with rte_errno set. */
struct rte_mempool *embnic_pool_create(struct embnic_app *app);
/*
 * The rings of app's nb_workers state lcores, their state map partitions
 * (part_size entries each), the route and client tables, the counters:
 * 0 or -ENOMEM. embnic_tables_free() frees what was made, with the mbufs
 * left in the rings (after the lcores stopped).
 */
int embnic_tables_init(struct embnic_app *app, uint32_t route_size,
		       uint32_t client_size, uint32_t part_size);
void embnic_tables_free(struct embnic_app *app);

/* rx.c: one burst from every port (embnic_rx_port on each) */
unsigned int embnic_rx_stage(struct embnic_app *app,
			     struct embnic_lcore_stats *st);
/* One burst from port p through the RX stage; returns frames received. */
unsigned int embnic_rx_port(struct embnic_app *app, uint16_t p,
			    struct embnic_lcore_stats *st);
/*
 * The RX lcore sends what the state lcores on other lcores handed back
 * (their txr rings) on queue 0 of each port; returns frames dequeued.
 */
unsigned int embnic_io_tx(struct embnic_app *app,
			  struct embnic_lcore_stats *st);

/* tx.c */
unsigned int embnic_tx_stage(struct embnic_app *app, struct embnic_worker *w,
			     struct embnic_lcore_stats *st);
/* State lcore w's TX stage on a burst it dequeued (n <= 64) at TSC tsc. */
void embnic_tx_burst(struct embnic_app *app, struct embnic_worker *w,
		     struct embnic_lcore_stats *st, struct rte_mbuf **pkts,
		     unsigned int n, uint64_t tsc);

/* route.c: route and client tables share one implementation. */
struct embnic_table *embnic_table_create(const char *name, uint32_t size,
					 struct rte_rcu_qsbr *qsbr);
void embnic_table_free(struct embnic_table *t);
int embnic_table_add(struct embnic_table *t, const struct embnic_peer *p);
int embnic_table_del(struct embnic_table *t, uint32_t id);
void embnic_table_lookup_bulk(struct embnic_table *t, const uint32_t *ids,
			      unsigned int n, const struct embnic_peer **out);
/* Up to max entries, sorted by id, into out (control path); how many. */
unsigned int embnic_table_copy(struct embnic_table *t, struct embnic_peer *out,
			       unsigned int max);
uint32_t embnic_table_count(const struct embnic_table *t);
uint32_t embnic_table_size(const struct embnic_table *t);

/* state.c: the message state map */
enum embnic_msg_state {
	EMBNIC_ST_FREE = 0,
	EMBNIC_ST_RECEIVING = 1,	/* some request fragments passed */
	EMBNIC_ST_FORWARDED = 2,	/* every request fragment passed */
	EMBNIC_ST_REPLYING = 3,		/* some reply fragments passed */
};
#define EMBNIC_NB_STATES 4
const char *embnic_state_name(unsigned int s);

/* One message as the control path sees it (a copy). */
struct embnic_state_view {
	uint16_t client_id, shard_id, num_tables;
	uint8_t state, msg_type, rep_type;
	uint32_t msg_id, msg_len, num_keys, value_len;
	uint16_t frag_count, rep_frag_count;
	uint16_t frags_in, frags_out;	/* distinct fragments seen */
	uint16_t frames_in, frames_out;	/* frames passed, duplicates too */
	uint32_t bytes_in, bytes_out;	/* body bytes of distinct fragments */
	uint64_t first_tsc, last_tsc;
};

/*
 * What completed and expired messages leave behind, per shard: messages
 * completed by reply type, expired ones, and the latency from the request's
 * first frame to the reply's last (bucket 0: < 1 us; bucket i: [2^(i-1),
 * 2^i) us; the last: >= 2^(EMBNIC_LAT_BUCKETS-2) us).
 */
struct embnic_shard_stats {
	uint64_t completed[EMBNIC_NB_TYPES];
	uint64_t expired;
	uint64_t latency_sum_ns;
	uint64_t latency_hist[EMBNIC_LAT_BUCKETS];
};

struct embnic_state_summary {
	uint32_t entries, capacity;
	uint32_t by_state[EMBNIC_NB_STATES];
};

/*
 * Partition part of the map (part names its hash table), size entries;
 * shard_slot: the app's shard id -> statistics slot table (read only).
 */
struct embnic_state *embnic_state_create(unsigned int part, uint32_t size,
					 uint32_t timeout_ms, uint64_t tsc_hz,
					 const uint16_t *shard_slot);
void embnic_state_free(struct embnic_state *s);
/*
 * Account a burst of validated, authorised frames in order (TX stage lcore
 * only); now is the TSC. verdict[i] is set to 0 (send) or a drop reason
 * (state_full, frag_mismatch, unsolicited_reply, wrong_shard_reply,
 * wrong_reply_type, bad_reply_len). Completed/overflow counters go to st.
 */
void embnic_state_update_burst(struct embnic_state *s,
			       const struct embnic_msg *const *msgs,
			       unsigned int n, uint64_t now, int *verdict,
			       struct embnic_lcore_stats *st);
/* Expire a slice of the map; call often from the TX stage lcore. */
void embnic_state_expire_step(struct embnic_state *s, uint64_t now,
			      struct embnic_lcore_stats *st);
/*
 * Forget every entry and the per-shard statistics of slots 0..nb_slots-1
 * (the app's nb_slots: the others were never written), so the map is as
 * created; the TX stage must not run meanwhile (tests, the fuzz target).
 */
void embnic_state_reset(struct embnic_state *s, uint32_t nb_slots);

/* state.c: the map as the control path reads it */
/*
 * Entries in use and capacity (cheap: no scan); with by_state also the
 * count per state (scans the whole map: control path only).
 */
void embnic_state_summarise(const struct embnic_state *s, bool by_state,
			    struct embnic_state_summary *sum);
/* Copies up to max live entries into out; returns how many. */
unsigned int embnic_state_dump(const struct embnic_state *s,
			       struct embnic_state_view *out, unsigned int max);
/*
 * Walk the whole map and check it against its counts, its hash and its
 * bitmaps (what is checked: state.c). 0, or -1 with what is wrong in
 * err (errlen bytes). The TX stage must not run meanwhile.
 */
int embnic_state_check(const struct embnic_state *s, char *err,
		       size_t errlen);
/* The per-shard statistics, [EMBNIC_SHARD_SLOTS] (control path reads). */
const struct embnic_shard_stats *
embnic_state_shard_stats(const struct embnic_state *s);

/*
 * A writer of records of named u64 values, one level deep: the counters are
 * walked once (counters.c) and written through it as JSON (ctl.c) or as DPDK
 * telemetry (counters.c), so both say the same thing under the same names.
 */
struct embnic_emit {
	/* Start record name at the top level (NULL: back to the top level). */
	void (*record)(void *ctx, const char *name);
	/*
	 * Start element index of the list list (JSON: an array of records;
	 * telemetry: a record named item followed by the index, "port0").
	 */
	void (*item)(void *ctx, const char *list, const char *item,
		     unsigned int index);
	/* A value in the current record. */
	void (*u64)(void *ctx, const char *key, uint64_t v);
	/*
	 * A list of n values in the current record (telemetry, which nests
	 * one level only, writes key_0 .. key_<n-1> inside a record).
	 */
	void (*list)(void *ctx, const char *key, const uint64_t *v,
		     unsigned int n);
	void *ctx;
};

/* counters.c */
const char *embnic_type_name(unsigned int t);	/* "LOOKUP_REQ", ... */
/* "pmd", "framesz", "interface_mtu" (enum embnic_frame_limit) */
const char *embnic_frame_limit_name(unsigned int l);
/* Entries of all header rings into *size, how many are queued now *count. */
void embnic_ring_use(const struct embnic_app *app, unsigned int *size,
		     unsigned int *count);
void embnic_counters_reset(struct embnic_app *app);
/*
 * The statistics slot of shard id (route_add, control path): assigned on
 * first use, kept for the card's life; 0 (shared) once all are taken.
 */
uint16_t embnic_shard_slot_assign(struct embnic_app *app, uint32_t id);
/*
 * The records of docs/control-socket.md's "counters", the record of
 * "ring_stats" or that of "state_summary" (all partitions); walk 0: none.
 */
enum embnic_walk { EMBNIC_WALK_COUNTERS = 1, EMBNIC_WALK_RING, EMBNIC_WALK_STATE };
void embnic_counters_emit(const struct embnic_app *app, enum embnic_walk what,
			  const struct embnic_emit *e);
int embnic_telemetry_init(struct embnic_app *app);

/* ctl.c: the control socket behind an opaque struct. */
struct embnic_ctl;
/*
 * Serve the control socket at path for app; NULL with errno set on
 * failure (embnic_conn_init). path NULL: no socket, requests only through
 * embnic_ctl_request() (tests, the fuzz target).
 */
struct embnic_ctl *embnic_ctl_init(struct embnic_app *app, const char *path);
/*
 * Answer one request line (len bytes, no newline, need not be
 * NUL-terminated) as the socket does: a malloc'ed NUL-terminated JSON
 * object, or NULL if out of memory. A refused request ("ok": false)
 * changes no table.
 */
char *embnic_ctl_request(struct embnic_ctl *c, const char *line, size_t len);
/* Serve pending connections and requests; waits up to timeout_ms. */
void embnic_ctl_poll(struct embnic_ctl *ctl, int timeout_ms);
void embnic_ctl_free(struct embnic_ctl *ctl);

#endif /* EMBNIC_DP_H */
