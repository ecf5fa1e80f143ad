/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic wire protocol v1 in C: the 40-byte header, message types, dtypes.
 *
 * Source of truth: docs/protocol.md. This header has no DPDK dependency so
 * the fuzz target and tools can include it alone. The layout is pinned by
 * static_assert below and exported in the .embnic_buildinfo ELF section,
 * which tests/dataplane/test_buildinfo.py compares with
 * embnic.client_lib.consts.HEADER_FIELDS.
 */
#ifndef EMBNIC_PROTO_H
#define EMBNIC_PROTO_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define EMBNIC_MAGIC		0x454D	/* "EM" */
#ifndef EMBNIC_PROTO_VERSION
#define EMBNIC_PROTO_VERSION	1	/* override: make EMBNIC_PROTO_VERSION=N */
#endif
#define EMBNIC_UDP_PORT		7878
#define EMBNIC_HDR_LEN		40
#define EMBNIC_KEY_SIZE		8	/* bytes per key (u64 LE in bodies) */
#define EMBNIC_MAX_FRAGS	256	/* fragments per message, at most */
#define EMBNIC_SIZE_ENTRY	16	/* bytes per SIZE_REQ entry */

/* Ethernet + IPv4 (no options) + UDP + embnic header, bytes */
#define EMBNIC_ETH_LEN		14
#define EMBNIC_IPV4_LEN		20
#define EMBNIC_UDP_LEN		8
#define EMBNIC_MIN_FRAME \
	(EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN + EMBNIC_UDP_LEN + EMBNIC_HDR_LEN)

enum embnic_msg_type {
	EMBNIC_LOOKUP_REQ = 1,
	EMBNIC_LOOKUP_REPLY = 2,
	EMBNIC_UPDATE_REQ = 3,
	EMBNIC_UPDATE_ACK = 4,
	EMBNIC_ERROR = 5,
	EMBNIC_SIZE_REQ = 6,	/* fixed-length mode: sizes of the data to come */
	EMBNIC_SIZE_ACK = 7,
};
#define EMBNIC_NB_TYPES 8	/* index 0 unused */

#define EMBNIC_FLAG_RETRANSMIT	0x01

enum embnic_dtype {
	EMBNIC_DTYPE_NONE = 0,
	EMBNIC_DTYPE_FP32 = 1,
	EMBNIC_DTYPE_FP16 = 2,
};

enum embnic_status {
	EMBNIC_STATUS_OK = 0,
	EMBNIC_STATUS_MALFORMED = 1,
	EMBNIC_STATUS_UNKNOWN_TABLE = 2,
	EMBNIC_STATUS_WRONG_SHARD = 3,
	EMBNIC_STATUS_DIM_MISMATCH = 4,
	EMBNIC_STATUS_KEY_OUT_OF_RANGE = 5,
	EMBNIC_STATUS_NOT_OWNER = 6,
	EMBNIC_STATUS_INTERNAL = 7,
};

static inline int
embnic_is_request(uint8_t t)
{
	return t == EMBNIC_LOOKUP_REQ || t == EMBNIC_UPDATE_REQ ||
	       t == EMBNIC_SIZE_REQ;
}

/* The header as on the wire: every multi-byte field big-endian. */
struct embnic_hdr {
	uint16_t magic;
	uint8_t version;
	uint8_t msg_type;
	uint8_t flags;
	uint8_t dtype;
	uint16_t status;
	uint32_t msg_id;
	uint16_t client_id;
	uint16_t table_id;
	uint16_t shard_id;
	uint16_t dim;
	uint32_t num_keys;
	uint32_t msg_len;
	uint32_t frag_offset;
	uint16_t frag_index;
	uint16_t frag_count;
	uint16_t frag_len;
	uint16_t reserved;
} __attribute__((packed));

/*
 * X(name, offset, size) for every field, in wire order, as in the table of
 * docs/protocol.md. Used for the static_asserts below and the build info.
 */
#define EMBNIC_HDR_FIELDS(X) \
	X(magic, 0, 2) \
	X(version, 2, 1) \
	X(msg_type, 3, 1) \
	X(flags, 4, 1) \
	X(dtype, 5, 1) \
	X(status, 6, 2) \
	X(msg_id, 8, 4) \
	X(client_id, 12, 2) \
	X(table_id, 14, 2) \
	X(shard_id, 16, 2) \
	X(dim, 18, 2) \
	X(num_keys, 20, 4) \
	X(msg_len, 24, 4) \
	X(frag_offset, 28, 4) \
	X(frag_index, 32, 2) \
	X(frag_count, 34, 2) \
	X(frag_len, 36, 2) \
	X(reserved, 38, 2)

