/* SPDX-License-Identifier: Apache-2.0
 *
 * FrameValidation: IPv4 / UDP / embnic checks of docs/protocol.md
 * ("Validity", "Fragmentation"), in the DPDK card's order (dataplane/
 * parse.c), so a malformed frame is counted under the same reason on both
 * targets. Sets meta.drop_reason; never forwards, never drops by itself.
 * Runs on frames whose Ethernet header was extracted and is not ARP.
 *
 * Protocol v2: a frame of another version (v1's included) is bad_version;
 * msg_len must be the type's length computed from the header's counts
 * (num_tables, num_keys, value_len) and the counts must fit the type,
 * else bad_length. No body byte is read: a request's directory is the
 * hosts' to check.
 *
 * Neither architecture divides or multiplies at run time here (arith.p4):
 * "frag_offset is a multiple of frag_count - 1" is a remainder by long
 * division, the fragment products (frag_count - 1 and frag_index times
 * frag_len) shift and add. The IPv4 header checksum is summed here too
 * (Ipv4HeaderSum), not by an architecture's checksum unit.
 *
 * Conditions are written the way p4c-dpdk 1.2.4.8 can lower them: no `!x`
 * as an operand of `||` or `&&` but the last, and no `>=`/`<=` as one of
 * `||` but the last (its BreakLogicalExpressionParenthesis stops with a
 * compiler bug on those; its midend turns `x == false` and bool locals back
 * into such operands, so only the order helps), and no bool assigned a
 * compound condition (`if` statements set it).
 */
#ifndef EMBNIC_VALIDATION_P4
#define EMBNIC_VALIDATION_P4

#include <core.p4>

#include "headers.p4"
#include "arith.p4"

