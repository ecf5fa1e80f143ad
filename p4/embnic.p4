/* SPDX-License-Identifier: Apache-2.0
 *
 * embnic: the accelerator card's pipeline as a P4_16 program for v1model
 * (BMv2 simple_switch). The same behaviour as the DPDK card (dataplane/):
 * validation with drop reasons, sender allowlist, route and client tables,
 * rewrite with correct checksums, ARP for the card's addresses, the header
 * ring, the message state map with its reply rules, counters.
 *
 *   p4c --target bmv2 --arch v1model -o build p4/embnic.p4
 *
 * This file only includes and wires; p4/README.md describes each part.
 */
#include <core.p4>
#include <v1model.p4>

#include "types.p4"
#include "headers.p4"
#include "parser.p4"
#include "checksum.p4"
#include "ingress.p4"
#include "egress.p4"
#include "deparser.p4"

V1Switch(
    EmbnicParser(),
    EmbnicVerifyChecksum(),
    EmbnicIngress(),
    EmbnicEgress(),
    EmbnicComputeChecksum(),
    EmbnicDeparser()
) main;
