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
#include <v1model.p4>

#include "headers.p4"

control HeaderRing(in headers_t hdr,
                   in local_metadata_t meta,
                   in standard_metadata_t standard_metadata) {

    @name(".ring_head") register<bit<32>>(1) ring_head;     /* frames logged since start */
    @name(".ring_msg_type") register<bit<8>>(RING_SLOTS) ring_msg_type;
    @name(".ring_flags") register<bit<8>>(RING_SLOTS) ring_flags;
    @name(".ring_msg_id") register<bit<32>>(RING_SLOTS) ring_msg_id;
    @name(".ring_client_id") register<bit<16>>(RING_SLOTS) ring_client_id;
    @name(".ring_shard_id") register<bit<16>>(RING_SLOTS) ring_shard_id;
    @name(".ring_num_tables") register<bit<16>>(RING_SLOTS) ring_num_tables;
    @name(".ring_table_id") register<bit<16>>(RING_SLOTS) ring_table_id;    /* an ERROR's table */
    @name(".ring_num_keys") register<bit<32>>(RING_SLOTS) ring_num_keys;
    @name(".ring_value_len") register<bit<32>>(RING_SLOTS) ring_value_len;
    @name(".ring_msg_len") register<bit<32>>(RING_SLOTS) ring_msg_len;
    @name(".ring_frag_index") register<bit<16>>(RING_SLOTS) ring_frag_index;
    @name(".ring_frag_count") register<bit<16>>(RING_SLOTS) ring_frag_count;
    @name(".ring_frag_len") register<bit<16>>(RING_SLOTS) ring_frag_len;
    @name(".ring_ingress_port") register<bit<16>>(RING_SLOTS) ring_ingress_port;
    @name(".ring_time_us") register<bit<48>>(RING_SLOTS) ring_time_us;

    apply {
        bit<32> head;
        ring_head.read(head, 0);
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
        ring_ingress_port.write(i, (bit<16>)standard_metadata.ingress_port);
        ring_time_us.write(i, standard_metadata.ingress_global_timestamp);
        ring_head.write(0, head + 1);
    }
}

#endif /* EMBNIC_HEADER_RING_P4 */
