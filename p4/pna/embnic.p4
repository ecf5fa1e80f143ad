/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic: the accelerator card's pipeline as a P4_16 program for the
 * Portable NIC Architecture, compiled by p4c's DPDK backend into a pipeline
 * for DPDK's SWX library:
 *
 *   p4c-dpdk --arch pna -o build/embnic.spec --context build/context.json \
 *            --bf-rt-schema build/bfrt.json p4/pna/embnic.p4
 *
 * The pipeline itself is the common code of p4/ (one copy for v1model and
 * PNA); this file only maps PNA onto it: the input port, and the frame
 * length and time from the host's rx pseudo-header, into the architecture
 * block of local_metadata_t, and back: send_to_port or drop_packet, and
 * the send length into the tx pseudo-header (p4/pna/arch.p4). One main
 * control runs the common ingress, then, for a frame that passes, the
 * common egress (rewrite). p4/README.md describes each part.
 */
#include "arch.p4"

#include "../types.p4"
#include "../headers.p4"
#include "../parser.p4"
#include "../ingress.p4"
#include "../egress.p4"
#include "../deparser.p4"

parser PnaParser(packet_in packet,
                 out headers_t hdr,
                 inout local_metadata_t meta,
                 in pna_main_parser_input_metadata_t istd) {
    EmbnicParser() embnic_parser;

    state start {
        packet.extract(hdr.rx_meta);
        meta.frame_len = hdr.rx_meta.frame_len;
        meta.now_us = (bit<48>)hdr.rx_meta.time_us;
        embnic_parser.apply(packet, hdr, meta);
        transition accept;
    }
}

control PnaPreControl(in headers_t hdr,
                      inout local_metadata_t meta,
                      in pna_pre_input_metadata_t istd,
                      inout pna_pre_output_metadata_t ostd) {
    apply { }
}

control PnaMainControl(inout headers_t hdr,
                       inout local_metadata_t meta,
                       in pna_main_input_metadata_t istd,
                       inout pna_main_output_metadata_t ostd) {
    EmbnicIngress() embnic_ingress;
    EmbnicEgress() embnic_egress;

    apply {
        /* the main control's istd: p4c-dpdk fills only its input_port, not the parser's */
        meta.ingress_port = (port_id_t)istd.input_port;
        embnic_ingress.apply(hdr, meta);
        if (meta.drop_reason != DROP_NONE) {
            drop_packet();
        } else {
            embnic_egress.apply(hdr, meta);
            hdr.tx_meta.setValid();
            hdr.tx_meta.send_len = (bit<16>)meta.send_len;
            hdr.tx_meta.reserved = 0;
            /* send_to_port's port is directionless in p4c's dpdk/pna.p4: a compile-time constant
             * (a run-time value, even through an action called here, is refused), so the port
             * picks one of PNA_CARD_PORTS constant calls; embnic-swx has at most that many */
            if (meta.egress_port == 0) { send_to_port((PortId_t)0); }
            else if (meta.egress_port == 1) { send_to_port((PortId_t)1); }
            else if (meta.egress_port == 2) { send_to_port((PortId_t)2); }
            else if (meta.egress_port == 3) { send_to_port((PortId_t)3); }
            else if (meta.egress_port == 4) { send_to_port((PortId_t)4); }
            else if (meta.egress_port == 5) { send_to_port((PortId_t)5); }
            else if (meta.egress_port == 6) { send_to_port((PortId_t)6); }
            else if (meta.egress_port == 7) { send_to_port((PortId_t)7); }
            else if (meta.egress_port == 8) { send_to_port((PortId_t)8); }
            else if (meta.egress_port == 9) { send_to_port((PortId_t)9); }
            else if (meta.egress_port == 10) { send_to_port((PortId_t)10); }
            else if (meta.egress_port == 11) { send_to_port((PortId_t)11); }
            else if (meta.egress_port == 12) { send_to_port((PortId_t)12); }
            else if (meta.egress_port == 13) { send_to_port((PortId_t)13); }
            else if (meta.egress_port == 14) { send_to_port((PortId_t)14); }
            else if (meta.egress_port == 15) { send_to_port((PortId_t)15); }
            else { drop_packet(); }     /* no such port: the control plane refuses one */
        }
    }
}

control PnaDeparser(packet_out packet,
                    in headers_t hdr,
                    in local_metadata_t meta,
                    in pna_main_output_metadata_t ostd) {
    EmbnicDeparser() embnic_deparser;

    apply {
        packet.emit(hdr.tx_meta);
        embnic_deparser.apply(packet, hdr);
    }
}

PNA_NIC(
    PnaParser(),
    PnaPreControl(),
    PnaMainControl(),
    PnaDeparser()
) main;
