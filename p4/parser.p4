/* SPDX-License-Identifier: Apache-2.0
 *
 * Parser: Ethernet, then ARP, or IPv4 (20 bytes, no options) / UDP / the
 * embnic header when the UDP destination port is the protocol's.
 *
 * The parser only extracts; it never rejects. What does not fit is decided
 * in ingress (FrameValidation) in the DPDK card's order, so that every
 * frame is dropped for the same reason on both targets. A frame too short
 * for a header ends the parse with error.PacketTooShort, which v1model
 * hands to ingress in standard_metadata.parser_error (too_short there).
 */
#ifndef EMBNIC_PARSER_P4
#define EMBNIC_PARSER_P4

#include <core.p4>
#include <v1model.p4>

#include "headers.p4"

parser EmbnicParser(packet_in packet,
                    out headers_t hdr,
                    inout local_metadata_t meta,
                    inout standard_metadata_t standard_metadata) {

    state start {
        meta.drop_reason = DROP_NONE;
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_ARP: parse_arp;
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_arp {
        packet.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        /* only a plain IPv4 header is followed further; the rest is judged in ingress */
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4, 5, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            EMBNIC_UDP_PORT: parse_embnic;
            default: accept;
        }
    }

    state parse_embnic {
        packet.extract(hdr.embnic);
        transition accept;
    }
}

#endif /* EMBNIC_PARSER_P4 */
