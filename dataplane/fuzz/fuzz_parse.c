/* SPDX-License-Identifier: Apache-2.0
 *
 * libFuzzer target for embnic_parse() and embnic_arp_reply() (parse.c).
 *
 *   make -C dataplane fuzz FUZZ_SECONDS=20
 *
 * Input byte 0 selects the mode, the rest is the frame:
 *   bit 0: fix the IPv4 header checksum first (otherwise random input would
 *          almost never get past bad_ip and the embnic checks go unfuzzed);
 *   bit 1: pretend the frame continues in a second segment (seg_len <
 *          pkt_len) by the amount in byte 1;
 *   bit 2: the receiving port has address 10.0.0.1 (else 0: any address).
 * The frame is copied to a buffer of exactly its size so ASan catches any
 * read past it. Invariants of an accepted frame are checked with abort().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rte_byteorder.h>
#include <rte_ip.h>

#include "embnic_parse.h"

static void
fix_ip_csum(uint8_t *f, size_t n)
{
	struct rte_ipv4_hdr *ip;

	if (n < EMBNIC_ETH_LEN + EMBNIC_IPV4_LEN)
		return;
	ip = (struct rte_ipv4_hdr *)(f + EMBNIC_ETH_LEN);
	ip->hdr_checksum = 0;
	ip->hdr_checksum = (uint16_t)~rte_raw_cksum(ip, EMBNIC_IPV4_LEN);
}

static void
check_accepted(const struct embnic_pkt_info *in, uint32_t pkt_len)
{
	const struct embnic_msg *m = &in->msg;

	if (in->frame_len > pkt_len || in->frame_len < EMBNIC_MIN_FRAME ||
	    (uint32_t)EMBNIC_MIN_FRAME + m->frag_len != in->frame_len ||
	    (uint64_t)m->frag_offset + m->frag_len > m->msg_len ||
	    m->frag_count == 0 || m->frag_index >= m->frag_count ||
	    m->frag_count > EMBNIC_MAX_FRAGS ||
	    m->msg_type < EMBNIC_LOOKUP_REQ || m->msg_type > EMBNIC_UPDATE_NACK ||
	    m->version != EMBNIC_PROTO_VERSION ||
	    embnic_expected_msg_len(m->msg_type, m->num_tables, m->num_keys,
				    m->value_len) != m->msg_len ||
	    !embnic_counts_ok(m->msg_type, m->num_tables, m->num_keys,
			      m->value_len))
		abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t mac[6] = { 2, 0, 0, 0, 0, 1 };
	struct embnic_pkt_info info;
	uint32_t port_ip, seg_len, pkt_len;
	uint8_t mode, extra, *f;
	size_t n;
	int r;

	if (size < 2)
		return 0;
	mode = data[0];
	extra = data[1];
	n = size - 2;
	f = malloc(n ? n : 1);
	if (f == NULL)
		return 0;
	memcpy(f, data + 2, n);
	if (mode & 1)
		fix_ip_csum(f, n);
	port_ip = (mode & 4) ? rte_cpu_to_be_32(0x0a000001) : 0;
	seg_len = (uint32_t)n;
	pkt_len = (uint32_t)n + ((mode & 2) ? extra : 0);

	r = embnic_parse(f, seg_len, pkt_len, (enum embnic_csum_hint)
			 ((mode >> 3) % 3), port_ip, &info);
	if (r == EMBNIC_PARSE_OK) {
		check_accepted(&info, pkt_len);
	} else if (r == EMBNIC_PARSE_ARP) {
		r = embnic_arp_reply(f, seg_len, port_ip, mac);
		if (r != 0 && r != EMBNIC_DROP_ARP_IGNORED)
			abort();
	} else if (r <= 0 || r >= EMBNIC_DROP_MAX ||
		   embnic_drop_name((unsigned int)r) == NULL) {
		abort();
	}
	free(f);
	return 0;
}
