/* SPDX-License-Identifier: Apache-2.0
 *
 * What the two DPDK programs' main() share, the card (main.c) and the host
 * of the P4 card for PNA (swx/main.c): the quit flag SIGINT and SIGTERM
 * set, and an unsigned decimal argument read within its bounds.
 */
#ifndef EMBNIC_MAIN_H
#define EMBNIC_MAIN_H

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Each program defines it; its loops stop when it is set. */
extern volatile bool force_quit;

static inline void
embnic_quit_handler(int signum)
{
	if (signum == SIGINT || signum == SIGTERM)
		force_quit = true;
}

/* Clear force_quit; SIGINT and SIGTERM set it from now on. */
static inline void
embnic_quit_on_signals(void)
{
	force_quit = false;
	signal(SIGINT, embnic_quit_handler);
	signal(SIGTERM, embnic_quit_handler);
}

/* An unsigned decimal in [lo, hi] into *out: 0, or -EINVAL. */
static inline int
embnic_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

#endif /* EMBNIC_MAIN_H */
