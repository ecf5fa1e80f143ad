/* SPDX-License-Identifier: Apache-2.0
 *
 * HeaderRing: the headers of the last RING_SLOTS frames the card accepted,
 * as register arrays (one per kept field) and a head counter. Entry
 * (ring_head - k) mod RING_SLOTS, k = 1..min(ring_head, RING_SLOTS), is the
 * k-th most recent; `embnic state ring --last N` reads them.
 */
#ifndef EMBNIC_HEADER_RING_P4
#define EMBNIC_HEADER_RING_P4

#include <core.p4>

#include "headers.p4"

control HeaderRing(in headers_t hdr,
                   in local_metadata_t meta) {

    @name(".ring_head") EMBNIC_REGISTER(bit<32>, 1) ring_head;     /* frames logged since start */
    @name(".ring_msg_type") EMBNIC_REGISTER(bit<8>, RING_SLOTS) ring_msg_type;
    @name(".ring_flags") EMBNIC_REGISTER(bit<8>, RING_SLOTS) ring_flags;
    @name(".ring_msg_id") EMBNIC_REGISTER(bit<32>, RING_SLOTS) ring_msg_id;
    @name(".ring_client_id") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_client_id;
    @name(".ring_shard_id") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_shard_id;
    @name(".ring_num_tables") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_num_tables;
    @name(".ring_table_id") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_table_id;    /* an ERROR's table */
    @name(".ring_num_keys") EMBNIC_REGISTER(bit<32>, RING_SLOTS) ring_num_keys;
    @name(".ring_value_len") EMBNIC_REGISTER(bit<32>, RING_SLOTS) ring_value_len;
    @name(".ring_msg_len") EMBNIC_REGISTER(bit<32>, RING_SLOTS) ring_msg_len;
    @name(".ring_frag_index") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_frag_index;
    @name(".ring_frag_count") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_frag_count;
    @name(".ring_frag_len") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_frag_len;
    @name(".ring_ingress_port") EMBNIC_REGISTER(bit<16>, RING_SLOTS) ring_ingress_port;
    @name(".ring_time_us") EMBNIC_REGISTER(bit<48>, RING_SLOTS) ring_time_us;

    apply {
        bit<32> head;
        EMBNIC_READ(head, ring_head, 0);
        bit<32> i = head & (RING_SLOTS - 1);
        ring_msg_type.write(i, hdr.embnic.msg_type);
        ring_flags.write(i, hdr.embnic.flags);
        ring_msg_id.write(i, hdr.embnic.msg_id);
        ring_client_id.write(i, hdr.embnic.client_id);
        ring_shard_id.write(i, hdr.embnic.shard_id);
        ring_num_tables.write(i, hdr.embnic.num_tables);
        ring_table_id.write(i, hdr.embnic.table_id);
        ring_num_keys.write(i, hdr.embnic.num_keys);
        ring_value_len.write(i, hdr.embnic.value_len);
        ring_msg_len.write(i, hdr.embnic.msg_len);
        ring_frag_index.write(i, hdr.embnic.frag_index);
        ring_frag_count.write(i, hdr.embnic.frag_count);
        ring_frag_len.write(i, hdr.embnic.frag_len);
        ring_ingress_port.write(i, (bit<16>)meta.ingress_port);
        ring_time_us.write(i, meta.now_us);
        ring_head.write(0, head + 1);
    }
}

#endif /* EMBNIC_HEADER_RING_P4 */
