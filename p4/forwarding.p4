/* SPDX-License-Identifier: Apache-2.0
 *
 * Forwarding: who may send this frame and where it goes.
 *
 *   sender_allowlist  (request?, client or shard id, source IPv4, source
 *                      UDP port) of every registered client and server:
 *                      a request must come from its client's address, a
 *                      reply from its shard's server (and from the card
 *                      port and MAC of its client_by_id / route_by_shard
 *                      entry)
 *   route_by_shard    shard id -> card port, MAC, IPv4, UDP port (requests)
 *   client_by_id      client id -> the same (replies)
 *
 * Drops, in the DPDK card's order (dataplane/tx.c, authorise): a request
 * from an unlisted sender is unknown_client, one from its client's address
 * but not from the card port (or MAC) client_by_id names wrong_port, one
 * for a shard without a route unknown_shard; a reply from an unlisted
 * sender is unknown_server, one from its shard's address but not from the
 * card port (or MAC) route_by_shard names wrong_port, one for an
 * unregistered client unknown_client. A MAC is compared where the entry
 * states one: a unicast address other than 0 (the config refuses others).
 */
#ifndef EMBNIC_FORWARDING_P4
#define EMBNIC_FORWARDING_P4

#include <core.p4>

#include "headers.p4"

control Forwarding(inout headers_t hdr,
                   inout local_metadata_t meta) {

    @name(".sender_allowlist_counter") EMBNIC_DIRECT_COUNTER sender_allowlist_counter;
    @name(".route_by_shard_counter") EMBNIC_DIRECT_COUNTER route_by_shard_counter;
    @name(".client_by_id_counter") EMBNIC_DIRECT_COUNTER client_by_id_counter;

    @name(".allow_sender")
    action allow_sender() {
        EMBNIC_DIRECT_COUNT(sender_allowlist_counter)
        meta.sender_allowed = 1;
    }

    @name(".deny_sender")
    action deny_sender() {
        EMBNIC_DIRECT_COUNT(sender_allowlist_counter)
        meta.sender_allowed = 0;
    }

    @name(".sender_allowlist")
    table sender_allowlist {
        key = {
            meta.is_request     : exact @name("is_request");
            meta.sender_id      : exact @name("id");
            meta.src_ip         : exact @name("ip");
            meta.src_udp_port   : exact @name("udp_port");
        }
        actions = { allow_sender; deny_sender; }
        default_action = deny_sender();
        size = ALLOWLIST_SIZE;
        EMBNIC_TABLE_COUNTERS(sender_allowlist_counter)
    }

    @name(".forward_to_server")
    action forward_to_server(port_id_t port, mac_addr_t mac, ipv4_addr_t ip, l4_port_t udp_port) {
        EMBNIC_DIRECT_COUNT(route_by_shard_counter)
        meta.route_hit = 1;
        meta.route_port = port;
        meta.route_mac = mac;
        meta.route_ip = ip;
        meta.route_udp_port = udp_port;
    }

    @name(".no_route")
    action no_route() {
        EMBNIC_DIRECT_COUNT(route_by_shard_counter)
        meta.route_hit = 0;
    }

    @name(".route_by_shard")
    table route_by_shard {
        key = {
            hdr.embnic.shard_id : exact @name("shard");
        }
        actions = { forward_to_server; no_route; }
        default_action = no_route();
        size = ROUTE_TABLE_SIZE;
        EMBNIC_TABLE_COUNTERS(route_by_shard_counter)
    }

    @name(".forward_to_client")
    action forward_to_client(port_id_t port, mac_addr_t mac, ipv4_addr_t ip, l4_port_t udp_port) {
        EMBNIC_DIRECT_COUNT(client_by_id_counter)
        meta.client_hit = 1;
        meta.client_port = port;
        meta.client_mac = mac;
        meta.client_ip = ip;
        meta.client_udp_port = udp_port;
    }

    @name(".no_client")
    action no_client() {
        EMBNIC_DIRECT_COUNT(client_by_id_counter)
        meta.client_hit = 0;
    }

    @name(".client_by_id")
    table client_by_id {
        key = {
            hdr.embnic.client_id : exact @name("client");
        }
        actions = { forward_to_client; no_client; }
        default_action = no_client();
        size = CLIENT_TABLE_SIZE;
        EMBNIC_TABLE_COUNTERS(client_by_id_counter)
    }

    apply {
        if (hdr.embnic.msg_type == MSG_LOOKUP_REQ || hdr.embnic.msg_type == MSG_UPDATE_REQ ||
            hdr.embnic.msg_type == MSG_SIZE_REQ) {
            meta.is_request = 1;
            meta.sender_id = hdr.embnic.client_id;
        } else {
            meta.is_request = 0;
            meta.sender_id = hdr.embnic.shard_id;
        }
        sender_allowlist.apply();
        route_by_shard.apply();
        client_by_id.apply();
        /* where the sender is: its entry's card port and MAC (the client's for a request,
         * the shard's for a reply; valid once the sender is allowed, which needs the entry) */
        port_id_t sender_port = meta.route_port;
        mac_addr_t sender_mac = meta.route_mac;
        if (meta.is_request == 1) {
            sender_port = meta.client_port;
            sender_mac = meta.client_mac;
        }
        bool wrong_port = false;
        if (meta.ingress_port != sender_port) {
            wrong_port = true;
        } else if ((sender_mac & 0x010000000000) == 0) {
            if (sender_mac != 0) {
                if (sender_mac != hdr.ethernet.src_addr) {
                    wrong_port = true;
                }
            }
        }
        if (meta.is_request == 1) {
            if (meta.sender_allowed == 0) {
                meta.drop_reason = DROP_UNKNOWN_CLIENT;
            } else if (meta.client_hit == 0) {
                meta.drop_reason = DROP_UNKNOWN_CLIENT;     /* allowed, but no client entry */
            } else if (wrong_port) {
                meta.drop_reason = DROP_WRONG_PORT;
            } else if (meta.route_hit == 0) {
                meta.drop_reason = DROP_UNKNOWN_SHARD;
            } else {
                meta.egress_port = meta.route_port;
                meta.peer_mac = meta.route_mac;
                meta.peer_ip = meta.route_ip;
                meta.peer_udp_port = meta.route_udp_port;
            }
        } else {
            if (meta.sender_allowed == 0) {
                meta.drop_reason = DROP_UNKNOWN_SERVER;
            } else if (meta.route_hit == 0) {
                meta.drop_reason = DROP_UNKNOWN_SERVER;     /* allowed, but no route entry */
            } else if (wrong_port) {
                meta.drop_reason = DROP_WRONG_PORT;
            } else if (meta.client_hit == 0) {
                meta.drop_reason = DROP_UNKNOWN_CLIENT;
            } else {
                meta.egress_port = meta.client_port;
                meta.peer_mac = meta.client_mac;
                meta.peer_ip = meta.client_ip;
                meta.peer_udp_port = meta.client_udp_port;
            }
        }
    }
}

#endif /* EMBNIC_FORWARDING_P4 */
