/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic wire protocol v2 in C: the 44-byte header, message types, dtypes,
 * the body-length rule a card checks from the header alone.
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
#define EMBNIC_PROTO_VERSION	2	/* override: make EMBNIC_PROTO_VERSION=N */
#endif
#define EMBNIC_UDP_PORT		7878
#define EMBNIC_HDR_LEN		44
#define EMBNIC_KEY_SIZE		8	/* bytes per key (u64 LE in bodies) */
#define EMBNIC_MAX_FRAGS	256	/* fragments per message, at most */
#define EMBNIC_SIZE_ENTRY	16	/* bytes per SIZE_REQ entry */
#define EMBNIC_DIR_ENTRY	16	/* bytes per directory entry (a table) */
#define EMBNIC_NO_TABLE		0xFFFF	/* table_id of a header naming no table */

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
	EMBNIC_UPDATE_NACK = 8,	/* the fragments of an update a shard holds */
};
#define EMBNIC_NB_TYPES 9	/* index 0 unused */
#define EMBNIC_NACK_LEN 32	/* body of an UPDATE_NACK: a bitmap of MAX_FRAGS bits */

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
	EMBNIC_STATUS_STORE_FULL = 8,
};

static inline int
embnic_is_request(uint8_t t)
{
	return t == EMBNIC_LOOKUP_REQ || t == EMBNIC_UPDATE_REQ ||
	       t == EMBNIC_SIZE_REQ;
}

/*
 * X(name, offset, size) for every field of the header, in wire order, as in
 * the table of docs/protocol.md: struct embnic_hdr, its static_asserts and
 * the build info are made from it.
 */
#define EMBNIC_HDR_FIELDS(X) \
	X(magic, 0, 2) \
	X(version, 2, 1) \
	X(msg_type, 3, 1) \
	X(flags, 4, 1) \
	X(reserved0, 5, 1) \
	X(status, 6, 2) \
	X(msg_id, 8, 4) \
	X(client_id, 12, 2) \
	X(shard_id, 14, 2) \
	X(num_tables, 16, 2) \
	X(table_id, 18, 2) \
	X(num_keys, 20, 4) \
	X(value_len, 24, 4) \
	X(msg_len, 28, 4) \
	X(frag_offset, 32, 4) \
	X(frag_index, 36, 2) \
	X(frag_count, 38, 2) \
	X(frag_len, 40, 2) \
	X(reserved, 42, 2)

#define EMBNIC_NB_HDR_FIELDS 19

/* A member of a field table: sz bytes, unsigned. */
#define EMBNIC_UINT_1	uint8_t
#define EMBNIC_UINT_2	uint16_t
#define EMBNIC_UINT_4	uint32_t
#define EMBNIC_MEMBER(f, off, sz)	EMBNIC_UINT_##sz f;

/*
 * The header as on the wire: every multi-byte field big-endian; table_id:
 * an ERROR's table, else EMBNIC_NO_TABLE. A request's tables (ids, dims,
 * dtypes) are in its body's directory, which only hosts read; the header
 * carries their count, the keys of all of them and value_len, the bytes of
 * their rows (docs/protocol.md, "Header").
 */
struct embnic_hdr {
	EMBNIC_HDR_FIELDS(EMBNIC_MEMBER)
} __attribute__((packed));

/*
 * The offset and size of field f of struct type, as a field table says
 * (EMBNIC_HDR_FIELDS, EMBNIC_DIR_FIELDS), checked at compile time.
 */
