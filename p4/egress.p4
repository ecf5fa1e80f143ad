/* SPDX-License-Identifier: Apache-2.0
 *
 * EmbnicEgress: rewrite of a forwarded embnic frame for its peer, like the
 * DPDK card (dataplane/tx.c, rewrite): Ethernet source = the card port's
 * MAC (source_by_egress_port), destination = the peer's; IPv4 source = the
 * card port's address, destination = the peer's, TTL CARD_TTL (the header
 * checksum is recomputed here, by Ipv4HeaderSum); UDP source port 7878,
 * destination the peer's. The UDP checksum is updated incrementally
 * (RFC 1624) over the changed words only, so the body is never summed: a
 * checksum of 0 ("none") stays 0 and one that computes to 0 is sent as
 * 0xFFFF. Ethernet padding after the IPv4 datagram is not sent on:
 * meta.send_len says where the frame ends, and the architecture file cuts
 * it there (v1model's truncate, the PNA host's output port). ARP replies
 * leave as ArpResponder made them. On v1model this is the egress control;
 * on PNA it runs after EmbnicIngress in the one main control.
 */
#ifndef EMBNIC_EGRESS_P4
#define EMBNIC_EGRESS_P4

#include <core.p4>

#include "headers.p4"
#include "arith.p4"

control EmbnicEgress(inout headers_t hdr,
                     inout local_metadata_t meta) {

    @name(".tx_frames") EMBNIC_FRAME_COUNTER(NB_PORTS) tx_frames;   /* by egress port */
    @name(".source_by_egress_port_counter") EMBNIC_DIRECT_COUNTER source_by_egress_port_counter;
    Ipv4HeaderSum() ipv4_sum;

    mac_addr_t src_mac = 0;
    ipv4_addr_t src_ip = 0;

    @name(".rewrite_source")
    action rewrite_source(mac_addr_t mac, ipv4_addr_t ip) {
        EMBNIC_DIRECT_COUNT(source_by_egress_port_counter)
        src_mac = mac;
        src_ip = ip;
    }

    @name(".keep_source")
    action keep_source() {
        EMBNIC_DIRECT_COUNT(source_by_egress_port_counter)
        src_mac = hdr.ethernet.dst_addr;
        src_ip = hdr.ipv4.dst_addr;
    }

    @name(".source_by_egress_port")
    table source_by_egress_port {
        key = {
            meta.egress_port : exact @name("port");
        }
        actions = { rewrite_source; keep_source; }
        default_action = keep_source();
        size = CARD_PORT_TABLE_SIZE;
        EMBNIC_TABLE_COUNTERS(source_by_egress_port_counter)
    }

    apply {
        if (hdr.embnic.isValid()) {
            source_by_egress_port.apply();
            /* the UDP checksum first, from the header as it came and the values it gets: p4c-dpdk
             * 1.2.4.8 propagates a copy of a header field (`old = hdr.f`) into later expressions, so
             * an old value read after the field is rewritten is the new one */
            if (hdr.udp.checksum != 0) {
                /* HC' = ~(~HC + ~m + m') over the changed 16-bit words (RFC 1624, eqn. 3) */
                meta.csum_a = (bit<32>)(~hdr.udp.checksum) +
                    (bit<32>)(~(bit<16>)(hdr.ipv4.src_addr >> 16)) + (bit<32>)(~(bit<16>)hdr.ipv4.src_addr) +
                    (bit<32>)(~(bit<16>)(hdr.ipv4.dst_addr >> 16)) + (bit<32>)(~(bit<16>)hdr.ipv4.dst_addr) +
                    (bit<32>)(~hdr.udp.src_port) + (bit<32>)(~hdr.udp.dst_port) +
                    (src_ip >> 16) + (src_ip & 0xffff) +
                    (meta.peer_ip >> 16) + (meta.peer_ip & 0xffff) +
                    (bit<32>)EMBNIC_UDP_PORT + (bit<32>)meta.peer_udp_port;
                EMBNIC_FOLD16(meta)
                bit<16> check = ~(bit<16>)meta.csum_c;
                if (check == 0) {
                    check = 0xffff;
                }
                hdr.udp.checksum = check;
            }

            hdr.ethernet.dst_addr = meta.peer_mac;
            hdr.ethernet.src_addr = src_mac;
            hdr.ipv4.src_addr = src_ip;
            hdr.ipv4.dst_addr = meta.peer_ip;
            hdr.ipv4.ttl = CARD_TTL;
            hdr.udp.src_port = EMBNIC_UDP_PORT;
            hdr.udp.dst_port = meta.peer_udp_port;

            /* the IPv4 header checksum of the rewritten header */
            bit<16> ip_sum;
            hdr.ipv4.hdr_checksum = 0;
            ipv4_sum.apply(hdr.ipv4, meta, ip_sum);
            hdr.ipv4.hdr_checksum = ~ip_sum;
            /* Ethernet padding or a trailer after the datagram is not sent */
            meta.send_len = (bit<32>)ETH_HDR_LEN + (bit<32>)hdr.ipv4.total_len;
        }
        EMBNIC_COUNT_FRAME(tx_frames, meta.egress_port & (NB_PORTS - 1), meta.send_len);
    }
}

#endif /* EMBNIC_EGRESS_P4 */
