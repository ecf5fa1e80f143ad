/* SPDX-License-Identifier: Apache-2.0
 *
 * Arithmetic every architecture runs: values of at most 64 bits, and only
 * +, -, shifts and bitwise operations at run time. BMv2 has no run-time
 * division; DPDK's SWX pipeline (the PNA target) has no multiplication,
 * division or modulo at all (p4c-dpdk fails on a run-time `*`), and no
 * register or header field wider than 64 bits. So:
 *
 *   EMBNIC_MUL9(prod, a, b)   prod = a * b for a < 512 (9 bits), b and prod
 *                             bit<64>: shift and add, one step per bit of a,
 *                             no branch (the step's mask is 0 - bit)
 *   EMBNIC_REM32(rem, n, d)   rem = n mod d for bit<32> n and 0 < d < 2^16:
 *                             restoring division, one step per bit of n
 *   Ipv4HeaderChecksum        the IPv4 header checksum (RFC 791, RFC 1071) as
 *                             a one's-complement sum of the header's ten
 *                             16-bit words — fields narrower than 16 bits are
 *                             grouped into their words by hand: no checksum
 *                             extern (v1model's csum16, PNA's InternetChecksum,
 *                             which p4c-dpdk gets wrong on sub-16-bit fields)
 */
#ifndef EMBNIC_ARITH_P4
#define EMBNIC_ARITH_P4

#include "headers.p4"

#define EMBNIC_MUL_STEP(prod, a, b, i) \
    prod = prod + (((bit<64>)(b) << i) & ((bit<64>)0 - (((bit<64>)(a) >> i) & 1)));

#define EMBNIC_MUL9(prod, a, b) \
    prod = 0; \
    EMBNIC_MUL_STEP(prod, a, b, 0) EMBNIC_MUL_STEP(prod, a, b, 1) EMBNIC_MUL_STEP(prod, a, b, 2) \
    EMBNIC_MUL_STEP(prod, a, b, 3) EMBNIC_MUL_STEP(prod, a, b, 4) EMBNIC_MUL_STEP(prod, a, b, 5) \
    EMBNIC_MUL_STEP(prod, a, b, 6) EMBNIC_MUL_STEP(prod, a, b, 7) EMBNIC_MUL_STEP(prod, a, b, 8)

/* one step of restoring division: bring down bit i of n, subtract d if it fits */
#define EMBNIC_REM_STEP(rem, n, d, i) \
    rem = (rem << 1) | ((n >> i) & 1); \
    if (rem >= d) { rem = rem - d; }

#define EMBNIC_REM32(rem, n, d) \
    rem = 0; \
    EMBNIC_REM_STEP(rem, n, d, 31) EMBNIC_REM_STEP(rem, n, d, 30) EMBNIC_REM_STEP(rem, n, d, 29) \
    EMBNIC_REM_STEP(rem, n, d, 28) EMBNIC_REM_STEP(rem, n, d, 27) EMBNIC_REM_STEP(rem, n, d, 26) \
    EMBNIC_REM_STEP(rem, n, d, 25) EMBNIC_REM_STEP(rem, n, d, 24) EMBNIC_REM_STEP(rem, n, d, 23) \
    EMBNIC_REM_STEP(rem, n, d, 22) EMBNIC_REM_STEP(rem, n, d, 21) EMBNIC_REM_STEP(rem, n, d, 20) \
    EMBNIC_REM_STEP(rem, n, d, 19) EMBNIC_REM_STEP(rem, n, d, 18) EMBNIC_REM_STEP(rem, n, d, 17) \
    EMBNIC_REM_STEP(rem, n, d, 16) EMBNIC_REM_STEP(rem, n, d, 15) EMBNIC_REM_STEP(rem, n, d, 14) \
    EMBNIC_REM_STEP(rem, n, d, 13) EMBNIC_REM_STEP(rem, n, d, 12) EMBNIC_REM_STEP(rem, n, d, 11) \
    EMBNIC_REM_STEP(rem, n, d, 10) EMBNIC_REM_STEP(rem, n, d, 9)  EMBNIC_REM_STEP(rem, n, d, 8) \
    EMBNIC_REM_STEP(rem, n, d, 7)  EMBNIC_REM_STEP(rem, n, d, 6)  EMBNIC_REM_STEP(rem, n, d, 5) \
    EMBNIC_REM_STEP(rem, n, d, 4)  EMBNIC_REM_STEP(rem, n, d, 3)  EMBNIC_REM_STEP(rem, n, d, 2) \
    EMBNIC_REM_STEP(rem, n, d, 1)  EMBNIC_REM_STEP(rem, n, d, 0)

/*
 * Fold the 32-bit one's-complement sum in meta.csum_a to 16 bits, into
 * meta.csum_c (twice: the first fold can carry once more). Three fields,
 * each written once: p4c-dpdk 1.2.4.8 propagates values into later
 * expressions and, where the destination of an assignment appears in its own
 * (propagated) right-hand side, overwrites it before the last read (a local
 * `s = (s & 0xffff) + (s >> 16)` comes out wrong).
 */
#define EMBNIC_FOLD16(meta) \
    meta.csum_b = (meta.csum_a & 0xffff) + (meta.csum_a >> 16); \
    meta.csum_c = (meta.csum_b & 0xffff) + (meta.csum_b >> 16);

/*
 * The one's-complement sum (folded to 16 bits) of the IPv4 header's words,
 * the checksum field included: 0xFFFF for a header whose checksum is right;
 * with hdr_checksum 0, its complement is the checksum to write.
 */
control Ipv4HeaderSum(in ipv4_t ip, inout local_metadata_t meta, out bit<16> sum16) {
    apply {
        meta.csum_a = ((bit<32>)ip.version << 12) + ((bit<32>)ip.ihl << 8) + (bit<32>)ip.diffserv +
                      (bit<32>)ip.total_len + (bit<32>)ip.identification +
                      ((bit<32>)ip.flags << 13) + (bit<32>)ip.frag_offset +
                      ((bit<32>)ip.ttl << 8) + (bit<32>)ip.protocol + (bit<32>)ip.hdr_checksum +
                      (ip.src_addr >> 16) + (ip.src_addr & 0xffff) +
                      (ip.dst_addr >> 16) + (ip.dst_addr & 0xffff);
        EMBNIC_FOLD16(meta)
        sum16 = (bit<16>)meta.csum_c;
    }
}

#endif /* EMBNIC_ARITH_P4 */
