/* SPDX-License-Identifier: Apache-2.0
 *
 * The row store in C (client_lib/rowstore.py RowStore owns it and fills this
 * struct; csrc/store.c). Compiled into both package libraries: the client
 * library (libembnic_client: RowStore's updates, for LocalBackend and every
 * other holder of a RowStore) and the shard library (libembnic_shard: the
 * answer path reads the rows in place, testbed/server/csrc/answer.c).
 *
 * Python fills the struct as a ctypes.Structure with the same layout: every
 * field 8 bytes wide, offsets pinned by the static_asserts here and checked
 * from Python against embnic_store_layout() before the library is used.
 *
 * One index of composite keys (key + salt of its table, mod 2^64) over one
 * float32 arena. The arena and the delta index carry spare capacity that
 * Python reserves (amortised doubling): an update appends new rows into it
 * and asks for more (embnic_store_apply() returns 1) only when it runs out.
 */
#ifndef EMBNIC_STORE_H
#define EMBNIC_STORE_H

#include <assert.h>
#include <stdint.h>

struct embnic_store {
	const uint64_t *ck;	/* main index: composite keys, sorted (m) */
	const int64_t *cs;	/* the arena slot of each */
	const uint16_t *ct;	/* the table (local index) of each; NULL: one table */
	int64_t m;
	const uint64_t *sample;	/* ck[0], ck[step], ck[2 * step], ...: a small copy the */
	int64_t nsample;	/* searches start in (it stays in cache) */
	int64_t step;
	uint64_t *dck;		/* delta index: recently added rows (d of dcap), sorted */
	int64_t *dcs;
	uint16_t *dct;		/* NULL: one table */
	int64_t d;		/* (io) entries in use */
	float *vals;		/* arena */
	int64_t *off;		/* per slot: element offset in vals; NULL: slot * dim */
	int64_t dim;		/* the one dim of every table (when off is NULL) */
	const uint64_t *tsalt;	/* per table (local index): composite salt */
	const uint64_t *tinit;	/* per table: init_rows' hash of (seed, table) */
	const float *tscale;	/* per table: init_scale as float32 */
	int64_t ntables;
	/* what an update writes */
	int64_t dcap;		/* delta index capacity (entries) */
	int64_t n;		/* (io) slots in use */
	int64_t cap;		/* slots allocated (off, acc; rows when off is NULL) */
	int64_t e;		/* (io) arena elements in use (when off is not NULL) */
	int64_t ecap;		/* arena elements allocated */
	float *acc;		/* per slot: row-wise Adagrad accumulator; NULL: no Adagrad table */
	const int64_t *tdim;	/* per table: dim */
	const uint8_t *tada;	/* per table: 1 row-wise Adagrad, 0 SGD */
	const float *tlr;	/* per table: learning rate as float32 */
	const float *teps;	/* per table: Adagrad's eps as float32 */
	int64_t *trows;		/* (io) per table: materialised rows */
};

static_assert(sizeof(struct embnic_store) == 29 * 8, "embnic_store layout");

/* a key of a batch, sorted by its place in the store's index */
struct embnic_krec {
	uint64_t c;		/* composite key: key + its table's salt */
	uint32_t seg;		/* its directory entry (answer.c), or its table */
	uint32_t i;		/* its index among the batch's keys */
};

static_assert(sizeof(struct embnic_krec) == 16, "krec");

uint64_t embnic_splitmix64(uint64_t x);
int64_t embnic_store_find(const struct embnic_store *s, int64_t li, uint64_t c, int64_t *hint);
int64_t embnic_store_block(const struct embnic_store *s, uint64_t c, int64_t *hint);
int64_t embnic_store_pos(const struct embnic_store *s, uint64_t c, int64_t a);
int64_t embnic_store_find_delta(const struct embnic_store *s, int64_t li, uint64_t c, int64_t *hint);
void embnic_init_rows(const uint64_t *keys, int64_t n, const uint64_t *tinit, const float *scale, const int64_t *dims,
		      int64_t per_row, float *out);
void embnic_store_row(const struct embnic_store *s, int64_t li, uint64_t key, int64_t slot, int64_t dim,
		      int64_t dtype, uint8_t *out);
uint16_t embnic_f32_to_f16(uint32_t f);
void embnic_store_slots(const struct embnic_store *s, const int64_t *segli, int64_t stride, const struct embnic_krec *rc,
			int64_t k, int64_t *slot, int64_t *hint);
void embnic_sort_recs(struct embnic_krec *r, struct embnic_krec *tmp, int64_t n, int32_t *runs);
int64_t embnic_store_find_many(const struct embnic_store *s, const uint64_t *c, const int64_t *li, int64_t li0,
			       int64_t n, int64_t *slots, uint8_t *work);
int64_t embnic_store_apply(struct embnic_store *s, const int64_t *li, int64_t li0, const uint64_t *keys, int64_t n,
			   const float *g, int64_t glen, uint8_t *work, int64_t *need);

/* keys searched together by embnic_store_slots() (its caller's chunk) */
#define EMBNIC_STORE_CHUNK 256
/* rows an update prefetches ahead of its step */
#define EMBNIC_STORE_PREFETCH 16

/* keys embnic_store_find_many() sorts together, and the bytes of its work buffer for w of them */
#define EMBNIC_STORE_WINDOW 4096
#define EMBNIC_STORE_FIND_WORK(w) ((w) * (16 + 16) + 4 * ((w) + 1))

/* bytes of embnic_store_apply()'s work buffer for n keys */
#define EMBNIC_STORE_APPLY_WORK(n) ((n) * (8 + 16 + 16) + 4 * ((n) + 1))

#endif /* EMBNIC_STORE_H */
