/* SPDX-License-Identifier: Apache-2.0
 *
 * The .embnic_buildinfo ELF section (docs/control-socket.md). The header
 * layout is taken from struct embnic_hdr itself (offsetof/sizeof), so the
 * section describes what the binary really parses; embnic_proto.h pins that
 * struct to the protocol's numbers with static_assert, and
 * tests/dataplane/test_buildinfo.py compares the section with
 * embnic.client_lib.consts.HEADER_FIELDS.
 *
 * EMBNIC_GIT_REV and EMBNIC_PROTO_VERSION come from the generated
 * build/embnic_config.h (see the Makefile).
 */
#include <stddef.h>

#include <rte_common.h>
#include <rte_version.h>

#include "embnic_buildinfo.h"
#include "embnic_dp.h"

#ifndef EMBNIC_GIT_REV
#define EMBNIC_GIT_REV "unknown"
#endif

#define BI_FIELD(f, off, sz) { \
	.name = #f, \
	.offset = offsetof(struct embnic_hdr, f), \
	.size = sizeof(((struct embnic_hdr *)0)->f), \
},

static_assert(EMBNIC_NB_HDR_FIELDS <= EMBNIC_BUILDINFO_MAX_FIELDS,
	      "header fields fit the build info");
static_assert(sizeof(EMBNIC_GIT_REV) <= EMBNIC_BUILDINFO_GIT_LEN,
	      "git revision fits");

__attribute__((section(EMBNIC_BUILDINFO_SECTION), used))
const struct embnic_buildinfo embnic_buildinfo = {
	.magic = { 'E', 'M', 'B', 'N', 'I', 'C', 'B', 'I' },
	.info_version = EMBNIC_BUILDINFO_VERSION,
	.proto_version = EMBNIC_PROTO_VERSION,
	.hdr_len = EMBNIC_HDR_LEN,
	.udp_port = EMBNIC_UDP_PORT,
	.ring_size = EMBNIC_DEFAULT_RING_SIZE,
	.route_table_size = EMBNIC_ROUTE_TABLE_SIZE,
	.client_table_size = EMBNIC_CLIENT_TABLE_SIZE,
	.state_table_size = EMBNIC_DEFAULT_STATE_SIZE,
	.n_fields = EMBNIC_NB_HDR_FIELDS,
	.fields = { EMBNIC_HDR_FIELDS(BI_FIELD) },
	.git_rev = EMBNIC_GIT_REV,
	.dpdk_version = "DPDK " RTE_STR(RTE_VER_YEAR) "." RTE_STR(RTE_VER_MONTH)
		"." RTE_STR(RTE_VER_MINOR) RTE_VER_SUFFIX,
};
