/* SPDX-License-Identifier: Apache-2.0
 *
 * Headers the card parses, and the metadata its controls share, on every
 * architecture. An architecture may add headers of its own before the wire
 * headers (EMBNIC_ARCH_HEADERS, defined by its arch.p4 before this file is
 * included: PNA's pseudo-headers to and from the DPDK host, p4/pna/arch.p4).
 */
#ifndef EMBNIC_HEADERS_P4
#define EMBNIC_HEADERS_P4

#include "types.p4"

header ethernet_t {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

/* ARP for IPv4 over Ethernet (28 bytes) */
header arp_t {
    bit<16>     htype;
    bit<16>     ptype;
    bit<8>      hlen;
    bit<8>      plen;
    bit<16>     oper;
    mac_addr_t  sha;
    ipv4_addr_t spa;
    mac_addr_t  tha;
    ipv4_addr_t tpa;
}

/* IPv4 without options (the card drops options as ip_options) */
header ipv4_t {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;          /* reserved, DF, MF */
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_t {
    l4_port_t src_port;
    l4_port_t dst_port;
    bit<16>   length;
    bit<16>   checksum;
}

/*
 * The embnic header, protocol version 2 (docs/protocol.md): 44 bytes after
 * UDP, every field big-endian. The body (a request's directory and keys,
 * rows, gradients) stays in the payload: it is never parsed, so a frame of
 * any size passes through intact, and everything the card checks and keeps
 * (msg_len for the type, the counts, the fragments) comes from here.
 *
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +-------------------------------+---------------+---------------+
 * |         magic (0x454D)        |   version=2   |   msg_type    |  0
 * +---------------+---------------+---------------+---------------+
 * |     flags     |   reserved0   |            status             |  4
 * +---------------+---------------+-------------------------------+
 * |                            msg_id                             |  8
 * +-------------------------------+-------------------------------+
 * |           client_id           |           shard_id            | 12
 * +-------------------------------+-------------------------------+
 * |          num_tables           |           table_id            | 16
 * +-------------------------------+-------------------------------+
 * |                           num_keys                            | 20
 * +---------------------------------------------------------------+
 * |                           value_len                           | 24
 * +---------------------------------------------------------------+
 * |                            msg_len                            | 28
 * +---------------------------------------------------------------+
 * |                          frag_offset                          | 32
 * +-------------------------------+-------------------------------+
 * |           frag_index          |           frag_count          | 36
 * +-------------------------------+-------------------------------+
 * |            frag_len           |           reserved            | 40
 * +-------------------------------+-------------------------------+
 */
header embnic_t {
    bit<16>     magic;
    bit<8>      version;
    bit<8>      msg_type;
    bit<8>      flags;
    bit<8>      reserved0;
    bit<16>     status;
    msg_id_t    msg_id;
    client_id_t client_id;
    shard_id_t  shard_id;
    bit<16>     num_tables;     /* tables in the request's directory (0 in a SIZE_REQ) */
    bit<16>     table_id;       /* an ERROR's table; EMBNIC_NO_TABLE otherwise */
    bit<32>     num_keys;       /* keys of all tables (SIZE_REQ: entries) */
    bit<32>     value_len;      /* bytes of row values: a lookup's reply, an update's gradients */
    bit<32>     msg_len;
    bit<32>     frag_offset;
    bit<16>     frag_index;
    bit<16>     frag_count;
    bit<16>     frag_len;
    bit<16>     reserved;
}

#ifndef EMBNIC_ARCH_HEADERS
#define EMBNIC_ARCH_HEADERS
#endif

struct headers_t {
    EMBNIC_ARCH_HEADERS
    ethernet_t ethernet;
    arp_t      arp;
    ipv4_t     ipv4;
    udp_t      udp;
    embnic_t   embnic;
}

/*
 * What the controls tell one another about a frame. The first block is the
 * architecture's, in its neutral form: the arch file fills it from (and
 * hands it back to) v1model's standard_metadata or PNA's metadata.
 */
struct local_metadata_t {
    port_id_t     ingress_port; /* card port the frame came in on */
    bit<32>       frame_len;    /* bytes of the frame as received */
    bit<48>       now_us;       /* arrival time, microseconds (the state map's clock) */
    port_id_t     egress_port;  /* card port the frame leaves on (valid while drop_reason is DROP_NONE) */
    bit<32>       send_len;     /* bytes of the frame to send: shorter than frame_len drops a trailer */

    drop_reason_t drop_reason;  /* DROP_NONE while the frame may pass */
    bit<8>        is_request;   /* 1: LOOKUP_REQ, UPDATE_REQ or SIZE_REQ (8 bits: a whole byte of
                                 * sender_allowlist's key) */
    bit<16>       sender_id;    /* client_id of a request, shard_id of a reply */
    ipv4_addr_t   src_ip;       /* the sender's IPv4 address and UDP port (sender_allowlist's key,
                                 * set by the parser) */
    l4_port_t     src_udp_port;
    /* the card's own address on the ingress port (0.0.0.0: none configured) */
    ipv4_addr_t   port_ip;
    mac_addr_t    port_mac;
    /* the route of the header's shard (route_by_shard) */
    bit<1>        route_hit;
    port_id_t     route_port;
    mac_addr_t    route_mac;
    ipv4_addr_t   route_ip;
    l4_port_t     route_udp_port;
    /* the client of the header's client_id (client_by_id) */
    bit<1>        client_hit;
    port_id_t     client_port;
    mac_addr_t    client_mac;
    ipv4_addr_t   client_ip;
    l4_port_t     client_udp_port;
    bit<1>        sender_allowed;   /* sender_allowlist hit */
    /* where the frame goes, for the rewrite in egress */
    mac_addr_t    peer_mac;
    ipv4_addr_t   peer_ip;
    l4_port_t     peer_udp_port;
    slot_t        slot;         /* state map slot of (client_id, msg_id) */
    bit<32>       csum_a;       /* one's-complement sums being folded (arith.p4, EMBNIC_FOLD16) */
    bit<32>       csum_b;
    bit<32>       csum_c;
}

#endif /* EMBNIC_HEADERS_P4 */
