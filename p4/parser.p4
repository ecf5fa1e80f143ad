/* SPDX-License-Identifier: Apache-2.0
 *
 * EmbnicParser: Ethernet, then ARP, or IPv4 (20 bytes, no options) / UDP /
 * the embnic header when the UDP destination port is the protocol's. A
 * sub-parser: each architecture's top-level parser fills meta.frame_len
 * (and the rest of the architecture block of local_metadata_t) and calls it.
 *
 * The parser only extracts; it never rejects. What does not fit is decided
 * in ingress (FrameValidation) in the DPDK card's order, so that every
 * frame is dropped for the same reason on every target. A header is
 * extracted only when the frame holds all of its bytes (meta.frame_len):
 * the parse of a frame too short for the next header ends there, that
 * header stays invalid and ingress names the drop (too_short, or
 * arp_ignored for a short ARP frame). The length is checked here, not left
 * to the architecture's PacketTooShort, because DPDK's SWX pipeline (the
 * PNA target) extracts without a bounds check.
 */
#ifndef EMBNIC_PARSER_P4
#define EMBNIC_PARSER_P4

#include <core.p4>

#include "headers.p4"

/* bytes a frame needs to hold each header (its end offset) */
const bit<32> ETH_END    = 14;
const bit<32> ARP_END    = 14 + 28;
const bit<32> IPV4_END   = 14 + 20;
const bit<32> UDP_END    = 14 + 20 + 8;
const bit<32> EMBNIC_END = 14 + 20 + 8 + 44;

parser EmbnicParser(packet_in packet,
                    out headers_t hdr,
                    inout local_metadata_t meta) {

    state start {
        meta.drop_reason = DROP_NONE;
        transition select(meta.frame_len >= ETH_END) {
            true: parse_ethernet;
            default: accept;
        }
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_ARP: check_arp;
            ETHERTYPE_IPV4: check_ipv4;
            default: accept;
        }
    }

    state check_arp {
        transition select(meta.frame_len >= ARP_END) {
            true: parse_arp;
            default: accept;
        }
    }

    state parse_arp {
        packet.extract(hdr.arp);
        transition accept;
    }

    state check_ipv4 {
        transition select(meta.frame_len >= IPV4_END) {
            true: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        /* sender_allowlist's key, in metadata beside is_request and sender_id: a table's key
         * fields must be in one struct (p4c-dpdk makes a mixed key a wildcard table, which takes
         * no direct counter), and copied here, where the controls' copy propagation cannot
         * fold them back into the header fields */
        meta.src_ip = hdr.ipv4.src_addr;
        /* only a plain IPv4 header is followed further; the rest is judged in ingress */
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4, 5, IP_PROTO_UDP): check_udp;
            default: accept;
        }
    }

    state check_udp {
        transition select(meta.frame_len >= UDP_END) {
            true: parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        meta.src_udp_port = hdr.udp.src_port;
        transition select(hdr.udp.dst_port) {
            EMBNIC_UDP_PORT: check_embnic;
            default: accept;
        }
    }

    state check_embnic {
        transition select(meta.frame_len >= EMBNIC_END) {
            true: parse_embnic;
            default: accept;
        }
    }

    state parse_embnic {
        packet.extract(hdr.embnic);
        transition accept;
    }
}

#endif /* EMBNIC_PARSER_P4 */