#define EMBNIC_ASSERT_LAYOUT(type, f, off, sz) \
	static_assert(offsetof(type, f) == (off), \
		      "offset of " #type "." #f); \
	static_assert(sizeof(((type *)0)->f) == (sz), \
		      "size of " #type "." #f);

static_assert(sizeof(struct embnic_hdr) == EMBNIC_HDR_LEN,
	      "embnic header must be 44 bytes");
#define EMBNIC_ASSERT_FIELD(f, off, sz) \
	EMBNIC_ASSERT_LAYOUT(struct embnic_hdr, f, off, sz)
EMBNIC_HDR_FIELDS(EMBNIC_ASSERT_FIELD)
#undef EMBNIC_ASSERT_FIELD

/*
 * A directory entry of a LOOKUP_REQ / UPDATE_REQ body (docs/protocol.md
 * "Body"): one per table, little-endian like every body. X(field, offset,
 * size): client_lib/consts.py DIR_ENTRY_FIELDS is the same table
 * (tests/dataplane/test_buildinfo.py compares them).
 */
#define EMBNIC_DIR_FIELDS(X) \
	X(table_id, 0, 2) \
	X(dim, 2, 2) \
	X(dtype, 4, 1) \
	X(reserved0, 5, 1) \
	X(reserved1, 6, 2) \
	X(num_keys, 8, 4) \
	X(reserved2, 12, 4)

struct embnic_dir_entry {
	EMBNIC_DIR_FIELDS(EMBNIC_MEMBER)
} __attribute__((packed));

static_assert(sizeof(struct embnic_dir_entry) == EMBNIC_DIR_ENTRY,
	      "a directory entry is 16 bytes");
#define EMBNIC_ASSERT_DIR_FIELD(f, off, sz) \
	EMBNIC_ASSERT_LAYOUT(struct embnic_dir_entry, f, off, sz)
EMBNIC_DIR_FIELDS(EMBNIC_ASSERT_DIR_FIELD)
#undef EMBNIC_ASSERT_DIR_FIELD

/* The header in host byte order (the fields a receiver uses). */
struct embnic_msg {
	uint32_t msg_id;
	uint32_t num_keys;
	uint32_t value_len;
	uint32_t msg_len;
	uint32_t frag_offset;
	uint16_t client_id;
	uint16_t shard_id;
	uint16_t num_tables;
	uint16_t table_id;
	uint16_t frag_index;
	uint16_t frag_count;
	uint16_t frag_len;
	uint16_t status;
	uint8_t msg_type;
	uint8_t flags;
	uint8_t version;
	uint8_t pad;
};
static_assert(sizeof(struct embnic_msg) == 40, "embnic_msg is 40 bytes");

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
 * through table_id, after 42 bytes of Ethernet/IPv4/UDP) to host order. The one
 * place, with embnic_hdr_decode(), that swaps header bytes: the RX stage
 * decodes the whole header, the TX stage re-reads only this part (the rest
 * travels in the mbuf).
 */
static inline void
embnic_hdr_decode_head(const struct embnic_hdr *h, struct embnic_msg *m)
{
	m->msg_id = embnic_ntoh32(h->msg_id);
	m->client_id = embnic_ntoh16(h->client_id);
	m->shard_id = embnic_ntoh16(h->shard_id);
	m->num_tables = embnic_ntoh16(h->num_tables);
	m->table_id = embnic_ntoh16(h->table_id);
	m->status = embnic_ntoh16(h->status);
	m->msg_type = h->msg_type;
	m->flags = h->flags;
	m->version = h->version;
	m->pad = 0;
}

/* The whole header to host order. */
static inline void
embnic_hdr_decode(const struct embnic_hdr *h, struct embnic_msg *m)
{
	embnic_hdr_decode_head(h, m);
	m->num_keys = embnic_ntoh32(h->num_keys);
	m->value_len = embnic_ntoh32(h->value_len);
	m->msg_len = embnic_ntoh32(h->msg_len);
	m->frag_offset = embnic_ntoh32(h->frag_offset);
	m->frag_index = embnic_ntoh16(h->frag_index);
	m->frag_count = embnic_ntoh16(h->frag_count);
	m->frag_len = embnic_ntoh16(h->frag_len);
}

/*
 * Body length (bytes) a message must have, from its header alone
 * (docs/protocol.md, "Body"; client_lib/consts.py expected_msg_len):
 * LOOKUP_REQ 16*T + 8*n (directory, keys), LOOKUP_REPLY value_len (rows),
 * UPDATE_REQ 16*T + 8*n + value_len (directory, keys, gradients), SIZE_REQ
 * 16*n (entries), the others 0. T = num_tables, n = num_keys. 64-bit, so
 * that no field combination overflows.
 */
static inline uint64_t
embnic_expected_msg_len(uint8_t type, uint16_t num_tables, uint32_t num_keys,
			uint32_t value_len)
{
	uint64_t dir_keys = (uint64_t)EMBNIC_DIR_ENTRY * num_tables +
			    (uint64_t)EMBNIC_KEY_SIZE * num_keys;

	switch (type) {
	case EMBNIC_LOOKUP_REQ:
		return dir_keys;
	case EMBNIC_LOOKUP_REPLY:
		return value_len;
	case EMBNIC_UPDATE_REQ:
		return dir_keys + value_len;
	case EMBNIC_SIZE_REQ:
		return (uint64_t)EMBNIC_SIZE_ENTRY * num_keys;
	case EMBNIC_UPDATE_NACK:
		return EMBNIC_NACK_LEN;
	default:
		return 0;
	}
}

/*
 * Do the header's counts fit its type (docs/protocol.md, "Validity",
 * bad_length; client_lib/consts.py header_counts_ok)? A lookup, its reply
 * and an update have T >= 1 tables, n >= T keys (each table one at least)
 * and value_len >= 2n (each row one fp16 value at least); a SIZE_REQ has
 * T = 0 and n >= 1 entries; UPDATE_ACK, ERROR and SIZE_ACK carry copies,
 * unchecked.
 */
static inline int
embnic_counts_ok(uint8_t type, uint16_t num_tables, uint32_t num_keys,
		 uint32_t value_len)
{
	switch (type) {
	case EMBNIC_LOOKUP_REQ:
	case EMBNIC_LOOKUP_REPLY:
	case EMBNIC_UPDATE_REQ:
		return num_tables >= 1 && num_keys >= num_tables &&
		       (uint64_t)value_len >= 2 * (uint64_t)num_keys;
	case EMBNIC_SIZE_REQ:
		return num_tables == 0 && num_keys >= 1;
	default:
		return 1;
	}
}

#endif /* EMBNIC_PROTO_H */
