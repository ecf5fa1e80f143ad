/* SPDX-License-Identifier: Apache-2.0
 *
 * The parameter-server shard's intake, in C: what the batch engine
 * (testbed/server/intake.py) does per wake-up before any table is touched,
 * without numpy's per-call cost. Built as build/libembnic-shard.so (no DPDK)
 * and called through ctypes by testbed/server/cintake.py; the Python code it
 * replaces stays the readable reference, and tests/testbed/test_server_engine.py
 * checks both give the same replies, counters and rows.
 *
 *   embnic_shard_check()  every header of a recvmmsg batch: the fields, whether
 *                         the fast path takes the frame, its fragment size
 *                         (BatchIntake._check_vector, rule for rule)
 *   embnic_shard_whole()  the multi-fragment frames grouped by message, and
 *                         which messages came whole in this batch
 *                         (BatchIntake._whole's grouping)
 *
 * No allocation, no locks; every output array is the caller's, sized by n.
 */
#include <stdint.h>
#include <string.h>

#include "embnic_proto.h"

/* what the caller checks before using this library (cintake.py) */
int
embnic_shard_abi(void)
{
	return EMBNIC_PROTO_VERSION * 1000 + EMBNIC_NB_HDR_FIELDS;
}

/* field indices of a row of cols, in the order of EMBNIC_HDR_FIELDS */
enum {
	F_MAGIC, F_VERSION, F_TYPE, F_FLAGS, F_DTYPE, F_STATUS, F_MSG_ID,
	F_CLIENT, F_TABLE, F_SHARD, F_DIM, F_NKEYS, F_MSG_LEN, F_FOFF, F_FIDX,
	F_FCNT, F_FLEN, F_RESERVED,
};

/* One row of cols: every header field in wire order, host byte order
 * (embnic_hdr_decode(), the card's one place that swaps header bytes). */
static void
parse_fields(const uint8_t *raw, int64_t *c)
{
	const struct embnic_hdr *h = (const struct embnic_hdr *)raw;
	struct embnic_msg m;

	embnic_hdr_decode(h, &m);
	c[F_MAGIC] = embnic_ntoh16(h->magic);
	c[F_VERSION] = m.version;
	c[F_TYPE] = m.msg_type;
	c[F_FLAGS] = m.flags;
	c[F_DTYPE] = m.dtype;
	c[F_STATUS] = m.status;
	c[F_MSG_ID] = m.msg_id;
	c[F_CLIENT] = m.client_id;
	c[F_TABLE] = m.table_id;
	c[F_SHARD] = m.shard_id;
	c[F_DIM] = m.dim;
	c[F_NKEYS] = m.num_keys;
	c[F_MSG_LEN] = m.msg_len;
	c[F_FOFF] = m.frag_offset;
	c[F_FIDX] = m.frag_index;
	c[F_FCNT] = m.frag_count;
	c[F_FLEN] = m.frag_len;
	c[F_RESERVED] = embnic_ntoh16(h->reserved);
}

static_assert(EMBNIC_NB_HDR_FIELDS == F_RESERVED + 1, "one column per header field");

/*
 * Check the n frames rx[i * slot .. + lens[i]] (i < n).
 *
 * tdim, tdt, tmaxlk: per table id (65536 entries) the dim (-1: no such
 * table), the wire dtype and the most keys a lookup may carry. max_msg: the
 * largest message body taken.
 *
 * Out: cols (n x 18, the header fields, zeros for a frame shorter than a
 * header), ok (n, 1 where the fast path takes the frame), p (n, the fragment
 * size of a multi-fragment message's frame, 0 for a single frame).
 * Returns the number of frames taken.
 */
