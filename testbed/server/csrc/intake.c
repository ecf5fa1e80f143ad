/* SPDX-License-Identifier: Apache-2.0
 *
 * The shard's intake, in C: what the serving loop does per wake-up before any
 * table is touched, every header of a recvmmsg batch checked (embnic_shard_check)
 * and the multi-fragment frames grouped by message (embnic_shard_whole). Its
 * numpy oracle: tests/testbed/shard_oracle.py.
 */
#include <stdint.h>
#include <string.h>

#include "embnic_parse.h"
#include "embnic_proto.h"
#include "shard.h"

/* what the caller checks before using this library (canswer.py) */
int
embnic_shard_abi(void)
{
	return EMBNIC_PROTO_VERSION * 1000 + EMBNIC_NB_HDR_FIELDS;
}

static_assert(EMBNIC_NB_HDR_FIELDS == F_END, "one column per header field");

/*
 * Check the n frames rx[i * slot .. + lens[i]] (i < n).
 *
 * shard_id: this shard. max_msg: the largest message body taken. max_reply:
 * the largest lookup reply (value_len) that fits EMBNIC_MAX_FRAGS fragments
 * at the shard's MTU. Only what the header alone says (the body's directory
 * is checked on the whole message: testbed/server/shard_state.py).
 *
 * Out: cols (n x 19, the header fields, zeros for a frame shorter than a
 * header), ok (n, 1 where the fast path takes the frame), p (n, the fragment
 * size of a multi-fragment message's frame, 0 for a single frame).
 * Returns the number of frames taken.
 */
int
embnic_shard_check(const uint8_t *rx, int64_t slot, const int64_t *lens, int n,
		   int64_t shard_id, int64_t max_msg, int64_t max_reply,
		   int64_t *cols, uint8_t *ok, int64_t *p)
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
		struct embnic_msg m;
		const struct embnic_hdr *h = (const struct embnic_hdr *)(rx + (int64_t)i * slot);

		/* the row of cols: every field in host order, as the one field table lists
		 * them (HDR_SWAP, as put_header writes them); m: the same for the card's checks */
		embnic_hdr_decode(h, &m);
#define GET_FIELD(name, off, size) c[F_##name] = HDR_SWAP(h->name, size);
		EMBNIC_HDR_FIELDS(GET_FIELD)
#undef GET_FIELD

		/* LOOKUP_REQ / UPDATE_REQ of this shard whose lengths, counts
		 * and fragment geometry pass the card's own rules, and a lookup
		 * whose reply fits EMBNIC_MAX_FRAGS fragments */
		int good = c[F_magic] == EMBNIC_MAGIC &&
			   m.version == EMBNIC_PROTO_VERSION &&
			   (m.msg_type == EMBNIC_LOOKUP_REQ ||
			    m.msg_type == EMBNIC_UPDATE_REQ) &&
			   embnic_check_lengths(&m, (uint32_t)(len - EMBNIC_HDR_LEN)) ==
				   EMBNIC_DROP_NONE &&
			   m.msg_len <= max_msg && m.shard_id == shard_id &&
			   (m.msg_type != EMBNIC_LOOKUP_REQ ||
			    (int64_t)m.value_len <= max_reply);

		if (!good)
			continue;
		/* the fragment size P (client_lib/reassembly.py, _geometry) */
		if (m.frag_count > 1)
			p[i] = m.frag_index == m.frag_count - 1 ?
				       m.frag_offset / m.frag_index : m.frag_len;
		ok[i] = (uint8_t)good;
		taken += good;
	}
	return taken;
}

static inline uint64_t
msg_key(const int64_t *c)
{
	return ((uint64_t)c[F_client_id] << 48) | ((uint64_t)c[F_msg_id] << 16) |
	       (uint64_t)c[F_msg_type];
}

/* the fields every fragment of a message must agree on besides its key
 * (reassembly._SAME: consts.MESSAGE_FIELDS but msg_type, msg_id, client_id) */
static int
same_message(const int64_t *a, int64_t pa, const int64_t *b, int64_t pb)
{
	static const int f[] = { F_status, F_shard_id, F_num_tables, F_table_id,
				 F_num_keys, F_value_len, F_msg_len, F_frag_count };

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
		int64_t fi = ci[F_frag_index];
		int j = i;

		while (j > 0) {
			const int64_t *cj = cols + mg[order[j - 1]] * EMBNIC_NB_HDR_FIELDS;
			uint64_t kj = msg_key(cj);

			if (kj < ki || (kj == ki && cj[F_frag_index] <= fi))
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
			if (ce[F_frag_index] != e - s || !same_message(c0, p0, ce, p[idx]))
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
		o[5] = whole && e - s == c0[F_frag_count];
		g++;
		s = e;
	}
	return g;
}
