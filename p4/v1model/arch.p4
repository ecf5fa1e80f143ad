/* SPDX-License-Identifier: Apache-2.0
 *
 * v1model's side of the architecture layer: the externs the common controls
 * use, as v1model spells them (p4/pna/arch.p4 spells the same for PNA).
 * Included by p4/v1model/embnic.p4 before any common file.
 *
 *   registers      register<T>(N); reg.read(dst, i) / reg.write(i, v)
 *   counters       counter(N, CounterType.packets / packets_and_bytes): the
 *                  switch counts a frame's bytes itself (as it entered)
 *   direct         direct_counter, `counters = c` on the table; each entry
 *   counters       counts its hits and the default entry the misses, by the switch (no count()
 *                  in actions)
 *   slot hash      hash(..., HashAlgorithm.crc32, ...): zlib's CRC-32 over
 *                  client_id (be16) ++ msg_id (be32), modulo STATE_SLOTS
 */
#ifndef EMBNIC_ARCH_V1MODEL_P4
#define EMBNIC_ARCH_V1MODEL_P4

#include <core.p4>
#include <v1model.p4>

#define EMBNIC_ARCH_V1MODEL 1

#define EMBNIC_REGISTER(T, N) register<T>(N)
#define EMBNIC_READ(dst, reg, i) reg.read(dst, i)

#define EMBNIC_PACKET_COUNTER(N) counter(N, CounterType.packets)
#define EMBNIC_FRAME_COUNTER(N) counter(N, CounterType.packets_and_bytes)
#define EMBNIC_COUNT(c, i) c.count(i)
#define EMBNIC_COUNT_FRAME(c, i, len) c.count(i)

#define EMBNIC_DIRECT_COUNTER direct_counter(CounterType.packets)
#define EMBNIC_TABLE_COUNTERS(c) counters = c;
#define EMBNIC_DIRECT_COUNT(c)

#define EMBNIC_SLOT_HASH_UNIT
#define EMBNIC_SLOT_HASH(dst, client, msg) \
    hash(dst, HashAlgorithm.crc32, (bit<32>)0, { client, msg }, STATE_SLOTS)

#endif /* EMBNIC_ARCH_V1MODEL_P4 */