int
embnic_shard_check(const uint8_t *rx, int64_t slot, const int64_t *lens, int n,
		   const int64_t *tdim, const int64_t *tdt, const int64_t *tmaxlk,
		   int64_t shard_id, int64_t max_msg, int64_t *cols, uint8_t *ok,
		   int64_t *p)
{
	int taken = 0;

	for (int i = 0; i < n; i++) {
		int64_t *c = cols + (int64_t)i * EMBNIC_NB_HDR_FIELDS;
		int64_t len = lens[i];

		ok[i] = 0;
		p[i] = 0;
		if (len < EMBNIC_HDR_LEN) {
			memset(c, 0, EMBNIC_NB_HDR_FIELDS * sizeof(*c));
			continue;
		}
		parse_fields(rx + (int64_t)i * slot, c);

		int64_t mt = c[F_TYPE], dt = c[F_DTYPE], tid = c[F_TABLE];
		int64_t dim = c[F_DIM], nk = c[F_NKEYS], ml = c[F_MSG_LEN];
		int64_t fo = c[F_FOFF], fi = c[F_FIDX], fc = c[F_FCNT];
		int64_t fl = c[F_FLEN];
		/* LOOKUP_REQ / UPDATE_REQ (others are refused below) */
		int64_t expect = (int64_t)embnic_expected_msg_len(
			(uint8_t)mt, (uint32_t)nk, (uint16_t)dim, (uint8_t)dt);

		if (c[F_MAGIC] != EMBNIC_MAGIC ||
		    c[F_VERSION] != EMBNIC_PROTO_VERSION ||
		    (mt != EMBNIC_LOOKUP_REQ && mt != EMBNIC_UPDATE_REQ) ||
		    fl != len - EMBNIC_HDR_LEN || fc < 1 || fi >= fc ||
		    fo + fl > ml || ml != expect || nk <= 0 ||
		    fc > EMBNIC_MAX_FRAGS || ml > max_msg ||
		    c[F_SHARD] != shard_id || tdim[tid] != dim ||
		    tdt[tid] != dt ||
		    (mt == EMBNIC_LOOKUP_REQ && nk > tmaxlk[tid]))
			continue;

		/* fragment geometry (client_lib/reassembly.py, _geometry) */
		int good;

		if (fc == 1) {
			good = fo == 0 && fl == ml;
		} else if (fi == fc - 1) {
			int64_t safe_fi = fi > 1 ? fi : 1;

			p[i] = fo / safe_fi;
			good = fo % safe_fi == 0 && fo + fl == ml && fl > 0 &&
			       fl <= p[i];
		} else {
			int64_t safe_fl = fl > 1 ? fl : 1;

			p[i] = fl;
			good = fl > 0 && fo == fi * fl &&
			       (ml + safe_fl - 1) / safe_fl == fc;
		}
		ok[i] = (uint8_t)good;
		taken += good;
	}
	return taken;
}

static inline uint64_t
msg_key(const int64_t *c)
{
	return ((uint64_t)c[F_CLIENT] << 48) | ((uint64_t)c[F_MSG_ID] << 16) |
	       (uint64_t)c[F_TYPE];
}

/* the fields every fragment of a message must agree on (reassembly._SAME) */
static int
same_message(const int64_t *a, int64_t pa, const int64_t *b, int64_t pb)
{
	static const int f[] = { F_DTYPE, F_STATUS, F_TABLE, F_SHARD, F_DIM,
				 F_NKEYS, F_MSG_LEN, F_FCNT };

	for (unsigned int j = 0; j < sizeof(f) / sizeof(f[0]); j++)
		if (a[f[j]] != b[f[j]])
			return 0;
	return pa == pb;
}

/*
 * Group the m frames mg[0..m) (indices into cols/p, ascending) by message.
 *
 * Out: order (m, positions into mg sorted by message key then fragment index,
 * arrival order breaking ties), and per group g < G (returned):
 * grp[g * 6 + 0..5] = first position in order, frames, first datagram index
 * (smallest), last datagram index (largest), fragment size P, whole (1 when
 * the group holds every fragment of its message exactly once and all its
 * headers agree with the first one).
 */
int
embnic_shard_whole(const int64_t *cols, const int64_t *p, const int64_t *mg,
		   int m, int64_t *order, int64_t *grp)
{
	int g = 0;

	/* insertion sort: frames mostly arrive in message and fragment order */
	for (int i = 0; i < m; i++) {
		const int64_t *ci = cols + mg[i] * EMBNIC_NB_HDR_FIELDS;
		uint64_t ki = msg_key(ci);
		int64_t fi = ci[F_FIDX];
		int j = i;

		while (j > 0) {
			const int64_t *cj = cols + mg[order[j - 1]] * EMBNIC_NB_HDR_FIELDS;
			uint64_t kj = msg_key(cj);

			if (kj < ki || (kj == ki && cj[F_FIDX] <= fi))
				break;
			order[j] = order[j - 1];
			j--;
		}
		order[j] = i;
	}
	for (int s = 0; s < m;) {
		const int64_t *c0 = cols + mg[order[s]] * EMBNIC_NB_HDR_FIELDS;
		int64_t p0 = p[mg[order[s]]];
		uint64_t k0 = msg_key(c0);
		int64_t lo = mg[order[s]], hi = lo;
		int whole = 1, e = s;

		while (e < m) {
			int64_t idx = mg[order[e]];
			const int64_t *ce = cols + idx * EMBNIC_NB_HDR_FIELDS;

			if (msg_key(ce) != k0)
				break;
			if (ce[F_FIDX] != e - s || !same_message(c0, p0, ce, p[idx]))
				whole = 0;
			lo = idx < lo ? idx : lo;
			hi = idx > hi ? idx : hi;
			e++;
		}
		int64_t *o = grp + (int64_t)g * 6;

		o[0] = s;
		o[1] = e - s;
		o[2] = lo;
		o[3] = hi;
		o[4] = p0;
		o[5] = whole && e - s == c0[F_FCNT];
		g++;
		s = e;
	}
	return g;
}
