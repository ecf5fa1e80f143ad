/* SPDX-License-Identifier: Apache-2.0
 *
 * Parse and validate one received frame (parse.c): Ethernet / IPv4 / UDP /
 * embnic header, and answer ARP for the card's address. Pure functions on a
 * byte buffer (no mbuf, no EAL) so the libFuzzer target links parse.c alone.
 */
#ifndef EMBNIC_PARSE_H
#define EMBNIC_PARSE_H

#include <stdint.h>

#include "embnic_proto.h"

/* A 32-bit word at any address (headers after Ethernet are 2-byte aligned). */
typedef uint32_t embnic_u32u __attribute__((aligned(1), may_alias));

/* Fold a sum of 32-bit words to the 16-bit one's-complement sum (RFC 1071). */
static inline uint16_t
embnic_csum_fold(uint64_t sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)sum;
}

/*
 * One's-complement sum of a 20-byte IPv4 header without options, in memory
 * byte order like rte_raw_cksum(). A header with the right checksum sums to
 * 0xffff. Five word loads, no copy through the stack.
 */
static inline uint16_t
embnic_ipv4_sum20(const void *hdr)
{
	const embnic_u32u *w = (const embnic_u32u *)hdr;

	return embnic_csum_fold((uint64_t)w[0] + w[1] + w[2] + w[3] + w[4]);
}

/*
 * X(ENUM, name): every drop reason, in the order of docs/control-socket.md.
 * The name is the counter name on the control socket and in telemetry.
 */
#define EMBNIC_DROP_REASONS(X) \
	X(TOO_SHORT, too_short) \
	X(BAD_ETHER, bad_ether) \
	X(BAD_IP, bad_ip) \
	X(IP_OPTIONS, ip_options) \
	X(NOT_UDP, not_udp) \
	X(BAD_UDP, bad_udp) \
	X(BAD_PORT, bad_port) \
	X(BAD_MAGIC, bad_magic) \
	X(BAD_VERSION, bad_version) \
	X(BAD_TYPE, bad_type) \
	X(BAD_LENGTH, bad_length) \
	X(UNKNOWN_CLIENT, unknown_client) \
	X(UNKNOWN_SERVER, unknown_server) \
	X(UNKNOWN_SHARD, unknown_shard) \
	X(RING_FULL, ring_full) \
	X(NO_MBUF, no_mbuf) \
	X(TX_FULL, tx_full) \
	X(STATE_FULL, state_full) \
	X(ARP_IGNORED, arp_ignored) \
	X(WRONG_DST, wrong_dst) \
	X(FRAG_MISMATCH, frag_mismatch) \
	X(TOO_MANY_FRAGS, too_many_frags) \
	X(UNSOLICITED_REPLY, unsolicited_reply) \
	X(WRONG_SHARD_REPLY, wrong_shard_reply) \
	X(WRONG_REPLY_TYPE, wrong_reply_type) \
	X(BAD_REPLY_LEN, bad_reply_len) \
	X(TRUNCATED, truncated) \
	X(TOO_LONG_FOR_PORT, too_long_for_port) \
	X(WRONG_PORT, wrong_port)

enum embnic_drop {
	EMBNIC_DROP_NONE = 0,
#define EMBNIC_DROP_ENUM(e, n) EMBNIC_DROP_##e,
	EMBNIC_DROP_REASONS(EMBNIC_DROP_ENUM)
#undef EMBNIC_DROP_ENUM
	EMBNIC_DROP_MAX
};

/*
 * Lengths of one fragment against its own header (docs/protocol.md):
 * bad_length for what does not fit (the frame, the message, msg_len the
 * type's formula of num_tables, num_keys and value_len, counts that do not
 * fit the type), too_many_frags for more than EMBNIC_MAX_FRAGS fragments,
 * frag_mismatch for offsets that disagree with frag_index under "fragment
 * i carries [i*P, (i+1)*P)". From the header alone: no body byte is read.
 * payload: UDP payload bytes after the embnic header. The card (parse.c)
 * and the shard's C intake (shard/intake.c) both check with it.
 */
