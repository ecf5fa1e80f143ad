/* SPDX-License-Identifier: Apache-2.0
 *
 * Checksum controls. Verify: the IPv4 header checksum of a plain IPv4
 * header (a wrong one sets standard_metadata.checksum_error, which
 * FrameValidation drops as bad_ip). Compute: the IPv4 header checksum of
 * every frame the card rewrote. The UDP checksum is updated incrementally
 * in egress (EmbnicEgress), like the DPDK card: a checksum of 0 ("none")
 * stays 0, and the body is never read.
 */
#ifndef EMBNIC_CHECKSUM_P4
#define EMBNIC_CHECKSUM_P4

#include <core.p4>
#include <v1model.p4>

#include "headers.p4"

control EmbnicVerifyChecksum(inout headers_t hdr, inout local_metadata_t meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv,
              hdr.ipv4.total_len, hdr.ipv4.identification, hdr.ipv4.flags,
              hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol,
              hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control EmbnicComputeChecksum(inout headers_t hdr, inout local_metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid() && hdr.embnic.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv,
              hdr.ipv4.total_len, hdr.ipv4.identification, hdr.ipv4.flags,
              hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol,
              hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

#endif /* EMBNIC_CHECKSUM_P4 */
