/* SPDX-License-Identifier: Apache-2.0
 *
 * ArpResponder: answers an ARP request for the card's address on the port
 * it came in on (the address from card_port_by_ingress), turning the frame
 * into the reply in place, like the DPDK card (dataplane/parse.c,
 * embnic_arp_reply). Any other ARP frame is arp_ignored.
 */
#ifndef EMBNIC_ARP_P4
#define EMBNIC_ARP_P4

#include <core.p4>

#include "headers.p4"

control ArpResponder(inout headers_t hdr,
                     inout local_metadata_t meta) {

    @name(".arp_replies") EMBNIC_PACKET_COUNTER(1) arp_replies;

    apply {
        /* !isValid() last: p4c-dpdk lowers `!x` only as the last operand of `||` (validation.p4) */
        if (meta.port_ip == 0 ||
            hdr.arp.htype != ARP_HTYPE_ETHERNET || hdr.arp.ptype != ETHERTYPE_IPV4 ||
            hdr.arp.hlen != 6 || hdr.arp.plen != 4 ||
            hdr.arp.oper != ARP_OPER_REQUEST || hdr.arp.tpa != meta.port_ip || !hdr.arp.isValid()) {
            meta.drop_reason = DROP_ARP_IGNORED;
        } else {
            hdr.arp.oper = ARP_OPER_REPLY;
            hdr.arp.tha = hdr.arp.sha;
            hdr.arp.tpa = hdr.arp.spa;
            hdr.arp.sha = meta.port_mac;
            hdr.arp.spa = meta.port_ip;
            hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
            hdr.ethernet.src_addr = meta.port_mac;
            meta.egress_port = meta.ingress_port;
            EMBNIC_COUNT(arp_replies, 0);
        }
    }
}

#endif /* EMBNIC_ARP_P4 */