#define EMBNIC_NB_HDR_FIELDS 18

static_assert(sizeof(struct embnic_hdr) == EMBNIC_HDR_LEN,
	      "embnic header must be 40 bytes");
#define EMBNIC_ASSERT_FIELD(f, off, sz) \
	static_assert(offsetof(struct embnic_hdr, f) == (off), \
		      "offset of embnic_hdr." #f); \
	static_assert(sizeof(((struct embnic_hdr *)0)->f) == (sz), \
		      "size of embnic_hdr." #f);
EMBNIC_HDR_FIELDS(EMBNIC_ASSERT_FIELD)
#undef EMBNIC_ASSERT_FIELD

/* The header in host byte order, as carried in a ring descriptor. */
struct embnic_msg {
	uint32_t msg_id;
	uint32_t num_keys;
	uint32_t msg_len;
	uint32_t frag_offset;
	uint16_t client_id;
	uint16_t table_id;
	uint16_t shard_id;
	uint16_t dim;
	uint16_t frag_index;
	uint16_t frag_count;
	uint16_t frag_len;
	uint16_t status;
	uint8_t msg_type;
	uint8_t flags;
	uint8_t dtype;
	uint8_t version;
};
static_assert(sizeof(struct embnic_msg) == 36, "embnic_msg is 36 bytes");

/*
 * Network to host order with the compiler's byte swaps: DPDK's x86
 * rte_bswap16() is an asm volatile, which the compiler can neither fold
 * into a load nor schedule.
 */
static inline uint16_t
embnic_ntoh16(uint16_t x)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return __builtin_bswap16(x);
#else
	return x;
#endif
}

static inline uint32_t
embnic_ntoh32(uint32_t x)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return __builtin_bswap32(x);
#else
	return x;
#endif
}

/*
 * The header's fields in the frame's first cache line (offsets 0..21:
 * through dim, after 42 bytes of Ethernet/IPv4/UDP) to host order. The one
 * place, with embnic_hdr_decode(), that swaps header bytes: the RX stage
 * decodes the whole header, the TX stage re-reads only this part (the rest
 * travels in the mbuf).
 */
static inline void
embnic_hdr_decode_head(const struct embnic_hdr *h, struct embnic_msg *m)
{
	m->msg_id = embnic_ntoh32(h->msg_id);
	m->client_id = embnic_ntoh16(h->client_id);
	m->table_id = embnic_ntoh16(h->table_id);
	m->shard_id = embnic_ntoh16(h->shard_id);
	m->dim = embnic_ntoh16(h->dim);
	m->status = embnic_ntoh16(h->status);
	m->msg_type = h->msg_type;
	m->flags = h->flags;
	m->dtype = h->dtype;
	m->version = h->version;
}

/* The whole header to host order. */
static inline void
embnic_hdr_decode(const struct embnic_hdr *h, struct embnic_msg *m)
{
	embnic_hdr_decode_head(h, m);
	m->num_keys = embnic_ntoh32(h->num_keys);
	m->msg_len = embnic_ntoh32(h->msg_len);
	m->frag_offset = embnic_ntoh32(h->frag_offset);
	m->frag_index = embnic_ntoh16(h->frag_index);
	m->frag_count = embnic_ntoh16(h->frag_count);
	m->frag_len = embnic_ntoh16(h->frag_len);
}

/* Bytes per element of a dtype (0 for none or unknown). */
static inline uint32_t
embnic_dtype_size(uint8_t dtype)
{
	return dtype == EMBNIC_DTYPE_FP32 ? 4 : dtype == EMBNIC_DTYPE_FP16 ? 2 : 0;
}

/*
 * Body length (bytes) a message must have (docs/protocol.md, "Body").
 * 64-bit so that no field combination overflows.
 */
static inline uint64_t
embnic_expected_msg_len(uint8_t type, uint32_t num_keys, uint16_t dim,
			uint8_t dtype)
{
	uint64_t row = (uint64_t)dim * embnic_dtype_size(dtype);

	switch (type) {
	case EMBNIC_LOOKUP_REQ:
		return (uint64_t)EMBNIC_KEY_SIZE * num_keys;
	case EMBNIC_LOOKUP_REPLY:
		return (uint64_t)num_keys * row;
	case EMBNIC_UPDATE_REQ:
		return (uint64_t)num_keys * (EMBNIC_KEY_SIZE + row);
	case EMBNIC_SIZE_REQ:
		return (uint64_t)EMBNIC_SIZE_ENTRY * num_keys;
	default:
		return 0;
	}
}

#endif /* EMBNIC_PROTO_H */
