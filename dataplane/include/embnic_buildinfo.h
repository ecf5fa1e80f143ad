/* SPDX-License-Identifier: Apache-2.0
 *
 * Build info of embnic-dp, kept in its own ELF section ".embnic_buildinfo"
 * so the control plane can read it with pyelftools before loading a binary
 * (docs/control-socket.md, "Build info ELF section").
 *
 * One packed little-endian struct; do not reorder: readers parse it by
 * offset. Extend only at the end and bump EMBNIC_BUILDINFO_VERSION.
 */
#ifndef EMBNIC_BUILDINFO_H
#define EMBNIC_BUILDINFO_H

#include <assert.h>
#include <stdint.h>

#define EMBNIC_BUILDINFO_SECTION	".embnic_buildinfo"
#define EMBNIC_BUILDINFO_MAGIC		"EMBNICBI"	/* 8 chars, no NUL */
#define EMBNIC_BUILDINFO_VERSION	1
#define EMBNIC_BUILDINFO_MAX_FIELDS	24
#define EMBNIC_BUILDINFO_NAME_LEN	16
#define EMBNIC_BUILDINFO_GIT_LEN	41
#define EMBNIC_BUILDINFO_DPDK_LEN	32

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the build info section is specified little-endian"
#endif

struct embnic_buildinfo_field {
	char name[EMBNIC_BUILDINFO_NAME_LEN];	/* NUL padded */
	uint16_t offset;			/* bytes into the header */
	uint16_t size;				/* bytes */
} __attribute__((packed));

struct embnic_buildinfo {
	char magic[8];			/* "EMBNICBI" */
	uint32_t info_version;		/* EMBNIC_BUILDINFO_VERSION */
	uint32_t proto_version;		/* EMBNIC_PROTO_VERSION */
	uint32_t hdr_len;		/* EMBNIC_HDR_LEN */
	uint32_t udp_port;		/* EMBNIC_UDP_PORT */
	uint32_t ring_size;		/* default header ring entries */
	uint32_t route_table_size;	/* max routes */
	uint32_t client_table_size;	/* max clients */
	uint32_t state_table_size;	/* default state map entries */
	uint32_t n_fields;		/* used entries of fields[] */
	struct embnic_buildinfo_field fields[EMBNIC_BUILDINFO_MAX_FIELDS];
	char git_rev[EMBNIC_BUILDINFO_GIT_LEN];
	char dpdk_version[EMBNIC_BUILDINFO_DPDK_LEN];
} __attribute__((packed));

static_assert(sizeof(struct embnic_buildinfo_field) == 20, "field entry");
static_assert(sizeof(struct embnic_buildinfo) ==
	      8 + 9 * 4 + EMBNIC_BUILDINFO_MAX_FIELDS * 20 +
	      EMBNIC_BUILDINFO_GIT_LEN + EMBNIC_BUILDINFO_DPDK_LEN,
	      "build info layout");

/* The instance in the section (buildinfo.c). */
extern const struct embnic_buildinfo embnic_buildinfo;

#endif /* EMBNIC_BUILDINFO_H */
