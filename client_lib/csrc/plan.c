/* SPDX-License-Identifier: Apache-2.0
 *
 * The client's round plan, in C: every table's keys of one lookup or update
 * round routed to their shards, grouped by shard (a stable counting sort),
 * cut into the round's messages and given their directories and row
 * offsets — the one production cut of a round into messages (the capacity
 * planner's closed form, control/traffic.py, is tested equal to it; its
 * test oracle is tests/client_lib/pyplan.py). Part of libembnic_client.
 *
 * No allocation: every output array is the caller's, sized by N (keys),
 * T (tables) and S (shards); a round has at most N messages and N
 * directory entries.
 */
#include <stdint.h>
#include <string.h>

#include "embnic_proto.h"

/* Columns of a message row (client_lib/roundplan.py MSG_COLUMNS). */
enum {
	P_SHARD, P_DIR0, P_NT, P_KA, P_KB, P_NKEYS, P_VLEN, P_VOFF, P_MSGLEN,
	P_FRAMES, P_RFRAMES, P_NCOL
};

/* SplitMix64 (client_lib/splitmix.py). */
static inline uint64_t
splitmix64(uint64_t x)
{
	uint64_t z = x + 0x9E3779B97F4A7C15ull;

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/*
 * Each key's shard, then the keys grouped by shard with a stable counting
 * sort (the plan's first step): order (call index of each grouped key),
 * gkeys, tkey, rb, dst (may be NULL), so (N+1); shard_count and shard_first
 * (the first table holding keys of each shard) per shard, start[s] where
 * shard s's keys begin (S+1); rank_tmp is scratch.
 */
static void
plan_group(const uint64_t *keys, int64_t n, const int64_t *counts, int64_t t_count, const int64_t *tid,
	   const int64_t *rowb, const int64_t *tshard, const int64_t *dbase, const int64_t *dstride, int hash,
	   int64_t s_count, int64_t *order, uint64_t *gkeys, int64_t *tkey, int64_t *rb, int64_t *dst,
	   int64_t *so, int64_t *shard_count, int64_t *shard_first, int64_t *start, int64_t *rank_tmp)
{
	int64_t i, j, t, s;

	/* each key's shard (into order[] for now), counts per shard */
	for (s = 0; s < s_count; s++) {
		shard_count[s] = 0;
		shard_first[s] = -1;	/* the first table holding keys of it */
	}
	for (t = 0, i = 0; t < t_count; t++) {
		uint64_t t48 = (uint64_t)tid[t] << 48;

		for (int64_t q = 0; q < counts[t]; q++, i++) {
			int64_t sh = hash ? (int64_t)(splitmix64(keys[i] ^ t48) % (uint64_t)s_count) : tshard[t];

			order[i] = sh;
			shard_count[sh]++;
			if (shard_first[sh] < 0)
				shard_first[sh] = t;
		}
	}
	start[0] = 0;
	for (s = 0; s < s_count; s++)
		start[s + 1] = start[s] + shard_count[s];
	/* a stable counting sort by shard: rank_tmp[] holds each shard's next slot */
	for (s = 0; s < s_count; s++)
		rank_tmp[s] = start[s];
	for (t = 0, i = 0; t < t_count; t++) {
		for (int64_t q = 0; q < counts[t]; q++, i++) {
			int64_t at = rank_tmp[order[i]]++;

			gkeys[at] = keys[i];
			tkey[at] = t;
			rb[at] = rowb[t];
			if (dst)
				dst[at] = dbase[t] + q * dstride[t];
			so[at] = i;	/* the call index, for now */
		}
	}
	for (j = 0; j < n; j++)
		order[j] = so[j];
	so[0] = 0;
	for (j = 0; j < n; j++)
		so[j + 1] = so[j] + rb[j];
}

/*
 * The grouped keys of every shard cut into messages (the plan's second
 * step), shard after shard: as many keys as fit, in table order, a
 * new message only where the next key would pass the cap either way or
 * the window. Fills dir and msgs; returns the number of messages, *ndir
 * the number of directory entries.
 */
static int64_t
plan_cut(const int64_t *start, int64_t s_count, const int64_t *tid, const int64_t *dim, const int64_t *dtype,
	 const int64_t *tkey, const int64_t *rb, const int64_t *so, int lookup, int64_t p, int64_t cap,
	 int64_t win, uint8_t *dir, int64_t *ndir, int64_t *msgs)
{
	int64_t j, k, m = 0, d = 0;

	for (int64_t s = 0; s < s_count; s++) {
		int64_t a = start[s], end = start[s + 1];

		while (a < end) {
			int64_t req = 0, rep = 0, nt = 0, k0 = a;
			int64_t *row = msgs + m * P_NCOL;

			for (k = a; k < end; k++) {
				int64_t nreq = req + 8 + (lookup ? 0 : rb[k]);
				int64_t nrep = rep + (lookup ? rb[k] : 0);

				if (k == a || tkey[k] != tkey[k - 1])
					nreq += EMBNIC_DIR_ENTRY;
				if (k > a && (nreq > cap || nrep > cap || (win >= 0 && nreq + nrep > win)))
					break;
				req = nreq;
				rep = nrep;
			}
			/* the message a..k-1: its directory */
			row[P_SHARD] = s;
			row[P_DIR0] = d;
			for (j = a; j < k; j++) {
				if (j == a || tkey[j] != tkey[j - 1]) {
					struct embnic_dir_entry e;

					memset(&e, 0, sizeof(e));
					e.table_id = (uint16_t)tid[tkey[j]];
					e.dim = (uint16_t)dim[tkey[j]];
					e.dtype = (uint8_t)dtype[tkey[j]];
					memcpy(dir + d * EMBNIC_DIR_ENTRY, &e, sizeof(e));
					d++;
					nt++;
				}
				((struct embnic_dir_entry *)(dir + (d - 1) * EMBNIC_DIR_ENTRY))->num_keys++;
			}
			row[P_NT] = nt;
			row[P_KA] = k0;
			row[P_KB] = k;
			row[P_NKEYS] = k - k0;
			row[P_VLEN] = so[k] - so[k0];
			row[P_VOFF] = so[k0];
			row[P_MSGLEN] = EMBNIC_DIR_ENTRY * nt + EMBNIC_KEY_SIZE * (k - k0) +
					(lookup ? 0 : row[P_VLEN]);
			row[P_FRAMES] = row[P_MSGLEN] ? (row[P_MSGLEN] + p - 1) / p : 1;
			row[P_RFRAMES] = lookup && row[P_VLEN] ? (row[P_VLEN] + p - 1) / p : 1;
			m++;
			a = k;
		}
	}
	*ndir = d;
	return m;
}

/*
 * The sending order of the m message rows (the plan's last step):
 * shards by (first table holding keys of theirs, index), a shard's messages
 * (consecutive rows) in key order, into rank[] (an insertion sort of the
 * shards: S is small). present is scratch (S).
 */
static void
plan_order(const int64_t *shard_count, const int64_t *shard_first, int64_t s_count, const int64_t *msgs,
	   int64_t m, int64_t *present, int64_t *rank)
{
	int64_t i = 0, j;

	for (int64_t s = 0; s < s_count; s++)
		if (shard_count[s])
			present[i++] = s;
	for (int64_t a = 1; a < i; a++) {
		int64_t x = present[a], b;

		for (b = a - 1; b >= 0 && shard_first[present[b]] > shard_first[x]; b--)
			present[b + 1] = present[b];
		present[b + 1] = x;
	}
	for (int64_t a = 0, r = 0; a < i; a++)
		for (j = 0; j < m; j++)
			if (msgs[j * P_NCOL + P_SHARD] == present[a])
				rank[r++] = j;
}

/* Columns of a config table row (client_lib/roundplan.py TableArrays.cfg). */
enum { G_ID, G_ROWB, G_DIM, G_DTYPE, G_SHARD, G_ROWS, G_ADAGRAD, G_NCOL };

/* What embnic_client_prepare() returns in info[] (client_lib/native.py). */
enum {
	I_MSGS, I_DIRS, I_V, I_BYTES, I_NEXT_ID, I_UNIFORM, I_DIM, I_FP16, I_ERR_TABLE,
	I_NCOL
};

/* Why a round is left to precheck.py's per-table checks (which name the problem). */
enum { E_TABLE = -1, E_KEY = -2, E_ORDER = -3, E_GRAD = -4 };

/* err, table t the one at fault (info[I_ERR_TABLE]) */
static int64_t
fault(int64_t *info, int64_t t, int64_t err)
{
	info[I_ERR_TABLE] = t;
	return err;
}

#define FLT_MAX_D 3.4028234663852886e38

/*
 * Check and plan one round in a single call (client_lib/native.py
 * prepare()): the checks of client_lib/precheck.py's fast path, then the
 * plan (plan_group, plan_cut, plan_order), message ids, the send queue's
 * order, a lookup's row offsets and an update's gradients in the grouped
 * order.
 *
 * cfg (ncfg rows of G_NCOL, sorted by id) and lr (ncfg): the config's
 * tables. tids, counts (T): the call's tables and key counts; keys (N);
 * grads: an update's float32 gradients (ngrads values: Σ counts·dim, call
 * order), NULL for a lookup; gshape (T x 2, or NULL): each table's gradient
 * rows and columns as the caller got them (counts[t] x dim). hash: 1 hash
 * sharding, 0 table sharding; S shards; lookup: 1 for a LOOKUP_REQ round,
 * 0 for an UPDATE_REQ; p: body bytes per fragment; cap: msg_frames * p (the
 * request and reply cap); win: (window - 2) * p, or < 0 for no window bound.
 *
 * Out (grouped order, N): order (each key's call index), gkeys, tkey, rb, dst
 * (lookups: where a row goes in the output buffer), so (N+1); dir (N entries
 * at most) and msgs (N rows of P_NCOL at most) in key order, rank (max(N, S)
 * at least) their sending order (plan_order); scratch (3 x (S+1)). tcol (7 x
 * T: tix, rowb, dim, dtype, tshard, dbase, dstride), vo (T+1 scratch), ko
 * (T+1), tab (M rows of P_NCOL + 2: the message rows in sending order, then
 * the message id and type), qorder (M: the rows in the send queue's order, a
 * shard's largest message first), vals (an update's value bytes, fp32 tables
 * only: info[I_FP16] says when the caller must build them), info (I_NCOL).
 *
 * Returns the number of messages, or E_TABLE (a table not configured, or
 * twice), E_KEY (a key >= rows), E_ORDER (an update's keys of a table not
 * strictly increasing), E_GRAD (gradients of another shape than the keys
 * and dims ask for, or one the sufficient test of
 * table_numerics.gradient_rows_ok does not vouch for): the caller then
 * runs the per-table checks (client_lib/precheck.py), which raise or pass
 * the round on, and calls again with trusted = 1: the key order and
 * gradient tests are then left out (an update's unique keys in any order,
 * gradients the exact per-row test accepted).
 */
/*
 * The call's tables (embnic_client_prepare's first step): each looked up in
 * cfg (sorted by id) into tix, rowb, dim, dtype, tshard; ko (T+1) where
 * each table's keys start, vo (T+1) its values; *fp16 any fp16 table,
 * *uniform every table fp32 of one dim. Returns 0, or E_TABLE (a table not
 * configured, or twice, a negative count; info[I_ERR_TABLE] says which) or
 * when the counts do not add up to n.
 */
static int64_t
prep_tables(const int64_t *cfg, int64_t ncfg, const int64_t *tids, const int64_t *counts, int64_t t_count,
	    int64_t n, int64_t *tcol, int64_t *vo, int64_t *ko, int64_t *fp16, int64_t *uniform, int64_t *info)
{
	int64_t *tix = tcol, *rowb = tcol + t_count, *dim = tcol + 2 * t_count,
		*dtype = tcol + 3 * t_count, *tshard = tcol + 4 * t_count, V = 0, t;

	ko[0] = 0;
	for (t = 0; t < t_count; t++) {
		int64_t lo = 0, hi = ncfg;

		while (lo < hi) {
			int64_t mid = (lo + hi) / 2;

			if (cfg[mid * G_NCOL + G_ID] < tids[t])
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo == ncfg || cfg[lo * G_NCOL + G_ID] != tids[t] || counts[t] < 0)
			return fault(info, t, E_TABLE);
		for (int64_t u = 0; u < t; u++)
			if (tix[u] == lo)
				return fault(info, t, E_TABLE);
		tix[t] = lo;
		rowb[t] = cfg[lo * G_NCOL + G_ROWB];
		dim[t] = cfg[lo * G_NCOL + G_DIM];
		dtype[t] = cfg[lo * G_NCOL + G_DTYPE];
		tshard[t] = cfg[lo * G_NCOL + G_SHARD];
		ko[t + 1] = ko[t] + counts[t];
		vo[t] = V;
		V += dim[t] * counts[t];
		*fp16 |= dtype[t] == EMBNIC_DTYPE_FP16;
		*uniform &= dtype[t] == EMBNIC_DTYPE_FP32 && dim[t] == dim[0];
	}
	vo[t_count] = V;
	return ko[t_count] != n ? E_TABLE : 0;
}

/*
 * The checks of precheck.py's fast path (embnic_client_prepare's second
 * step): keys in range; an update's keys of a table strictly increasing
 * (unless trusted); an update's gradients of the shape the keys and dims
 * ask for and, unless trusted, none the sufficient test of
 * table_numerics.gradient_rows_ok does not vouch for. Returns 0, E_KEY,
 * E_ORDER or E_GRAD (info[I_ERR_TABLE]: the table, where it is one).
 */
static int64_t
prep_check(const int64_t *cfg, const double *lr, const int64_t *tcol, const int64_t *counts, int64_t t_count,
	   const int64_t *ko, const int64_t *vo, const uint64_t *keys, const float *grads, int64_t ngrads,
	   const int64_t *gshape, int lookup, int trusted, int64_t *info)
{
	const int64_t *tix = tcol, *dim = tcol + 2 * t_count, *dtype = tcol + 3 * t_count;
	int64_t t, i;

	for (t = 0; t < t_count; t++) {	/* keys in range; an update's sorted unique */
		uint64_t rows = (uint64_t)cfg[tix[t] * G_NCOL + G_ROWS];

		for (i = ko[t]; i < ko[t + 1]; i++) {
			if (rows && keys[i] >= rows)
				return fault(info, t, E_KEY);
			if (!lookup && !trusted && i > ko[t] && keys[i] <= keys[i - 1])
				return fault(info, t, E_ORDER);
		}
	}
	if (lookup)
		return 0;
	/* no row can be refused (precheck._grads_ok, per table) */
	if (ngrads != vo[t_count])
		return E_GRAD;
	for (t = 0; gshape && t < t_count; t++)
		if (gshape[2 * t] != counts[t] || gshape[2 * t + 1] != dim[t])
			return fault(info, t, E_GRAD);
	for (t = 0; !trusted && t < t_count; t++) {
		const float *g = grads + vo[t];
		double mx = 0, step;
		int64_t nv = vo[t + 1] - vo[t];

		for (i = 0; i < nv; i++) {
			double a = g[i] < 0 ? -(double)g[i] : (double)g[i];

			if (!(a <= FLT_MAX_D)) {	/* NaN or inf */
				info[I_ERR_TABLE] = t;
				return E_GRAD;
			}
			mx = a > mx ? a : mx;
		}
		if (dtype[t] == EMBNIC_DTYPE_FP16) {
			if (!(mx <= 65504.0))
				return fault(info, t, E_GRAD);
			mx *= 1.001;
		}
		if (cfg[tix[t] * G_NCOL + G_ADAGRAD])
			step = 2.0 * (double)dim[t] * mx * mx;
		else
			step = (lr[tix[t]] < 0 ? -lr[tix[t]] : lr[tix[t]]) * mx * (1 + 0x1p-20);
		if (!(step < FLT_MAX_D))
			return fault(info, t, E_GRAD);
	}
	return 0;
}

/*
 * The m message rows in sending order (rank) into tab with their ids (from
 * next_id, never 0) and type, and qorder: the rows in the send queue's order,
 * largest first, stable (an insertion sort: m is small). Returns the next id.
 */
static uint32_t
prep_queue(const int64_t *msgs, const int64_t *rank, int64_t m, int lookup, uint32_t next_id, int64_t *tab,
	   int64_t *qorder)
{
	int64_t i;

	for (i = 0; i < m; i++) {
		int64_t *row = tab + i * (P_NCOL + 2);

		memcpy(row, msgs + rank[i] * P_NCOL, sizeof(int64_t) * P_NCOL);
		row[P_NCOL] = next_id;
		row[P_NCOL + 1] = lookup ? EMBNIC_LOOKUP_REQ : EMBNIC_UPDATE_REQ;
		next_id = next_id + 1 ? next_id + 1 : 1;
		qorder[i] = i;
	}
	for (i = 1; i < m; i++) {
		int64_t x = qorder[i], j, cx = tab[x * (P_NCOL + 2) + P_FRAMES] + tab[x * (P_NCOL + 2) + P_RFRAMES];

		for (j = i - 1; j >= 0; j--) {
			int64_t y = qorder[j];

			if (tab[y * (P_NCOL + 2) + P_FRAMES] + tab[y * (P_NCOL + 2) + P_RFRAMES] >= cx)
				break;
			qorder[j + 1] = y;
		}
		qorder[j + 1] = x;
	}
	return next_id;
}

int64_t
embnic_client_prepare(const int64_t *cfg, const double *lr, int64_t ncfg,
		      const int64_t *tids, const int64_t *counts, int64_t t_count,
		      const uint64_t *keys, int64_t n, const float *grads, int64_t ngrads,
		      const int64_t *gshape, int hash, int64_t s_count, int lookup, int64_t p, int64_t cap, int64_t win,
		      uint32_t next_id, int trusted,
		      int64_t *tcol, int64_t *vo, int64_t *ko,
		      int64_t *order, uint64_t *gkeys, int64_t *tkey, int64_t *rb, int64_t *dst,
		      int64_t *so, int64_t *scratch, uint8_t *dir, int64_t *msgs, int64_t *rank,
		      int64_t *tab, int64_t *qorder, uint8_t *vals, int64_t *info)
{
	int64_t t, i, m, nd = 0, fp16 = 0, uniform = 1, V, V16 = 0, err;
	int64_t *rowb = tcol + t_count, *dim = tcol + 2 * t_count,
		*dtype = tcol + 3 * t_count, *tshard = tcol + 4 * t_count,
		*dbase = tcol + 5 * t_count, *dstride = tcol + 6 * t_count;
	int64_t *shard_first = scratch + s_count + 1, *shard_start = scratch + 2 * (s_count + 1);

	memset(info, 0, sizeof(int64_t) * I_NCOL);
	err = prep_tables(cfg, ncfg, tids, counts, t_count, n, tcol, vo, ko, &fp16, &uniform, info);
	if (err == 0)
		err = prep_check(cfg, lr, tcol, counts, t_count, ko, vo, keys, grads, ngrads, gshape, lookup,
				 trusted, info);
	if (err < 0)
		return err;
	V = vo[t_count];
	/* where a lookup's rows go (roundplan.out_bases): fp32 tables' values
	 * one table after the other, fp16 tables' staged after them */
	for (t = 0; t < t_count; t++) {
		if (dtype[t] == EMBNIC_DTYPE_FP16) {
			dbase[t] = 4 * V + 2 * V16;
			dstride[t] = 2 * dim[t];
			V16 += dim[t] * counts[t];
		} else {
			dbase[t] = 4 * vo[t];
			dstride[t] = 4 * dim[t];
		}
	}
	plan_group(keys, n, counts, t_count, tids, rowb, tshard, dbase, dstride, hash, s_count, order, gkeys,
		   tkey, rb, lookup ? dst : NULL, so, scratch, shard_first, shard_start, rank);
	/* messages per shard in shard-index order (the directory's order) */
	m = plan_cut(shard_start, s_count, tids, dim, dtype, tkey, rb, so, lookup, p, cap, win, dir, &nd, msgs);
	plan_order(scratch, shard_first, s_count, msgs, m, shard_start, rank);
	next_id = prep_queue(msgs, rank, m, lookup, next_id, tab, qorder);
	if (!lookup && !fp16)	/* the gradients in the grouped order */
		for (i = 0; i < n; i++) {
			int64_t c = order[i], tt = tkey[i];

			memcpy(vals + so[i], grads + vo[tt] + (c - ko[tt]) * dim[tt], (size_t)rb[i]);
		}
	info[I_MSGS] = m;
	info[I_DIRS] = nd;
	info[I_V] = V;
	info[I_BYTES] = 4 * V + 2 * V16;
	info[I_NEXT_ID] = next_id;
	info[I_UNIFORM] = t_count > 0 && uniform;
	info[I_DIM] = t_count > 0 ? dim[0] : 0;
	info[I_FP16] = fp16;
	return m;
}
