/* SPDX-License-Identifier: Apache-2.0
 *
 * Parse and validate Ethernet / IPv4 / UDP / embnic; answer ARP.
 *
 * The checks and their order follow docs/protocol.md ("Validity",
 * "Fragmentation") and the drop reasons of docs/control-socket.md. Every
 * read is bounded by the segment length; header reads go through packed
 * structs, so any alignment is fine.
 */
#include <string.h>

#include <rte_arp.h>
#include <rte_byteorder.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_udp.h>

#include "embnic_parse.h"

static const char *const drop_names[EMBNIC_DROP_MAX] = {
	[EMBNIC_DROP_NONE] = "none",
#define EMBNIC_DROP_NAME(e, n) [EMBNIC_DROP_##e] = #n,
	EMBNIC_DROP_REASONS(EMBNIC_DROP_NAME)
#undef EMBNIC_DROP_NAME
};

const char *
embnic_drop_name(unsigned int reason)
{
	return reason < EMBNIC_DROP_MAX ? drop_names[reason] : NULL;
}

static int
check_embnic(const struct embnic_hdr *h, uint32_t payload,
	     struct embnic_msg *m)
{
	if (embnic_ntoh16(h->magic) != EMBNIC_MAGIC)
		return EMBNIC_DROP_BAD_MAGIC;
	if (h->version != EMBNIC_PROTO_VERSION)
		return EMBNIC_DROP_BAD_VERSION;
	if (h->msg_type < EMBNIC_LOOKUP_REQ || h->msg_type > EMBNIC_UPDATE_NACK)
		return EMBNIC_DROP_BAD_TYPE;
	embnic_hdr_decode(h, m);
	return embnic_check_lengths(m, payload);
}

int
embnic_parse(const uint8_t *data, uint32_t seg_len, uint32_t pkt_len,
	     enum embnic_csum_hint csum, uint32_t port_ip,
	     struct embnic_pkt_info *info)
{
	const struct rte_ether_hdr *eth;
	const struct rte_ipv4_hdr *ip;
	const struct rte_udp_hdr *udp;
	uint16_t ether_type, tot, udp_len, frag;
	uint32_t ihl;

	if (seg_len > pkt_len)
		seg_len = pkt_len;
	if (seg_len < EMBNIC_ETH_LEN)
		return EMBNIC_DROP_TOO_SHORT;
	eth = (const struct rte_ether_hdr *)data;
	ether_type = embnic_ntoh16(eth->ether_type);
	if (ether_type == RTE_ETHER_TYPE_ARP)
		return EMBNIC_PARSE_ARP;
	if (ether_type != RTE_ETHER_TYPE_IPV4)
		return EMBNIC_DROP_BAD_ETHER;

	/* IPv4: version, IHL, total length vs frame, checksum, no fragments */
	if (seg_len < EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN)
		return EMBNIC_DROP_TOO_SHORT;
	ip = (const struct rte_ipv4_hdr *)(data + EMBNIC_ETH_LEN);
	if ((ip->version_ihl >> 4) != 4)
		return EMBNIC_DROP_BAD_IP;
	ihl = (uint32_t)(ip->version_ihl & 0x0f) * 4;
	if (ihl < EMBNIC_IPV4_LEN)
		return EMBNIC_DROP_BAD_IP;
	if (ihl > EMBNIC_IPV4_LEN)
		return EMBNIC_DROP_IP_OPTIONS;
	tot = embnic_ntoh16(ip->total_length);
	if (tot < EMBNIC_IPV4_LEN)
		return EMBNIC_DROP_BAD_IP;
	if (tot > pkt_len - EMBNIC_ETH_LEN)	/* cut short on the way */
		return EMBNIC_DROP_TRUNCATED;
	if (csum == EMBNIC_CSUM_BAD ||
	    (csum == EMBNIC_CSUM_UNKNOWN &&
	     embnic_ipv4_sum20(ip) != 0xffff))
		return EMBNIC_DROP_BAD_IP;
	frag = embnic_ntoh16(ip->fragment_offset);
	if (frag & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK))
		return EMBNIC_DROP_BAD_IP;
	if (port_ip != 0 && ip->dst_addr != port_ip)
		return EMBNIC_DROP_WRONG_DST;
	if (ip->next_proto_id != IPPROTO_UDP)
		return EMBNIC_DROP_NOT_UDP;

	/* UDP: its length must be the IPv4 payload; our port */
	if (tot < EMBNIC_IPV4_LEN + EMBNIC_UDP_LEN)
		return EMBNIC_DROP_BAD_UDP;
	if (seg_len < EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN + EMBNIC_UDP_LEN)
		return EMBNIC_DROP_TOO_SHORT;
	udp = (const struct rte_udp_hdr *)(data + EMBNIC_ETH_LEN +
					   EMBNIC_IPV4_LEN);
	udp_len = embnic_ntoh16(udp->dgram_len);
	if (udp_len != tot - EMBNIC_IPV4_LEN)
		return EMBNIC_DROP_BAD_UDP;
	if (embnic_ntoh16(udp->dst_port) != EMBNIC_UDP_PORT)
		return EMBNIC_DROP_BAD_PORT;
	if (udp_len < EMBNIC_UDP_LEN + EMBNIC_HDR_LEN ||
	    seg_len < EMBNIC_MIN_FRAME)
		return EMBNIC_DROP_TOO_SHORT;

	info->src_ip = ip->src_addr;
	info->src_port = udp->src_port;
	info->frame_len = (uint16_t)(EMBNIC_ETH_LEN + tot);
	return check_embnic((const struct embnic_hdr *)
			    (data + EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN +
			     EMBNIC_UDP_LEN),
			    udp_len - EMBNIC_UDP_LEN - EMBNIC_HDR_LEN,
			    &info->msg);
}

int
embnic_arp_reply(uint8_t *data, uint32_t seg_len, uint32_t port_ip,
		 const uint8_t port_mac[6])
{
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)data;
	struct rte_arp_hdr *arp;
	struct rte_arp_ipv4 *a;

	if (port_ip == 0 ||
	    seg_len < sizeof(struct rte_ether_hdr) + sizeof(struct rte_arp_hdr))
		return EMBNIC_DROP_ARP_IGNORED;
	arp = (struct rte_arp_hdr *)(data + sizeof(struct rte_ether_hdr));
	a = &arp->arp_data;
	if (arp->arp_hardware != rte_cpu_to_be_16(RTE_ARP_HRD_ETHER) ||
	    arp->arp_protocol != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) ||
	    arp->arp_hlen != RTE_ETHER_ADDR_LEN || arp->arp_plen != 4 ||
	    arp->arp_opcode != rte_cpu_to_be_16(RTE_ARP_OP_REQUEST) ||
	    a->arp_tip != port_ip)
		return EMBNIC_DROP_ARP_IGNORED;

	arp->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REPLY);
	a->arp_tha = a->arp_sha;
	a->arp_tip = a->arp_sip;
	memcpy(&a->arp_sha, port_mac, RTE_ETHER_ADDR_LEN);
	a->arp_sip = port_ip;
	eth->dst_addr = eth->src_addr;
	memcpy(&eth->src_addr, port_mac, RTE_ETHER_ADDR_LEN);
	return 0;
}
