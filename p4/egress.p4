/* SPDX-License-Identifier: Apache-2.0
 *
 * EmbnicEgress: rewrite of a forwarded embnic frame for its peer, like the
 * DPDK card (dataplane/tx.c, rewrite): Ethernet source = the card port's
 * MAC (source_by_egress_port), destination = the peer's; IPv4 source = the
 * card port's address, destination = the peer's, TTL CARD_TTL (the header
 * checksum is recomputed in EmbnicComputeChecksum); UDP source port 7878,
 * destination the peer's. The UDP checksum is updated incrementally
 * (RFC 1624) over the changed words only, so the body is never summed: a
 * checksum of 0 ("none") stays 0 and one that computes to 0 is sent as
 * 0xFFFF. Ethernet padding after the IPv4 datagram is not sent on.
 * ARP replies leave as ArpResponder made them.
 */
#ifndef EMBNIC_EGRESS_P4
#define EMBNIC_EGRESS_P4

#include <core.p4>
#include <v1model.p4>

#include "headers.p4"

control EmbnicEgress(inout headers_t hdr,
                     inout local_metadata_t meta,
                     inout standard_metadata_t standard_metadata) {

    @name(".tx_frames") counter(NB_PORTS, CounterType.packets_and_bytes) tx_frames;   /* by egress port */
    @name(".source_by_egress_port_counter") direct_counter(CounterType.packets) source_by_egress_port_counter;

    mac_addr_t src_mac = 0;
    ipv4_addr_t src_ip = 0;

    @name(".rewrite_source")
    action rewrite_source(mac_addr_t mac, ipv4_addr_t ip) {
        src_mac = mac;
        src_ip = ip;
    }

    @name(".keep_source")
    action keep_source() {
        src_mac = hdr.ethernet.dst_addr;
        src_ip = hdr.ipv4.dst_addr;
    }

    @name(".source_by_egress_port")
    table source_by_egress_port {
        key = {
            standard_metadata.egress_port : exact @name("port");
        }
        actions = { rewrite_source; keep_source; }
        default_action = keep_source();
        size = CARD_PORT_TABLE_SIZE;
        counters = source_by_egress_port_counter;
    }

    apply {
        if (hdr.embnic.isValid()) {
            source_by_egress_port.apply();
            bit<32> old_src = hdr.ipv4.src_addr;
            bit<32> old_dst = hdr.ipv4.dst_addr;
            bit<16> old_sport = hdr.udp.src_port;
            bit<16> old_dport = hdr.udp.dst_port;

            hdr.ethernet.dst_addr = meta.peer_mac;
            hdr.ethernet.src_addr = src_mac;
            hdr.ipv4.src_addr = src_ip;
            hdr.ipv4.dst_addr = meta.peer_ip;
            hdr.ipv4.ttl = CARD_TTL;
            hdr.udp.src_port = EMBNIC_UDP_PORT;
            hdr.udp.dst_port = meta.peer_udp_port;

            if (hdr.udp.checksum != 0) {
                /* HC' = ~(~HC + ~m + m') over the changed 16-bit words (RFC 1624, eqn. 3) */
                bit<32> sum = (bit<32>)(~hdr.udp.checksum) +
                    (bit<32>)(~old_src[31:16]) + (bit<32>)(~old_src[15:0]) +
                    (bit<32>)(~old_dst[31:16]) + (bit<32>)(~old_dst[15:0]) +
                    (bit<32>)(~old_sport) + (bit<32>)(~old_dport) +
                    (bit<32>)src_ip[31:16] + (bit<32>)src_ip[15:0] +
                    (bit<32>)meta.peer_ip[31:16] + (bit<32>)meta.peer_ip[15:0] +
                    (bit<32>)hdr.udp.src_port + (bit<32>)hdr.udp.dst_port;
                sum = (sum & 0xffff) + (sum >> 16);
                sum = (sum & 0xffff) + (sum >> 16);
                bit<16> check = ~sum[15:0];
                hdr.udp.checksum = check == 0 ? 16w0xffff : check;
            }
            /* drop Ethernet padding or a trailer after the datagram */
            truncate((bit<32>)(ETH_HDR_LEN + hdr.ipv4.total_len));
        }
        tx_frames.count((bit<32>)standard_metadata.egress_port);
    }
}

#endif /* EMBNIC_EGRESS_P4 */
