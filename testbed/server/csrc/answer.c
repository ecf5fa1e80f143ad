/* SPDX-License-Identifier: Apache-2.0
 *
 * The shard's answer path in C: lookups answered straight from the receive
 * buffer, reply frames of any type for what the serving loop decided, all into
 * one transmit queue that send.c sends. What is answered here, and why a
 * lookup always sees exactly the updates that came before it: docs/server.md,
 * "The answer path in C"; anything else is left to the serving loop and the
 * state's rules (testbed/server/shard_state.py). Its numpy oracle is
 * tests/testbed/shard_oracle.py.
 */
#include <math.h>
#include <string.h>

#include "shard.h"

/* a little-endian field of n bytes (the host is little-endian: shard.h) */
static inline uint64_t
le(const uint8_t *b, size_t n)
{
	uint64_t v = 0;

	memcpy(&v, b, n);
	return v;
}

#define le16(b) ((uint16_t)le((b), 2))
#define le64(b) le((b), 8)

/* what Python checks the structs against (canswer.py) */
void
embnic_shard_layout(int64_t *out)
{
	out[0] = (int64_t)sizeof(struct embnic_answer);
	out[1] = (int64_t)offsetof(struct embnic_answer, stats);
	out[2] = (int64_t)sizeof(struct embnic_store);
	out[3] = (int64_t)sizeof(struct embnic_shard_tables);
	out[4] = (int64_t)sizeof(struct embnic_reply_spec);
	out[5] = EMBNIC_NB_ST;
	out[6] = EMBNIC_SHARD_WORK;
}

/*
 * The header of one reply frame (codec.encode_reply): every field of host
 * (host order) written in network byte order, field by field as the one
 * field table (EMBNIC_HDR_FIELDS) lists them.
 */
static void
put_header(uint8_t *f, const struct embnic_hdr *host)
{
	struct embnic_hdr h;

#define PUT_FIELD(name, off, size) h.name = (__typeof__(h.name))HDR_SWAP(host->name, size);
	EMBNIC_HDR_FIELDS(PUT_FIELD)
#undef PUT_FIELD
	memcpy(f, &h, sizeof(h));
}

static inline int64_t
frames_of(const struct embnic_answer *a, int64_t body_len)
{
	return body_len <= a->P ? 1 : (body_len + a->P - 1) / a->P;
}

/*
 * The frames of one reply (body_len bytes of body cut at P) into the
 * transmit buffer and the reply onto the queue, to name (a sockaddr_in),
 * in the order of datagram idx. Returns the frames written; -1 when the
 * buffer or the queue is full (nothing written).
 */
static int64_t
embnic_shard_reply_frames(struct embnic_answer *a, int64_t idx, const uint8_t *name, uint8_t msg_type,
			  uint16_t status, uint16_t table_id, uint32_t msg_id, uint16_t client_id,
			  uint16_t num_tables, uint32_t num_keys, uint32_t value_len, const uint8_t *body,
			  int64_t body_len)
{
	int64_t count = frames_of(a, body_len);
	int64_t row = a->ntx;
	struct embnic_hdr h = {
		.magic = EMBNIC_MAGIC, .version = EMBNIC_PROTO_VERSION, .msg_type = msg_type, .status = status,
		.msg_id = msg_id, .client_id = client_id, .shard_id = (uint16_t)a->shard_id,
		.num_tables = num_tables, .table_id = table_id, .num_keys = num_keys, .value_len = value_len,
		.msg_len = (uint32_t)body_len, .frag_count = (uint16_t)count,
	};

	if (row + count > a->tx_cap || a->nrq >= a->rq_cap)
		return -1;
	for (int64_t i = 0; i < count; i++) {
		uint8_t *f = a->tx + (row + i) * a->width;
		int64_t at = i * a->P;
		int64_t len = i + 1 < count ? a->P : body_len - at;

		h.frag_offset = (uint32_t)at;
		h.frag_index = (uint16_t)i;
		h.frag_len = (uint16_t)len;
		put_header(f, &h);
		if (len > 0)
			memcpy(f + EMBNIC_HDR_LEN, body + at, (size_t)len);
		a->txlen[row + i] = EMBNIC_HDR_LEN + len;
	}
	a->rq_idx[a->nrq] = idx;
	a->rq_start[a->nrq] = row;
	a->rq_count[a->nrq] = count;
	memcpy(a->rq_name + a->nrq * 16, name, 16);
	a->nrq++;
	a->ntx = row + count;
	return count;
}

