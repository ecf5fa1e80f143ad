/* SPDX-License-Identifier: Apache-2.0
 *
 * EmbnicIngress: the card's pipeline, in the DPDK card's order
 *
 *   card_port_by_ingress   the card's own IPv4/MAC on the ingress port
 *   ArpResponder           ARP frames: answer requests for that address
 *   FrameValidation        IPv4 / UDP / embnic checks
 *   Forwarding             sender allowlist, route and client tables
 *   StateMap               message state map and the reply rules
 *   HeaderRing             log of the accepted headers
 *
 * A frame that fails a step is counted once, in drop_reasons[reason], and
 * left with meta.drop_reason set: the architecture file drops it
 * (v1model's mark_to_drop, PNA's drop_packet); nothing after that step
 * touches state. A frame that passes leaves with meta.egress_port set.
 */
#ifndef EMBNIC_INGRESS_P4
#define EMBNIC_INGRESS_P4

#include <core.p4>

#include "headers.p4"
#include "arp.p4"
#include "validation.p4"
#include "forwarding.p4"
#include "state_map.p4"
#include "header_ring.p4"

control EmbnicIngress(inout headers_t hdr,
                      inout local_metadata_t meta) {

    @name(".rx_frames") EMBNIC_FRAME_COUNTER(NB_PORTS) rx_frames;   /* by ingress port */
    @name(".drop_reasons") EMBNIC_PACKET_COUNTER(NB_DROP_REASONS) drop_reasons;   /* by DROP_* */
    @name(".frames_by_type") EMBNIC_PACKET_COUNTER(NB_MSG_TYPES) frames_by_type;    /* accepted, by msg_type */
    @name(".card_port_by_ingress_counter") EMBNIC_DIRECT_COUNTER card_port_by_ingress_counter;

    ArpResponder() arp_responder;
    FrameValidation() frame_validation;
    Forwarding() forwarding;
    StateMap() state_map;
    HeaderRing() header_ring;

    @name(".set_card_port")
    action set_card_port(ipv4_addr_t ip, mac_addr_t mac) {
        EMBNIC_DIRECT_COUNT(card_port_by_ingress_counter)
        meta.port_ip = ip;
        meta.port_mac = mac;
    }

    @name(".no_card_port")
    action no_card_port() {
        EMBNIC_DIRECT_COUNT(card_port_by_ingress_counter)
        meta.port_ip = 0;
        meta.port_mac = 0;
    }

    @name(".card_port_by_ingress")
    table card_port_by_ingress {
        key = {
            meta.ingress_port : exact @name("port");
        }
        actions = { set_card_port; no_card_port; }
        default_action = no_card_port();
        size = CARD_PORT_TABLE_SIZE;
        EMBNIC_TABLE_COUNTERS(card_port_by_ingress_counter)
    }

    apply {
        EMBNIC_COUNT_FRAME(rx_frames, meta.ingress_port & (NB_PORTS - 1), meta.frame_len);
        meta.send_len = meta.frame_len;
        card_port_by_ingress.apply();
        if (!hdr.ethernet.isValid()) {
            meta.drop_reason = DROP_TOO_SHORT;
        } else if (hdr.ethernet.ether_type == ETHERTYPE_ARP) {
            arp_responder.apply(hdr, meta);
        } else {
            frame_validation.apply(hdr, meta);
            if (meta.drop_reason == DROP_NONE) {
                forwarding.apply(hdr, meta);
            }
            if (meta.drop_reason == DROP_NONE) {
                state_map.apply(hdr, meta);
            }
            if (meta.drop_reason == DROP_NONE) {
                header_ring.apply(hdr, meta);
                EMBNIC_COUNT(frames_by_type, (bit<32>)(hdr.embnic.msg_type & 15));
            }
        }
        if (meta.drop_reason != DROP_NONE) {
            EMBNIC_COUNT(drop_reasons, (bit<32>)meta.drop_reason);
        }
    }
}

#endif /* EMBNIC_INGRESS_P4 */