static inline int
embnic_check_lengths(const struct embnic_msg *m, uint32_t payload)
{
	uint64_t end = (uint64_t)m->frag_offset + m->frag_len;
	uint64_t p;
	uint32_t last;

	if (m->frag_len != payload || m->frag_count == 0 ||
	    m->frag_index >= m->frag_count || end > m->msg_len)
		return EMBNIC_DROP_BAD_LENGTH;
	if (embnic_expected_msg_len(m->msg_type, m->num_tables, m->num_keys,
				    m->value_len) != m->msg_len ||
	    !embnic_counts_ok(m->msg_type, m->num_tables, m->num_keys,
			      m->value_len))
		return EMBNIC_DROP_BAD_LENGTH;
	if (m->frag_count > EMBNIC_MAX_FRAGS)
		return EMBNIC_DROP_TOO_MANY_FRAGS;

	last = (uint32_t)m->frag_count - 1;
	if (last == 0) {
		/* one fragment: the whole body */
		if (m->frag_offset != 0 || end != m->msg_len)
			return EMBNIC_DROP_FRAG_MISMATCH;
	} else if (m->frag_index < last) {
		/* a full fragment: P = frag_len, offset i*P, ceil(len/P) = n */
		p = m->frag_len;
		if (p == 0 || (uint64_t)m->frag_index * p != m->frag_offset ||
		    (uint64_t)last * p >= m->msg_len ||
		    (uint64_t)m->frag_count * p < m->msg_len)
			return EMBNIC_DROP_FRAG_MISMATCH;
	} else {
		/* the last fragment: offset (n-1)*P, 0 < frag_len <= P */
		if (end != m->msg_len || m->frag_offset % last != 0)
			return EMBNIC_DROP_FRAG_MISMATCH;
		p = m->frag_offset / last;
		if (m->frag_len == 0 || m->frag_len > p)
			return EMBNIC_DROP_FRAG_MISMATCH;
	}
	return EMBNIC_DROP_NONE;
}

/*
 * The fragment size P of a message as one of its fragments (which passed
 * embnic_check_lengths) implies it, expressed as the body bytes of its last
 * fragment: msg_len - (frag_count - 1) * P, in 0..UINT16_MAX. Two fragments
 * of one message are cut at the same P exactly when they give the same
 * value, so a receiver keeps it from the first-seen fragment and drops a
 * later one that gives another (frag_mismatch), with no division.
 */
static inline uint16_t
embnic_frag_last_len(const struct embnic_msg *m)
{
	if (m->frag_index + 1 == m->frag_count)
		return m->frag_len;
	return (uint16_t)(m->msg_len -
			  (uint32_t)(m->frag_count - 1) * m->frag_len);
}

/* Counter name of a drop reason ("too_short", ...); NULL if out of range. */
const char *embnic_drop_name(unsigned int reason);

/* Return values of embnic_parse() besides a drop reason (> 0). */
#define EMBNIC_PARSE_OK		0	/* an embnic frame; info filled */
#define EMBNIC_PARSE_ARP	(-1)	/* an ARP frame: see embnic_arp_reply() */

/* IPv4 header checksum state known from the NIC (mbuf ol_flags). */
enum embnic_csum_hint {
	EMBNIC_CSUM_UNKNOWN = 0,	/* verify in software */
	EMBNIC_CSUM_GOOD = 1,
	EMBNIC_CSUM_BAD = 2,
};

/* What parse extracts from a valid embnic frame. */
struct embnic_pkt_info {
	struct embnic_msg msg;	/* header, host byte order */
	uint32_t src_ip;	/* sender IPv4, network order */
	uint16_t src_port;	/* sender UDP port, network order */
	uint16_t frame_len;	/* 14 + IPv4 total length: bytes to send on */
};

/*
 * Parse and validate one frame (docs/protocol.md, "Validity").
 *
 * data: the first segment, seg_len bytes of it readable; pkt_len: bytes of
 * the whole frame (>= seg_len). All headers must lie in the first segment.
 * port_ip: the card's IPv4 address on the receiving port (network order);
 * frames to another address are dropped as wrong_dst; 0 accepts any.
 *
 * Returns EMBNIC_PARSE_OK (info filled), EMBNIC_PARSE_ARP, or the drop
 * reason (enum embnic_drop, > 0). Never reads past data[seg_len - 1].
 */
int embnic_parse(const uint8_t *data, uint32_t seg_len, uint32_t pkt_len,
		 enum embnic_csum_hint csum, uint32_t port_ip,
		 struct embnic_pkt_info *info);

/*
 * Turn an ARP request for port_ip (network order) into the reply in place,
 * from port_mac. Returns 0 when the frame is now a reply to send back on
 * the receiving port, EMBNIC_DROP_ARP_IGNORED otherwise (not a request,
 * not for us, malformed, or port_ip is 0).
 */
int embnic_arp_reply(uint8_t *data, uint32_t seg_len, uint32_t port_ip,
		     const uint8_t port_mac[6]);

#endif /* EMBNIC_PARSE_H */