control FrameValidation(in headers_t hdr,
                        inout local_metadata_t meta) {

    Ipv4HeaderSum() ipv4_sum;
    /* n mod d for a 32-bit n and 0 < d < 2^16 */
    bit<32> rem;
    bit<32> n;
    bit<32> d;

    apply {
        bit<32> frame_len = meta.frame_len;
        bit<16> ip_sum = 0xffff;
        if (hdr.ipv4.isValid() && hdr.ipv4.ihl == 5) {
            ipv4_sum.apply(hdr.ipv4, meta, ip_sum);
        }
        if (hdr.ethernet.ether_type != ETHERTYPE_IPV4) {
            meta.drop_reason = DROP_BAD_ETHER;
        } else if (!hdr.ipv4.isValid()) {
            meta.drop_reason = DROP_TOO_SHORT;
        } else if (hdr.ipv4.version != 4 || hdr.ipv4.ihl < 5) {
            meta.drop_reason = DROP_BAD_IP;
        } else if (hdr.ipv4.ihl > 5) {
            meta.drop_reason = DROP_IP_OPTIONS;
        } else if (hdr.ipv4.total_len < IPV4_HDR_LEN) {
            meta.drop_reason = DROP_BAD_IP;
        } else if ((bit<32>)hdr.ipv4.total_len > frame_len - (bit<32>)ETH_HDR_LEN) {
            meta.drop_reason = DROP_TRUNCATED;      /* cut short on the way */
        } else if (ip_sum != 0xffff ||
                   (hdr.ipv4.flags & 1) != 0 || hdr.ipv4.frag_offset != 0) {
            meta.drop_reason = DROP_BAD_IP;
        } else if (meta.port_ip != 0 && hdr.ipv4.dst_addr != meta.port_ip) {
            meta.drop_reason = DROP_WRONG_DST;
        } else if (hdr.ipv4.protocol != IP_PROTO_UDP) {
            meta.drop_reason = DROP_NOT_UDP;
        } else if (hdr.ipv4.total_len < IPV4_HDR_LEN + UDP_HDR_LEN) {
            meta.drop_reason = DROP_BAD_UDP;
        } else if (!hdr.udp.isValid()) {
            meta.drop_reason = DROP_TOO_SHORT;
        } else if (hdr.udp.length != hdr.ipv4.total_len - IPV4_HDR_LEN) {
            meta.drop_reason = DROP_BAD_UDP;
        } else if (hdr.udp.dst_port != EMBNIC_UDP_PORT) {
            meta.drop_reason = DROP_BAD_PORT;
        } else if (hdr.udp.length < UDP_HDR_LEN + EMBNIC_HDR_LEN || !hdr.embnic.isValid()) {
            meta.drop_reason = DROP_TOO_SHORT;
        } else if (hdr.embnic.magic != EMBNIC_MAGIC) {
            meta.drop_reason = DROP_BAD_MAGIC;
        } else if (hdr.embnic.version != EMBNIC_VERSION) {
            meta.drop_reason = DROP_BAD_VERSION;
        } else if (hdr.embnic.msg_type < MSG_LOOKUP_REQ || hdr.embnic.msg_type > MSG_UPDATE_NACK) {
            meta.drop_reason = DROP_BAD_TYPE;
        } else {
            /* lengths: 64-bit so that no field combination overflows */
            bit<64> off = (bit<64>)hdr.embnic.frag_offset;
            bit<64> len = (bit<64>)hdr.embnic.frag_len;
            bit<64> msg_len = (bit<64>)hdr.embnic.msg_len;
            bit<64> end = off + len;
            bit<64> nt = (bit<64>)hdr.embnic.num_tables;
            bit<64> nk = (bit<64>)hdr.embnic.num_keys;
            bit<64> vlen = (bit<64>)hdr.embnic.value_len;
            /* msg_len for the type, from the header alone (consts.expected_msg_len) */
            bit<64> keyed = EMBNIC_DIR_ENTRY * nt + EMBNIC_KEY_SIZE * nk;   /* directory + keys */
            bit<64> want = 0;
            if (hdr.embnic.msg_type == MSG_LOOKUP_REQ) {
                want = keyed;
            } else if (hdr.embnic.msg_type == MSG_LOOKUP_REPLY) {
                want = vlen;
            } else if (hdr.embnic.msg_type == MSG_UPDATE_REQ) {
                want = keyed + vlen;
            } else if (hdr.embnic.msg_type == MSG_SIZE_REQ) {
                want = EMBNIC_SIZE_ENTRY * nk;
            } else if (hdr.embnic.msg_type == MSG_UPDATE_NACK) {
                want = EMBNIC_NACK_LEN;
            }
            /* counts that fit the type (consts.header_counts_ok): a data request or a lookup
             * reply has T >= 1 tables, n >= T keys and value_len >= 2n (every row at least one
             * fp16 value); a SIZE_REQ T = 0 and n >= 1 entries; acks, NACKs, errors are unchecked */
            bool counts_ok = true;
            if (hdr.embnic.msg_type == MSG_LOOKUP_REQ || hdr.embnic.msg_type == MSG_LOOKUP_REPLY ||
                hdr.embnic.msg_type == MSG_UPDATE_REQ) {
                if (nt < 1 || nk < nt || vlen < EMBNIC_MIN_ROW * nk) {
                    counts_ok = false;
                }
            } else if (hdr.embnic.msg_type == MSG_SIZE_REQ) {
                if (nt != 0 || nk < 1) {
                    counts_ok = false;
                }
            }
            bit<16> payload = hdr.udp.length - UDP_HDR_LEN - EMBNIC_HDR_LEN;
            bit<64> idx = (bit<64>)hdr.embnic.frag_index;
            bit<64> count = (bit<64>)hdr.embnic.frag_count;
            bit<64> last = count - 1;
            /* last * len and idx * len: exact once frag_count <= 256 is known (the factors are
             * below 512), which every branch that uses them has checked */
            bit<64> last_x_len;
            bit<64> idx_x_len;
            EMBNIC_MUL9(last_x_len, last, len)
            EMBNIC_MUL9(idx_x_len, idx, len)

            /* `a >= b` written `a + 1 > b` in these || chains: p4c-dpdk 1.2.4.8 lowers a >= (which
             * the SWX pipeline has no jump for) in an || wrongly, as a jump past the then-branch
             * or none at all */
            bit<64> idx_end = idx + 1;
            bit<64> last_x_len_end = last_x_len + 1;
            if (hdr.embnic.frag_len != payload || hdr.embnic.frag_count == 0 || end > msg_len ||
                idx_end > count) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (want != msg_len || !counts_ok) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (hdr.embnic.frag_count > EMBNIC_MAX_FRAGS) {
                meta.drop_reason = DROP_TOO_MANY_FRAGS;
            } else if (last == 0) {
                /* one fragment: the whole body */
                if (off != 0 || end != msg_len) {
                    meta.drop_reason = DROP_FRAG_MISMATCH;
                }
            } else if (idx < last) {
                /* a full fragment: P = frag_len, offset i*P, ceil(msg_len/P) = frag_count */
                if (len == 0 || idx_x_len != off || last_x_len + len < msg_len ||
                    last_x_len_end > msg_len) {
                    meta.drop_reason = DROP_FRAG_MISMATCH;
                }
            } else if (end != msg_len) {
                meta.drop_reason = DROP_FRAG_MISMATCH;
            } else {
                /* the last fragment: offset (n-1)*P for some P with 0 < frag_len <= P */
                n = hdr.embnic.frag_offset;
                d = (bit<32>)last;
                EMBNIC_REM32(rem, n, d)
                /* P = frag_offset / last exactly; frag_len <= P <=> frag_len * last <= frag_offset */
                if (rem != 0 || len == 0 || last_x_len > off) {
                    meta.drop_reason = DROP_FRAG_MISMATCH;
                }
            }
        }
    }
}

#endif /* EMBNIC_VALIDATION_P4 */
