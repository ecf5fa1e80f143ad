/* SPDX-License-Identifier: Apache-2.0
 *
 * The row store in C (client_lib/rowstore.py RowStore owns it; numpy arrays
 * passed as struct embnic_store, store.h): searches, initial rows, wire
 * dtypes, and updates — the optimizer step (SGD, row-wise Adagrad) and new
 * rows appended into the spare capacity Python reserves. The same rows, bit
 * for bit, as the numpy oracle tests/client_lib/numpy_rowstore.py: rows are
 * copied as stored, a row never updated is computed with init_rows' float32
 * arithmetic, the optimizer's float32 operations in numpy's order (built
 * with -ffp-contract=off: no fused multiply-add), and fp16 is numpy's
 * float32 -> float16 rounding (round to nearest, ties to even).
 * tests/client_lib/test_rowstore_c.py and tests/testbed/test_server_engine.py
 * compare them on many keys.
 *
 * No allocation and no locks: every buffer is the caller's.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "embnic_proto.h"
#include "store.h"

/* client_lib/splitmix.py: Vigna's splitmix64.c next() from state x */
uint64_t
embnic_splitmix64(uint64_t x)
{
	uint64_t z = x + 0x9E3779B97F4A7C15ULL;

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

/* first position in a[lo..n) holding a value >= c */
static inline int64_t
lower_bound(const uint64_t *a, int64_t lo, int64_t n, uint64_t c)
{
	int64_t hi = n;

	while (lo < hi) {
		int64_t mid = lo + ((hi - lo) >> 1);

		if (a[mid] < c)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * First position in a[lo..n) holding a value >= c, where a[lo - 1] < c:
 * galloping from lo (1, 2, 4, ... ahead), then a binary search in the last
 * step. Keys of a table come in ascending order, so lo is where the last
 * search ended and the next key is usually a few entries on: a few probes
 * near the last ones, not log2(n) across the index.
 */
static inline int64_t
gallop(const uint64_t *a, int64_t lo, int64_t n, uint64_t c)
{
	int64_t b = lo, step = 1;

	while (b < n && a[b] < c) {
		lo = b + 1;
		b += step;
		step <<= 1;
	}
	return lower_bound(a, lo, b < n ? b + 1 : n, c);
}

/*
 * The slot of composite key c of table li in one sorted index, -1 if none.
 * *hint: where the last search of this index ended (0 at first); the search
 * gallops from there when everything before it is smaller, else from 0. A
 * run of equal composites (rows of two tables) is walked for the row of
 * table li (each entry's table is beside it: no cache miss).
 */
static inline int64_t
find_in(const uint64_t *ix, const int64_t *sl, const uint16_t *tl, int64_t m, int64_t li, uint64_t c,
	int64_t *hint)
{
	int64_t lo = *hint;
	int64_t pos;

	if (lo > m || (lo > 0 && ix[lo - 1] >= c))
		lo = 0;
	pos = gallop(ix, lo, m, c);
	*hint = pos;
	for (; pos < m && ix[pos] == c; pos++)
		if (tl == NULL || tl[pos] == li)
			return sl[pos];
	return -1;
}

/*
 * Where composite c is in the main index, in two steps so a caller can
 * overlap the cache misses of many keys (answer.c gather()):
 *
 * embnic_store_block(): the block of the index c can be in, from the sample
 * (every step-th key: small enough to stay in cache; galloping from *hint,
 * where the last search ended: gather() searches keys in ascending order).
 * Returns the block's first position (the caller may prefetch it).
 *
 * embnic_store_pos(): the position of c's first entry in that block (of any
 * table: the caller checks ct[pos], and calls embnic_store_find() on a
 * mismatch), or -1. The block is a cache line or two.
 *
 * With the keys of a message sorted first (answer.c), consecutive searches
 * are a few sample entries apart and each touches one block of the index.
 */
int64_t
embnic_store_block(const struct embnic_store *s, uint64_t c, int64_t *hint)
{
	int64_t lo = *hint, j;

	if (s->m == 0 || s->nsample == 0)
		return 0;
	if (lo > s->nsample || (lo > 0 && s->sample[lo - 1] >= c))
		lo = 0;
	j = gallop(s->sample, lo, s->nsample, c);	/* first sample >= c */
	*hint = j > 0 ? j - 1 : 0;	/* c's block starts after sample[j - 1] < c */
	return j == 0 ? 0 : (j - 1) * s->step + 1;
}

int64_t
embnic_store_pos(const struct embnic_store *s, uint64_t c, int64_t a)
{
	int64_t pos;

	if (s->m == 0)
		return -1;
	if (s->nsample == 0)	/* no sample: the index alone */
		pos = lower_bound(s->ck, 0, s->m, c);
	else	/* [a, b]: c's block and the next sample */
		pos = lower_bound(s->ck, a, a + s->step < s->m ? a + s->step : s->m, c);
	return pos < s->m && s->ck[pos] == c ? pos : -1;
}

/* The slot of composite c of table li in the delta index alone, -1 if none */
int64_t
embnic_store_find_delta(const struct embnic_store *s, int64_t li, uint64_t c, int64_t *hint)
{
	return s->d ? find_in(s->dck, s->dcs, s->dct, s->d, li, c, hint) : -1;
}

/* The arena slot of composite c of table li, -1 if the row was never
 * updated. hint: two positions (main and delta index), start at 0. */
int64_t
embnic_store_find(const struct embnic_store *s, int64_t li, uint64_t c, int64_t *hint)
{
	int64_t slot = s->m ? find_in(s->ck, s->cs, s->ct, s->m, li, c, &hint[0]) : -1;

	return slot >= 0 ? slot : embnic_store_find_delta(s, li, c, &hint[1]);
}

/*
 * The arena slots of the k records rc (-1: no row), the cache misses of
 * many keys overlapped: (1) each key's block of the index (from the store's
 * sample, in cache), prefetched; (2) where each key is in its block, its
 * slot and table prefetched; (3) the slots. A record's table: segli[r.seg *
 * stride] (the caller's directory entries), or r.seg itself (segli NULL).
 * hint: where the searches of the main and delta index ended (start at 0).
 */
void
embnic_store_slots(const struct embnic_store *s, const int64_t *segli, int64_t stride, const struct embnic_krec *rc,
		   int64_t k, int64_t *slot, int64_t *hint)
{
#define LI_OF(r) (segli ? segli[(int64_t)(r)->seg * stride] : (int64_t)(r)->seg)
	for (int64_t i = 0; i < k; i++) {
		int64_t b = embnic_store_block(s, rc[i].c, &hint[0]);

		if (s->m) {
			__builtin_prefetch(s->ck + b);
			__builtin_prefetch(s->ck + b + s->step);
		}
		slot[i] = b;
	}
	/* slot[i] >= 0: a main-index position; -1: no row; <= -2: -2 - the slot (delta) */
	for (int64_t i = 0; i < k; i++) {
		int64_t p = embnic_store_pos(s, rc[i].c, slot[i]);

		if (p >= 0) {
			__builtin_prefetch(s->cs + p);
			if (s->ct)
				__builtin_prefetch(s->ct + p);
		} else {
			p = embnic_store_find_delta(s, LI_OF(&rc[i]), rc[i].c, &hint[1]);
			p = p >= 0 ? -2 - p : -1;
		}
		slot[i] = p;
	}
	for (int64_t i = 0; i < k; i++) {
		int64_t p = slot[i], li = LI_OF(&rc[i]);

		if (p >= 0)
			slot[i] = s->ct == NULL || s->ct[p] == li ? s->cs[p] : -3;
		else if (p <= -2)
			slot[i] = -2 - p;
		if (slot[i] == -3) {	/* another table's composite: the full search */
			int64_t h[2] = { 0, 0 };

			slot[i] = embnic_store_find(s, li, rc[i].c, h);
		}
	}
#undef LI_OF
}

/* r[0..n) by composite key (stable), with tmp[0..n) and runs[0..n] as
 * scratch: a natural merge sort (a message's keys come in one sorted run per table, a run
 * broken at most once where key + salt wraps: log2(runs) passes) */
void
embnic_sort_recs(struct embnic_krec *r, struct embnic_krec *tmp, int64_t n, int32_t *runs)
{
	int64_t nr = 0;

	runs[nr++] = 0;
	for (int64_t i = 1; i < n; i++)
		if (r[i].c < r[i - 1].c)
			runs[nr++] = (int32_t)i;
	runs[nr] = (int32_t)n;
	if (nr == 1)
		return;
	struct embnic_krec *src = r, *dst = tmp;

	while (nr > 1) {
		int64_t w = 0;

		for (int64_t j = 0; j < nr; j += 2) {
			int64_t a = runs[j], m = runs[j + 1], e = j + 2 <= nr ? runs[j + 2 < nr ? j + 2 : nr] : m;
			int64_t x = a, y = m, o = a;

			if (j + 1 >= nr) {	/* an odd run out: copied as it is */
				memcpy(dst + a, src + a, (size_t)(m - a) * sizeof(*r));
				runs[w++] = (int32_t)a;
				continue;
			}
			while (x < m && y < e) {	/* branchless: which side wins is data, not a pattern */
				int64_t ty = src[y].c < src[x].c;

				dst[o++] = src[ty ? y : x];
				y += ty;
				x += 1 - ty;
			}
			while (x < m)
				dst[o++] = src[x++];
			while (y < e)
				dst[o++] = src[y++];
			runs[w++] = (int32_t)a;
		}
		runs[w] = (int32_t)n;
		nr = w;
		struct embnic_krec *t = src;

		src = dst;
		dst = t;
	}
	if (src != r)
		memcpy(r, src, (size_t)n * sizeof(*r));
}

/*
 * float32 bits -> float16 bits as numpy casts them (npy_floatbits_to_halfbits,
 * numpy/_core/src/npymath/halffloat.cpp): round to nearest, ties to even;
 * too large -> inf; NaN keeps its sign and top significand bits.
 */
uint16_t
embnic_f32_to_f16(uint32_t f)
{
	uint32_t f_exp = f & 0x7f800000u, f_sig = f & 0x007fffffu;
	uint16_t h_sgn = (uint16_t)((f & 0x80000000u) >> 16);

	if (f_exp >= 0x47800000u) {	/* overflow: signed inf; NaN stays NaN */
		if (f_exp == 0x7f800000u && f_sig) {
			uint16_t ret = (uint16_t)(0x7c00u + (f_sig >> 13));

			return (uint16_t)(h_sgn + (ret == 0x7c00u ? ret + 1 : ret));
		}
		return (uint16_t)(h_sgn + 0x7c00u);
	}
	if (f_exp <= 0x38000000u) {	/* a subnormal half or signed zero */
		if (f_exp < 0x33000000u)
			return h_sgn;
		f_exp >>= 23;
		f_sig = (0x00800000u + f_sig) >> (113 - f_exp);
		/* ties to even: the bits the shift lost are in f's low 11 */
		if ((f_sig & 0x3fffu) != 0x1000u || (f & 0x7ffu))
			f_sig += 0x1000u;
		return (uint16_t)(h_sgn + (f_sig >> 13));
	}
	if ((f_sig & 0x3fffu) != 0x1000u)	/* ties to even */
		f_sig += 0x1000u;
	/* a carry out of the significand bumps the exponent (to inf at most) */
	return (uint16_t)(h_sgn + (uint16_t)((f_exp - 0x38000000u) >> 13) + (uint16_t)(f_sig >> 13));
}

/*
 * The initial value rule (table_numerics.init_rows, whose one implementation
 * this is): values a .. a+k-1 of the row whose hash is h = splitmix64(key ^ t),
 * t = splitmix64(seed ^ splitmix64(table_id)), uniform in [-scale, scale):
 * u = (splitmix64(h ^ splitmix64(0x5EED000000000000 + j)) >> 40) / 2^24 (24
 * bits, exact in float32), value float32(2u - 1) * scale.
 */
static void
init_part(uint64_t h, int64_t a, int64_t k, float scale, float *out)
{
	for (int64_t j = 0; j < k; j++) {
		uint64_t col = embnic_splitmix64(0x5EED000000000000ULL + (uint64_t)(a + j));
		float u = (float)(embnic_splitmix64(h ^ col) >> 40) * 0x1p-24f;

		out[j] = (u * 2.0f - 1.0f) * scale;
	}
}

/*
 * Initial rows of keys[0..n-1] (init_part), one after the other as float32 at
 * out (Σ dims values): row i of the table with hash tinit[i], scale[i] and
 * dims[i] values — or, with per_row 0, every row with tinit[0], scale[0],
 * dims[0].
 */
void
embnic_init_rows(const uint64_t *keys, int64_t n, const uint64_t *tinit, const float *scale, const int64_t *dims,
		 int64_t per_row, float *out)
{
	for (int64_t i = 0; i < n; i++) {
		int64_t r = per_row ? i : 0;

		init_part(embnic_splitmix64(keys[i] ^ tinit[r]), 0, dims[r], scale[r], out);
		out += dims[r];
	}
}

/*
 * Row `key` of table li (at arena slot `slot`, or -1: never updated, its
 * initial value), its dim values in the wire dtype (1 fp32, 2 fp16),
 * written at out (dim * 4 or dim * 2 bytes, any alignment).
 */
void
embnic_store_row(const struct embnic_store *s, int64_t li, uint64_t key, int64_t slot, int64_t dim, int64_t dtype,
		 uint8_t *out)
{
	float part[256];

	for (int64_t a = 0; a < dim; a += 256) {	/* a long row in pieces */
		int64_t k = dim - a < 256 ? dim - a : 256;
		const float *w;

		if (slot >= 0) {
			w = s->vals + (s->off ? s->off[slot] : slot * s->dim) + a;
		} else {
			init_part(embnic_splitmix64(key ^ s->tinit[li]), a, k, s->tscale[li], part);
			w = part;
		}
		if (dtype == EMBNIC_DTYPE_FP32) {
			memcpy(out + a * 4, w, (size_t)k * 4);
			continue;
		}
		for (int64_t j = 0; j < k; j++) {
			uint32_t b;
			uint16_t hb;

			memcpy(&b, &w[j], 4);
			hb = embnic_f32_to_f16(b);
			memcpy(out + (a + j) * 2, &hb, 2);
		}
	}
}

/* embnic_f32_to_f16 over n values (for tests: tests/testbed/test_server_engine.py) */
void
embnic_shard_to_f16(const uint32_t *in, uint16_t *out, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		out[i] = embnic_f32_to_f16(in[i]);
}

/* what Python checks struct embnic_store against (client_lib/table_numerics.py) */
void
embnic_store_layout(int64_t *out)
{
	out[0] = (int64_t)sizeof(struct embnic_store);
	out[1] = (int64_t)offsetof(struct embnic_store, trows);
	out[2] = (int64_t)sizeof(struct embnic_krec);
}

/*
 * One optimizer step on one row w of dim values with its gradient g (the
 * formulas of client_lib/table_numerics.py, in numpy's float32 order):
 * row-wise Adagrad when acc is not NULL —
 *   acc += (g0*g0 + g1*g1 + ... left to right) / dim;
 *   w[j] -= (lr / (sqrt(acc) + eps)) * g[j]
 * — else SGD, w[j] -= lr * g[j].
 */
static inline void
step_row(float *w, float *acc, const float *g, int64_t dim, float lr, float eps)
{
	float mult = lr;

	if (acc) {
		float s = 0.0f;

		for (int64_t j = 0; j < dim; j++)
			s += g[j] * g[j];
		*acc = *acc + s / (float)dim;
		mult = lr / (sqrtf(*acc) + eps);
	}
	for (int64_t j = 0; j < dim; j++)
		w[j] -= mult * g[j];
}

/*
 * The optimizer step on n rows w (float32 n x dim, changed in place) with
 * gradients g (n x dim): row-wise Adagrad with accumulators acc (float32
 * (n,), changed in place) when acc is not NULL, else SGD; lr and eps float32,
 * one value (per_row 0) or one per row (per_row 1). What
 * table_numerics.optimizer_step runs (the disk tier's rows).
 */
void
embnic_rows_step(float *w, float *acc, const float *g, int64_t n, int64_t dim, const float *lr, const float *eps,
		 int64_t per_row)
{
	for (int64_t i = 0; i < n; i++)
		step_row(w + i * dim, acc ? acc + i : NULL, g + i * dim, dim, lr[per_row ? i : 0],
			 eps[per_row ? i : 0]);
}

/*
 * Slots for the n_new keys r[0..k) missing from the store (sorted by
 * composite, stable: arrival order among equal ones), one new row per
 * distinct (table, composite): counted (*rows, *elems) when commit is 0;
 * else created — slots s->n, s->n + 1, ... in composite order, each its
 * initial value (init_rows) and accumulator 0 — the slot of each key
 * written at slot[r.i], and the distinct ones (copied to out[0..rows), in
 * order) merged into the delta index (a backward merge in place: O(d + k)).
 */
static void
new_rows(struct embnic_store *s, const uint64_t *keys, const struct embnic_krec *r, int64_t k, int64_t *slot,
	 struct embnic_krec *out, int commit, int64_t *rows, int64_t *elems)
{
	int64_t u = 0, el = 0, n0 = s->n;

	for (int64_t j = 0; j < k; j++) {
		int64_t li = r[j].seg, same = -1;

		/* the same (table, composite) earlier in this run of equal composites */
		for (int64_t b = j - 1; b >= 0 && r[b].c == r[j].c; b--)
			if (r[b].seg == r[j].seg)
				same = b;
		if (same >= 0) {
			if (commit)
				slot[r[j].i] = slot[r[same].i];
			continue;
		}
		if (commit) {
			int64_t sl = n0 + u, dim = s->tdim[li];
			float *w;

			if (s->off) {
				s->off[sl] = s->e + el;
				w = s->vals + s->e + el;
			} else {
				w = s->vals + sl * s->dim;
			}
			embnic_store_row(s, li, keys[r[j].i], -1, dim, EMBNIC_DTYPE_FP32, (uint8_t *)w);
			if (s->acc)
				s->acc[sl] = 0.0f;
			s->trows[li]++;
			slot[r[j].i] = sl;
			out[u] = r[j];	/* the distinct ones, in order, for the merge */
		}
		el += s->tdim[li];
		u++;
	}
	*rows = u;
	*elems = el;
	if (!commit || u == 0)
		return;
	/* merge r[0..u) (slots n0..n0+u) into the delta index from the back */
	int64_t a = s->d - 1, b = u - 1, o = s->d + u - 1;

	while (b >= 0) {
		if (a >= 0 && s->dck[a] > out[b].c) {
			s->dck[o] = s->dck[a];
			s->dcs[o] = s->dcs[a];
			if (s->dct)
				s->dct[o] = s->dct[a];
			a--;
		} else {
			s->dck[o] = out[b].c;
			s->dcs[o] = n0 + b;
			if (s->dct)
				s->dct[o] = (uint16_t)out[b].seg;
			b--;
		}
		o--;
	}
	s->d += u;
	s->n += u;
	if (s->off)
		s->e += el;
}

/*
 * Apply one gradient row per key with its table's optimizer, key after key
 * in the order given: a (table, key) that comes more than once (updates of
 * several messages, one after the other) gets its gradients in that order —
 * the optimizers are row-wise, so the rows are those of the messages applied
 * one after the other (the serving loop applies a wake-up's updates so, in
 * arrival order: docs/server.md). A row never updated is
 * created first with its initial value (init_rows) and accumulator 0.
 *
 *   li	  int64 (n,): each key's table (local index), or NULL: every key of
 *	  table li0
 *   keys uint64 (n,)
 *   g	  float32 (glen,): each key's gradient row (its table's dim values),
 *	  row after row; glen must be the sum of those dims
 *   work EMBNIC_STORE_APPLY_WORK(n) bytes, 8-byte aligned (scratch)
 *   need int64 (3,), written when the call returns 1
 *
 * Returns 0 (applied); 1 when the spare capacity is too small for the new
 * rows — nothing was changed, need = (slots, arena elements, delta index
 * entries) the call needs in all: grow and call again; -1 when a table index
 * is out of range, n >= 2^31 or glen does not match (nothing changed).
 * Gradients are not checked (the callers refuse those whose step is not
 * finite: table_numerics.gradient_rows_ok).
 */
int64_t
embnic_store_apply(struct embnic_store *s, const int64_t *li, int64_t li0, const uint64_t *keys, int64_t n,
		   const float *g, int64_t glen, uint8_t *work, int64_t *need)
{
	int64_t *slot = (int64_t *)work;
	struct embnic_krec *r = (struct embnic_krec *)(slot + n);
	struct embnic_krec *tmp = r + n;
	int32_t *runs = (int32_t *)(tmp + n);
	int64_t hint[2] = { 0, 0 }, k = 0, total = 0, rows = 0, elems = 0;

	if (n < 0 || n >= ((int64_t)1 << 31))
		return -1;
	for (int64_t i = 0; i < n; i++) {
		int64_t t = li ? li[i] : li0;

		if (t < 0 || t >= s->ntables)
			return -1;
		total += s->tdim[t];
		r[i] = (struct embnic_krec){ keys[i] + s->tsalt[t], (uint32_t)t, (uint32_t)i };
	}
	if (total != glen)
		return -1;
	for (int64_t c0 = 0; c0 < n; c0 += EMBNIC_STORE_CHUNK)
		embnic_store_slots(s, NULL, 0, r + c0, n - c0 < EMBNIC_STORE_CHUNK ? n - c0 : EMBNIC_STORE_CHUNK,
				   slot + c0, hint);
	for (int64_t i = 0; i < n; i++)	/* the keys without a row, in order */
		if (slot[i] < 0)
			r[k++] = r[i];
	if (k) {
		embnic_sort_recs(r, tmp, k, runs);
		new_rows(s, keys, r, k, slot, tmp, 0, &rows, &elems);
		if (s->n + rows > s->cap || s->d + rows > s->dcap || (s->off && s->e + elems > s->ecap)) {
			need[0] = s->n + rows;
			need[1] = s->off ? s->e + elems : 0;
			need[2] = s->d + rows;
			return 1;
		}
		new_rows(s, keys, r, k, slot, tmp, 1, &rows, &elems);
	}
	/* the steps in key order, each row and accumulator prefetched a few keys ahead (rows lie in
	 * the arena in the order they were first updated, not by key: each is a cache miss) */
	for (int64_t i = 0, at = 0; i < n; i++) {
		int64_t t = li ? li[i] : li0, dim = s->tdim[t], sl = slot[i];
		float *w = s->vals + (s->off ? s->off[sl] : sl * s->dim);

		if (i + EMBNIC_STORE_PREFETCH < n) {
			int64_t ps = slot[i + EMBNIC_STORE_PREFETCH];

			__builtin_prefetch(s->vals + (s->off ? s->off[ps] : ps * s->dim), 1);
			if (s->acc)
				__builtin_prefetch(s->acc + ps, 1);
		}
		step_row(w, s->tada[t] ? &s->acc[sl] : NULL, g + at, dim, s->tlr[t], s->teps[t]);
		at += dim;
	}
	return 0;
}

/*
 * The arena slots of n keys of the store (RowStore._find: its lookups and
 * anything else that searches it): composite keys c, tables li (int64 each,
 * or NULL: every key of table li0); slots[i] = -1 where the store holds no
 * row. Sorted by composite key a window of EMBNIC_STORE_WINDOW keys at a
 * time, then searched as embnic_store_slots() does (the index walked in its
 * order, cache misses overlapped). work: EMBNIC_STORE_FIND_WORK(min(n,
 * EMBNIC_STORE_WINDOW)) bytes, 8-byte aligned. Returns 0; -1 when a table
 * index is out of range or n >= 2^31 (nothing written).
 */
int64_t
embnic_store_find_many(const struct embnic_store *s, const uint64_t *c, const int64_t *li, int64_t li0, int64_t n,
		       int64_t *slots, uint8_t *work)
{
	int64_t w = n < EMBNIC_STORE_WINDOW ? n : EMBNIC_STORE_WINDOW;
	struct embnic_krec *r = (struct embnic_krec *)work;
	struct embnic_krec *tmp = r + w;
	int32_t *runs = (int32_t *)(tmp + w);
	int64_t slot[EMBNIC_STORE_CHUNK];

	if (n < 0 || n >= ((int64_t)1 << 31))
		return -1;
	for (int64_t i = 0; i < n; i++)
		if ((li ? li[i] : li0) < 0 || (li ? li[i] : li0) >= s->ntables)
			return -1;
	for (int64_t w0 = 0; w0 < n; w0 += EMBNIC_STORE_WINDOW) {
		int64_t m = n - w0 < EMBNIC_STORE_WINDOW ? n - w0 : EMBNIC_STORE_WINDOW;
		int64_t hint[2] = { 0, 0 };

		for (int64_t i = 0; i < m; i++)
			r[i] = (struct embnic_krec){ c[w0 + i], (uint32_t)(li ? li[w0 + i] : li0), (uint32_t)(w0 + i) };
		embnic_sort_recs(r, tmp, m, runs);
		for (int64_t c0 = 0; c0 < m; c0 += EMBNIC_STORE_CHUNK) {
			int64_t k = m - c0 < EMBNIC_STORE_CHUNK ? m - c0 : EMBNIC_STORE_CHUNK;

			embnic_store_slots(s, NULL, 0, r + c0, k, slot, hint);
			for (int64_t i = 0; i < k; i++)
				slots[r[c0 + i].i] = slot[i];
		}
	}
	return 0;
}
