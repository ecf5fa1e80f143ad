/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bounds of embnic-dp's command-line options: the one place on the C side.
 *
 * The cluster config validator (client_lib/config.py CARD_LIMITS) states the same bounds for
 * [card]; tests/dataplane/test_limits.py checks that the two agree and that the binary accepts
 * every limit and refuses one past it. Card port ids are 0..EMBNIC_MAX_PORTS-1 (embnic_dp.h).
 * [cluster] mtu (MTU_LIMITS there) lies within --mtu's range; the same test checks that.
 */
#ifndef EMBNIC_LIMITS_H
#define EMBNIC_LIMITS_H

#define EMBNIC_RING_SIZE_MIN		64		/* --ring-size, a power of 2 */
#define EMBNIC_RING_SIZE_MAX		(1u << 24)
#define EMBNIC_STATE_SIZE_MIN		64		/* --state-size */
#define EMBNIC_STATE_SIZE_MAX		(1u << 24)
#define EMBNIC_STATE_TIMEOUT_MS_MIN	1		/* --state-timeout-ms */
#define EMBNIC_STATE_TIMEOUT_MS_MAX	86400000u	/* one day */
#define EMBNIC_MAX_STATE_LCORES		16		/* --state-lcores 1.. */
#define EMBNIC_MTU_MIN			68		/* --mtu ..EMBNIC_MAX_MTU (embnic_dp.h) */

#endif /* EMBNIC_LIMITS_H */