/*
 * Replies the caller decided (struct embnic_reply_spec, k of them) into the
 * queue. Returns 0; or -rows when the transmit buffer lacks room for all of
 * them (nothing written: grow it to ntx + rows and call again).
 */
int64_t
embnic_shard_emit(struct embnic_answer *a, const struct embnic_reply_spec *specs, int64_t k)
{
	int64_t need = 0;

	for (int64_t j = 0; j < k; j++)
		need += frames_of(a, specs[j].body_len);
	if (a->ntx + need > a->tx_cap || a->nrq + k > a->rq_cap)
		return -need;
	for (int64_t j = 0; j < k; j++) {
		const struct embnic_reply_spec *s = &specs[j];

		embnic_shard_reply_frames(a, s->idx, s->name, s->msg_type, s->status, s->table_id, s->msg_id,
					  s->client_id, s->num_tables, s->num_keys, s->value_len, s->body,
					  s->body_len);
	}
	return 0;
}

/* directory entry t of a request body: little-endian, as the host (shard.h) */
static inline struct embnic_dir_entry
dir_at(const uint8_t *body, int64_t t)
{
	struct embnic_dir_entry d;

	memcpy(&d, body + t * EMBNIC_DIR_ENTRY, sizeof(d));
	return d;
}

/* a lookup request's header fields this file reads */
struct lookup {
	uint32_t msg_id;
	uint16_t client_id;
	uint16_t num_tables;
	uint32_t num_keys;
	uint32_t value_len;
};

/*
 * Does the directory of a lookup add up (codec.parse_request_body) and may
 * every table of it be answered from the store (ShardState.table_fault's
 * table rules: known, dim and dtype as configured; and held in the store)?
 */
static int
directory_ok(const struct embnic_answer *a, const uint8_t *body, const struct lookup *q)
{
	const struct embnic_shard_tables *tb = a->tables;
	int64_t T = q->num_tables;
	uint64_t keys = 0, bytes = 0;
	uint64_t seen[1024];	/* table ids, for a directory of many tables */

	if (T > 16)
		memset(seen, 0, sizeof(seen));
	for (int64_t t = 0; t < T; t++) {
		struct embnic_dir_entry d = dir_at(body, t);

		if (d.num_keys == 0 || d.dim == 0 ||
		    (d.dtype != EMBNIC_DTYPE_FP32 && d.dtype != EMBNIC_DTYPE_FP16))
			return 0;
		if (T > 16) {
			if (seen[d.table_id >> 6] & (1ULL << (d.table_id & 63)))
				return 0;
			seen[d.table_id >> 6] |= 1ULL << (d.table_id & 63);
		} else {
			for (int64_t u = 0; u < t; u++)
				if (dir_at(body, u).table_id == d.table_id)
					return 0;
		}
		if (tb->dim[d.table_id] != d.dim || tb->dtype[d.table_id] != d.dtype || tb->li[d.table_id] < 0)
			return 0;
		keys += d.num_keys;
		bytes += (uint64_t)d.num_keys * d.dim * (d.dtype == EMBNIC_DTYPE_FP32 ? 4 : 2);
	}
	return keys == q->num_keys && bytes == q->value_len;
}

/* may this shard answer key k of table tid (range and owner)? */
static inline int
key_ok(const struct embnic_shard_tables *tb, uint16_t tid, uint64_t k)
{
	if (tb->has_rows[tid] && k >= tb->rows[tid])
		return 0;
	if (tb->owns_all[tid])
		return 1;
	if (!tb->hash_sharding || tb->nshards <= 0)
		return 0;
	uint64_t h = embnic_splitmix64(k ^ ((uint64_t)tid << 48));

	return tb->shard_ids[h % (uint64_t)tb->nshards] == tb->shard_id;
}

