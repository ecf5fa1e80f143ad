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
 * A frame that fails a step is dropped (mark_to_drop) and counted once, in
 * drop_reasons[reason]; nothing after that step touches state.
 */
#ifndef EMBNIC_INGRESS_P4
#define EMBNIC_INGRESS_P4

#include <core.p4>
#include <v1model.p4>

#include "headers.p4"
#include "arp.p4"
#include "validation.p4"
#include "forwarding.p4"
#include "state_map.p4"
#include "header_ring.p4"

control EmbnicIngress(inout headers_t hdr,
                      inout local_metadata_t meta,
                      inout standard_metadata_t standard_metadata) {

    @name(".rx_frames") counter(NB_PORTS, CounterType.packets_and_bytes) rx_frames;   /* by ingress port */
    @name(".drop_reasons") counter(NB_DROP_REASONS, CounterType.packets) drop_reasons;   /* by DROP_* */
    @name(".frames_by_type") counter(NB_MSG_TYPES, CounterType.packets) frames_by_type;    /* accepted, by msg_type */
    @name(".card_port_by_ingress_counter") direct_counter(CounterType.packets) card_port_by_ingress_counter;

    ArpResponder() arp_responder;
    FrameValidation() frame_validation;
    Forwarding() forwarding;
    StateMap() state_map;
    HeaderRing() header_ring;

    @name(".set_card_port")
    action set_card_port(ipv4_addr_t ip, mac_addr_t mac) {
        meta.port_ip = ip;
        meta.port_mac = mac;
    }

    @name(".no_card_port")
    action no_card_port() {
        meta.port_ip = 0;
        meta.port_mac = 0;
    }

    @name(".card_port_by_ingress")
    table card_port_by_ingress {
        key = {
            standard_metadata.ingress_port : exact @name("port");
        }
        actions = { set_card_port; no_card_port; }
        default_action = no_card_port();
        size = CARD_PORT_TABLE_SIZE;
        counters = card_port_by_ingress_counter;
    }

    apply {
        rx_frames.count((bit<32>)standard_metadata.ingress_port);
        card_port_by_ingress.apply();
        if (!hdr.ethernet.isValid()) {
            meta.drop_reason = DROP_TOO_SHORT;
        } else if (hdr.ethernet.ether_type == ETHERTYPE_ARP) {
            arp_responder.apply(hdr, meta, standard_metadata);
        } else {
            frame_validation.apply(hdr, meta, standard_metadata);
            if (meta.drop_reason == DROP_NONE) {
                forwarding.apply(hdr, meta, standard_metadata);
            }
            if (meta.drop_reason == DROP_NONE) {
                state_map.apply(hdr, meta, standard_metadata);
            }
            if (meta.drop_reason == DROP_NONE) {
                header_ring.apply(hdr, meta, standard_metadata);
                frames_by_type.count((bit<32>)(hdr.embnic.msg_type & 15));
            }
        }
        if (meta.drop_reason != DROP_NONE) {
            drop_reasons.count((bit<32>)meta.drop_reason);
            mark_to_drop(standard_metadata);
        }
    }
}

#endif /* EMBNIC_INGRESS_P4 */
