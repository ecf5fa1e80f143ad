/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic: the accelerator card's pipeline as a P4_16 program for v1model
 * (BMv2 simple_switch). The same behaviour as the DPDK card (dataplane/):
 * validation with drop reasons, sender allowlist, route and client tables,
 * rewrite with correct checksums, ARP for the card's addresses, the header
 * ring, the message state map with its reply rules, counters.
 *
 *   p4c --target bmv2 --arch v1model -o build p4/v1model/embnic.p4
 *
 * The pipeline itself is the common code of p4/ (one copy for v1model and
 * PNA); this file only maps v1model onto it: standard_metadata into the
 * architecture block of local_metadata_t (ingress port, frame length,
 * time) and back (egress port, drop, truncation). p4/README.md describes
 * each part.
 */
#include "arch.p4"

#include "../types.p4"
#include "../headers.p4"
#include "../parser.p4"
#include "../ingress.p4"
#include "../egress.p4"
#include "../deparser.p4"

parser V1Parser(packet_in packet,
                out headers_t hdr,
                inout local_metadata_t meta,
                inout standard_metadata_t standard_metadata) {
    EmbnicParser() embnic_parser;

    state start {
        meta.frame_len = standard_metadata.packet_length;
        meta.ingress_port = (port_id_t)standard_metadata.ingress_port;
        embnic_parser.apply(packet, hdr, meta);
        transition accept;
    }
}

/* checksums are verified and computed by the common controls (arith.p4, Ipv4HeaderSum) */
control V1VerifyChecksum(inout headers_t hdr, inout local_metadata_t meta) {
    apply { }
}

control V1Ingress(inout headers_t hdr,
                  inout local_metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    EmbnicIngress() embnic_ingress;

    apply {
        meta.now_us = standard_metadata.ingress_global_timestamp;
        embnic_ingress.apply(hdr, meta);
        if (meta.drop_reason != DROP_NONE) {
            mark_to_drop(standard_metadata);
        } else {
            standard_metadata.egress_spec = (bit<9>)meta.egress_port;
        }
    }
}

control V1Egress(inout headers_t hdr,
                 inout local_metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    EmbnicEgress() embnic_egress;

    apply {
        meta.egress_port = (port_id_t)standard_metadata.egress_port;
        embnic_egress.apply(hdr, meta);
        if (meta.send_len < meta.frame_len) {
            truncate(meta.send_len);
        }
    }
}

control V1ComputeChecksum(inout headers_t hdr, inout local_metadata_t meta) {
    apply { }
}

control V1Deparser(packet_out packet, in headers_t hdr) {
    EmbnicDeparser() embnic_deparser;

    apply {
        embnic_deparser.apply(packet, hdr);
    }
}

V1Switch(
    V1Parser(),
    V1VerifyChecksum(),
    V1Ingress(),
    V1Egress(),
    V1ComputeChecksum(),
    V1Deparser()
) main;