/* float16 bits -> its float32 value (exact) */
static inline float
f16_value(uint16_t h)
{
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, f;
	float v;

	if (e == 0) {	/* zero or subnormal: m * 2^-24 */
		v = (float)m * 0x1p-24f;
		return (h & 0x8000u) ? -v : v;
	}
	f = ((uint32_t)(h & 0x8000u) << 16) | (e == 0x1fu ? 0x7f800000u : (e + 112u) << 23) | (m << 13);
	memcpy(&v, &f, 4);
	return v;
}

/*
 * May an update (its whole body of body_len bytes; the header's num_tables,
 * num_keys and value_len) be applied as it is, without the state's table
 * rules (ShardState.table_fault, store_fault)? 1 when the body is exactly the
 * directory, the keys and the values, the directory adds up (directory_ok:
 * every table known, of its dim and dtype, in the row store, once), every
 * key is in range and this shard's (key_ok), each table's keys strictly
 * increase (none repeats), and every gradient value is below its table's
 * bound in magnitude (gbound: float64 per table id, ShardState._tgbound:
 * below it gradient_rows_ok refuses no row; NaN and inf are not below it).
 * 0: the state's rules decide (an error, or an update they still take: keys
 * not in order but distinct, gradients near the bound). Reads
 * body[0..body_len) only.
 */
int64_t
embnic_shard_update_ok(const struct embnic_answer *a, const uint8_t *body, int64_t body_len, int64_t num_tables,
		       int64_t num_keys, int64_t value_len, const double *gbound)
{
	const struct embnic_shard_tables *tb = a->tables;
	struct lookup q = { 0, 0, (uint16_t)num_tables, (uint32_t)num_keys, (uint32_t)value_len };
	const uint8_t *kp, *vp;

	if (num_tables <= 0 || num_tables > 0xffff || num_keys < 0 || num_keys > 0xffffffffLL || value_len < 0 ||
	    value_len > 0xffffffffLL || body_len != num_tables * EMBNIC_DIR_ENTRY + num_keys * 8 + value_len ||
	    !directory_ok(a, body, &q))
		return 0;
	kp = body + num_tables * EMBNIC_DIR_ENTRY;
	vp = kp + num_keys * 8;
	for (int64_t t = 0; t < num_tables; t++) {
		struct embnic_dir_entry d = dir_at(body, t);
		int64_t nv = (int64_t)d.num_keys * d.dim;
		double b = gbound[d.table_id];
		uint64_t prev = 0;

		for (int64_t i = 0; i < d.num_keys; i++, kp += 8) {
			uint64_t k = le64(kp);

			if ((i && k <= prev) || !key_ok(tb, d.table_id, k))
				return 0;
			prev = k;
		}
		for (int64_t j = 0; j < nv; j++) {
			float v;

			if (d.dtype == EMBNIC_DTYPE_FP32)
				memcpy(&v, vp + j * 4, 4);
			else
				v = f16_value(le16(vp + j * 2));
			if (!((double)fabsf(v) < b))
				return 0;
		}
		vp += nv * (d.dtype == EMBNIC_DTYPE_FP32 ? 4 : 2);
	}
	return 1;
}

#define GATHER_CHUNK 256	/* keys searched before their rows are copied */
#define GATHER_WINDOW 4096	/* keys sorted together (a->work holds them) */
static_assert(GATHER_WINDOW * (16 + 16 + 48) + 4 * (GATHER_WINDOW + 1) == EMBNIC_SHARD_WORK, "work buffer");
#define PREFETCH 16		/* rows ahead */

/* dim values of a float32 row as wire fp32 (little-endian, as stored) */
static inline void
copy_row(uint8_t *out, const float *w, int64_t bytes)
{
	switch (bytes) {	/* constant sizes: inlined moves, no call */
	case 16:
		memcpy(out, w, 16);
		return;
	case 32:
		memcpy(out, w, 32);
		return;
	case 64:
		memcpy(out, w, 64);
		return;
	case 128:
		memcpy(out, w, 128);
		return;
	default:
		memcpy(out, w, (size_t)bytes);
	}
}

