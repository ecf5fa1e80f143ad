/* SPDX-License-Identifier: Apache-2.0
 *
 * The shard's row store read from C (client_lib/rowstore.py RowStore
 * owns it; numpy arrays passed as struct embnic_store). The same rows, bit
 * for bit, as RowStore.lookup and LocalBackend: rows are copied as stored,
 * a row never updated is computed with init_rows' float32 arithmetic (built
 * with -ffp-contract=off: no fused multiply-add), and fp16 is numpy's
 * float32 -> float16 rounding (round to nearest, ties to even).
 * tests/testbed/test_server_engine.py compares both on many keys.
 */
#include <string.h>

#include "shard.h"

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
			uint64_t h = embnic_splitmix64(key ^ s->tinit[li]);
			float scale = s->tscale[li];

			for (int64_t j = 0; j < k; j++) {	/* init_rows, element for element */
				uint64_t col = embnic_splitmix64(0x5EED000000000000ULL + (uint64_t)(a + j));
				float u = (float)(embnic_splitmix64(h ^ col) >> 40) * 0x1p-24f;

				part[j] = (u * 2.0f - 1.0f) * scale;
			}
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
