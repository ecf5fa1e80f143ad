/* SPDX-License-Identifier: Apache-2.0
 *
 * PNA's side of the architecture layer (p4c-dpdk's pna.p4, DPDK's SWX
 * pipeline): the externs the common controls use, as PNA spells them
 * (p4/v1model/arch.p4 spells the same for v1model), and the two
 * pseudo-headers the card's DPDK host (dataplane/swx/) exchanges with the
 * pipeline. Included by p4/pna/embnic.p4 before any common file.
 *
 *   registers      Register<T, bit<32>>(N); dst = reg.read(i) / reg.write(i, v)
 *   counters       Counter<bit<64>, bit<32>>(N, PNA_CounterType_t.PACKETS /
 *                  PACKETS_AND_BYTES); a byte counter is given the frame's
 *                  length (p4c-dpdk's count(index, pkt_len)): the length sent
 *   direct         DirectCounter, `pna_direct_counter = c` on the table,
 *   counters       count() in every action,
 *                  the default one's counting the misses (p4c-dpdk requires it)
 *   slot hash      Hash(PNA_HashAlgorithm_t.CRC32): the SWX pipeline's crc32,
 *                  DPDK's rte_hash_crc — CRC-32C (Castagnoli), not zlib's
 *                  CRC-32, and no final XOR — over the 6 bytes p4c-dpdk lays the
 *                  two fields out in (its metadata: little-endian); the slot is
 *                  its top STATE_SLOT_BITS bits: its low 12 bits over
 *                  consecutive msg_ids reach only half the slots (a CRC is
 *                  linear; that 12 x 12 map has rank 11), the top 12 nearly all;
 *                  embnic.control.targets.p4program.state_slot(..., arch="pna") computes it
 *
 * The pseudo-headers (the SWX pipeline has no frame length, no input
 * timestamp and no truncation of its own):
 *   embnic_rx_meta_t  16 bytes the host's input port puts before the frame:
 *                     arrival time in microseconds and the frame's length;
 *                     the parser extracts it, the deparser never emits it
 *   embnic_tx_meta_t  4 bytes the deparser emits before the frame: how many
 *                     bytes of it to send (a shorter length drops an Ethernet
 *                     trailer); the host's output port strips it
 */
#ifndef EMBNIC_ARCH_PNA_P4
#define EMBNIC_ARCH_PNA_P4

#include <core.p4>
#include <dpdk/pna.p4>      /* p4c-dpdk's PNA: the generic p4include/pna.p4 has no CRC32 */

#define EMBNIC_ARCH_PNA 1

header embnic_rx_meta_t {
    bit<64> time_us;        /* arrival time, microseconds (the host's clock) */
    bit<32> frame_len;      /* bytes of the frame after this header */
    bit<32> reserved;
}

header embnic_tx_meta_t {
    bit<16> send_len;       /* bytes of the frame after this header to send */
    bit<16> reserved;
}

#define EMBNIC_ARCH_HEADERS \
    embnic_rx_meta_t rx_meta; \
    embnic_tx_meta_t tx_meta;

#define EMBNIC_REGISTER(T, N) Register<T, bit<32>>(N)
#define EMBNIC_READ(dst, reg, i) dst = reg.read(i)

#define EMBNIC_PACKET_COUNTER(N) Counter<bit<64>, bit<32>>(N, PNA_CounterType_t.PACKETS)
#define EMBNIC_FRAME_COUNTER(N) Counter<bit<64>, bit<32>>(N, PNA_CounterType_t.PACKETS_AND_BYTES)
#define EMBNIC_COUNT(c, i) c.count(i)
#define EMBNIC_COUNT_FRAME(c, i, len) c.count(i, len)

#define EMBNIC_DIRECT_COUNTER DirectCounter<bit<64>>(PNA_CounterType_t.PACKETS)
#define EMBNIC_TABLE_COUNTERS(c) pna_direct_counter = c;
#define EMBNIC_DIRECT_COUNT(c) c.count();

#define EMBNIC_SLOT_HASH_UNIT Hash<bit<32>>(PNA_HashAlgorithm_t.CRC32) slot_hash;
#define EMBNIC_SLOT_HASH(dst, client, msg) \
    dst = slot_hash.get_hash({ client, msg }) >> (32 - STATE_SLOT_BITS)

#endif /* EMBNIC_ARCH_PNA_P4 */