/* a directory entry (table) of the keys of a window */
struct kseg {
	int64_t li;		/* the table's local index in the store */
	int64_t dim;
	int64_t dtype;
	int64_t rowb;		/* bytes of a row on the wire */
	int64_t first;		/* index of its first key among the message's */
	int64_t out;		/* byte offset of its first row in the reply body */
};

/*
 * The rows of the keys r[0..n) (sorted by composite key; why: docs/server.md,
 * "The answer path in C") into the reply body out, each at its place, in its
 * table's wire dtype: a chunk of keys at a time, its slots (embnic_store_slots),
 * then its rows, each prefetched PREFETCH rows ahead (rows lie in the arena in
 * the order they were first updated, not by key).
 */
static void
gather(const struct embnic_store *s, const struct kseg *sg, const struct embnic_krec *r, int64_t n, const uint8_t *kp,
       uint8_t *out)
{
	int64_t hint[2] = { 0, 0 };
	int64_t slot[GATHER_CHUNK];

	for (int64_t c0 = 0; c0 < n; c0 += GATHER_CHUNK) {
		int64_t k = n - c0 < GATHER_CHUNK ? n - c0 : GATHER_CHUNK;
		const struct embnic_krec *rc = r + c0;

		embnic_store_slots(s, &sg[0].li, sizeof(*sg) / 8, rc, k, slot, hint);
		for (int64_t i = 0; i < k; i++) {
			const struct kseg *g = &sg[rc[i].seg];
			uint8_t *o = out + g->out + ((int64_t)rc[i].i - g->first) * g->rowb;

			if (i + PREFETCH < k && slot[i + PREFETCH] >= 0)
				__builtin_prefetch(s->vals + (s->off ? s->off[slot[i + PREFETCH]] :
								   slot[i + PREFETCH] * s->dim));
			if (slot[i] >= 0 && g->dtype == EMBNIC_DTYPE_FP32)
				copy_row(o, s->vals + (s->off ? s->off[slot[i]] : slot[i] * s->dim), g->rowb);
			else
				embnic_store_row(s, g->li, le64(kp + (int64_t)rc[i].i * 8), slot[i], g->dim, g->dtype, o);
		}
	}
}

/*
 * gather() the keys r[0..n) in index order: as they are when they come in at
 * most two ascending runs (one table; a run broken where key + salt wraps:
 * each run gathered in turn), else sorted first (several tables, whose keys
 * interleave in the index).
 */
static void
gather_sorted(const struct embnic_store *s, const struct kseg *sg, struct embnic_krec *r, struct embnic_krec *tmp, int64_t n,
	      int32_t *runs, const uint8_t *kp, uint8_t *out)
{
	int64_t cut = 0;	/* where the second run starts; 0: one run */

	for (int64_t i = 1; i < n; i++) {
		if (r[i].c >= r[i - 1].c)
			continue;
		if (cut > 0) {	/* a third run: all of them sorted, one run */
			embnic_sort_recs(r, tmp, n, runs);
			cut = 0;
			break;
		}
		cut = i;
	}
	gather(s, sg, r + cut, n - cut, kp, out);
	gather(s, sg, r, cut, kp, out);	/* none when cut is 0 */
}

/*
 * The rows of every key of a lookup (its directory at body, its keys at kp)
 * into out: the keys a window of at most GATHER_WINDOW at a time, each
 * window's keys sorted by their place in the index, then gathered.
 */
