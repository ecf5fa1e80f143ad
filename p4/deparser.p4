/* SPDX-License-Identifier: Apache-2.0
 *
 * EmbnicDeparser: the wire headers in wire order; the body follows untouched
 * (it was never parsed). Only valid headers are emitted. Each
 * architecture's deparser applies it (PNA's emits its tx pseudo-header
 * first).
 */
#ifndef EMBNIC_DEPARSER_P4
#define EMBNIC_DEPARSER_P4

#include <core.p4>

#include "headers.p4"

control EmbnicDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.embnic);
    }
}

#endif /* EMBNIC_DEPARSER_P4 */