static void
gather_message(struct embnic_answer *a, const uint8_t *body, int64_t T, const uint8_t *kp, uint8_t *out)
{
	const struct embnic_store *s = a->store;
	struct embnic_krec *r = (struct embnic_krec *)a->work;
	struct embnic_krec *tmp = r + GATHER_WINDOW;
	struct kseg *sg = (struct kseg *)(tmp + GATHER_WINDOW);
	int32_t *runs = (int32_t *)(sg + GATHER_WINDOW);
	int64_t t = 0, in_t = 0, first = 0, at = 0, i = 0;	/* directory entry, keys of it done, ... */
	struct embnic_dir_entry d = dir_at(body, 0);

	while (t < T) {
		int64_t n = 0, ns = 0;

		while (t < T && n < GATHER_WINDOW) {	/* keys of entries t.. into the window */
			int64_t li = a->tables->li[d.table_id];
			uint64_t salt = s->ct ? s->tsalt[li] : 0;
			int64_t rowb = (int64_t)d.dim * (d.dtype == EMBNIC_DTYPE_FP32 ? 4 : 2);
			int64_t take = (int64_t)d.num_keys - in_t;

			if (take > GATHER_WINDOW - n)
				take = GATHER_WINDOW - n;
			sg[ns] = (struct kseg){ li, d.dim, d.dtype, rowb, first, at };
			for (int64_t j = 0; j < take; j++, i++, n++)
				r[n] = (struct embnic_krec){ le64(kp + i * 8) + salt, (uint32_t)ns, (uint32_t)i };
			ns++;
			in_t += take;
			if (in_t == d.num_keys) {	/* the next directory entry */
				first += d.num_keys;
				at += (int64_t)d.num_keys * rowb;
				in_t = 0;
				if (++t < T)
					d = dir_at(body, t);
			}
		}
		gather_sorted(s, sg, r, tmp, n, runs, kp, out);
	}
}

/*
 * Answer the lookup q whose whole body (directory, keys) is at body,
 * completed by datagram idx, from name. Returns 1 when answered, 0 when it
 * is left to the serving loop (nothing written), -1 when the transmit
 * buffer or queue is full (nothing written).
 */
static int
serve_lookup(struct embnic_answer *a, int64_t idx, const uint8_t *name, const struct lookup *q, const uint8_t *body)
{
	const struct embnic_shard_tables *tb = a->tables;
	int64_t T = q->num_tables;
	const uint8_t *kp = body + T * EMBNIC_DIR_ENTRY;
	uint8_t *out = a->rep_buf;
	int64_t vl = q->value_len;

	if (vl > a->rep_cap || !directory_ok(a, body, q))
		return 0;
	for (int64_t t = 0; t < T; t++) {	/* every key in range and ours */
		struct embnic_dir_entry d = dir_at(body, t);

		if (tb->has_rows[d.table_id] || !tb->owns_all[d.table_id])
			for (uint32_t i = 0; i < d.num_keys; i++)
				if (!key_ok(tb, d.table_id, le64(kp + (int64_t)i * 8)))
					return 0;
		kp += (int64_t)d.num_keys * 8;
	}
	if (a->ntx + frames_of(a, vl) > a->tx_cap || a->nrq >= a->rq_cap)
		return -1;
	gather_message(a, body, T, body + T * EMBNIC_DIR_ENTRY, out);	/* every table's rows at once */
	embnic_shard_reply_frames(a, idx, name, EMBNIC_LOOKUP_REPLY, 0, EMBNIC_NO_TABLE, q->msg_id, q->client_id,
				  q->num_tables, q->num_keys, q->value_len, a->rep_buf, vl);
	a->stats[EMBNIC_ST_LOOKUP_KEYS] += q->num_keys;
	return 1;
}

static inline struct lookup
lookup_of(const int64_t *c)
{
	struct lookup q = { (uint32_t)c[F_msg_id], (uint16_t)c[F_client_id], (uint16_t)c[F_num_tables],
			    (uint32_t)c[F_num_keys], (uint32_t)c[F_value_len] };

	return q;
}

/*
 * Lookups the serving loop reassembled and queued (struct embnic_reply_spec
 * each: the request's header fields, its whole body, the datagram that
 * completed it, its source), answered here where this file's rules allow:
 * answered[j] = 1 for those (their replies queued), 0 for the ones left to
 * the engine. Returns how many were answered; or -rows when the transmit
 * buffer lacks room for all of them (nothing answered: grow it, call again).
 */
int64_t
embnic_shard_lookups(struct embnic_answer *a, const struct embnic_reply_spec *specs, int64_t k, uint8_t *answered)
{
	int64_t need = 0, n = 0;

	for (int64_t j = 0; j < k; j++)
		need += frames_of(a, specs[j].value_len);
	if (a->ntx + need > a->tx_cap || a->nrq + k > a->rq_cap)
		return -(need + 1);
	for (int64_t j = 0; j < k; j++) {
		const struct embnic_reply_spec *sp = &specs[j];
		struct lookup q = { sp->msg_id, sp->client_id, sp->num_tables, sp->num_keys, sp->value_len };

		answered[j] = sp->body_len == (int64_t)q.num_tables * EMBNIC_DIR_ENTRY + (int64_t)q.num_keys * 8 &&
			      serve_lookup(a, sp->idx, sp->name, &q, sp->body) > 0;
		n += answered[j];
	}
	a->stats[EMBNIC_ST_ANSWERED] += n;
	return n;
}

/*
 * One wake-up's n datagrams (a->rx): check every header (embnic_shard_check:
 * a->cols, a->ok, a->p), then, with a->serve, answer the lookups described
 * at the top of this file, marking their frames in a->taken.
 *
 * Returns the frames taken; or -rows when the transmit buffer has no room
 * for the replies (nothing answered: grow it to ntx + rows, call again).
 */
int64_t
embnic_shard_serve(struct embnic_answer *a, int n)
{
	const int64_t *cols = a->cols;
	int64_t need = 0, taken = 0;
	int b = 0;

	embnic_shard_check(a->rx, a->slot, a->lens, n, a->shard_id, a->max_msg, a->max_reply, a->cols, a->ok, a->p);
	memset(a->taken, 0, (size_t)n);
	if (!a->serve)
		return 0;
	/* the lookups before the first frame of anything else */
	for (; b < n; b++) {
		const int64_t *c = cols + (int64_t)b * EMBNIC_NB_HDR_FIELDS;

		if (!a->ok[b] || c[F_msg_type] != EMBNIC_LOOKUP_REQ)
			break;
		if (c[F_frag_index] == 0)
			need += frames_of(a, c[F_value_len]);
	}
	if (a->ntx + need > a->tx_cap || a->nrq + b > a->rq_cap)
		return -(need + 1);
	int m = 0;

	for (int i = 0; i < b; i++) {
		const int64_t *c = cols + (int64_t)i * EMBNIC_NB_HDR_FIELDS;

		if (c[F_frag_count] > 1) {
			a->mg[m++] = i;
			continue;
		}
		struct lookup q = lookup_of(c);

		if (serve_lookup(a, i, a->names + (int64_t)i * 16, &q, a->rx + (int64_t)i * a->slot + EMBNIC_HDR_LEN) > 0) {
			a->taken[i] = 1;
			a->stats[EMBNIC_ST_MESSAGES]++;
			a->stats[EMBNIC_ST_RX_FRAMES]++;
			a->stats[EMBNIC_ST_RX_BYTES] += a->lens[i];
			taken++;
		}
	}
	if (m == 0 || !a->pending_empty)
		return taken;
	/* messages of several fragments, every one of them in this wake-up */
	int g = embnic_shard_whole(cols, a->p, a->mg, m, a->order, a->grp);

	for (int j = 0; j < g; j++) {
		const int64_t *gr = a->grp + (int64_t)j * 6;
		int64_t first = gr[0], cnt = gr[1], P = gr[4];
		const int64_t *c = cols + gr[2] * EMBNIC_NB_HDR_FIELDS;
		int64_t ml = c[F_msg_len];

		if (!gr[5] || ml > a->req_cap)
			continue;
		for (int64_t f = 0; f < cnt; f++) {	/* fragment f, in index order */
			int64_t i = a->mg[a->order[first + f]];
			int64_t len = f + 1 < cnt ? P : ml - f * P;

			memcpy(a->req_buf + f * P, a->rx + i * a->slot + EMBNIC_HDR_LEN, (size_t)len);
		}
		struct lookup q = lookup_of(c);

		if (serve_lookup(a, gr[3], a->names + gr[2] * 16, &q, a->req_buf) > 0) {
			a->stats[EMBNIC_ST_MESSAGES]++;
			for (int64_t f = 0; f < cnt; f++) {
				int64_t i = a->mg[a->order[first + f]];

				a->taken[i] = 1;
				a->stats[EMBNIC_ST_RX_BYTES] += a->lens[i];
			}
			a->stats[EMBNIC_ST_RX_FRAMES] += cnt;
			a->stats[EMBNIC_ST_WHOLE]++;
			taken += cnt;
		}
	}
	return taken;
}
