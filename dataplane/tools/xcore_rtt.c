/* SPDX-License-Identifier: Apache-2.0
 *
 * xcore-rtt: the round trip of one cache line between two CPUs, in ns.
 *
 *   build/xcore-rtt [CPU_A CPU_B [ROUND_TRIPS]]     (default 0 1 200000)
 *
 * Two pinned threads hand a counter back and forth through one cache line;
 * prints the mean round trip ("xcore_rtt_ns 123.4"): the price of every
 * line the card's RX and TX lcores pass each other, which on a VM varies
 * with where the host runs the vCPUs, so the benchmark records it next to
 * each pipeline measurement. No DPDK: plain pthreads.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() do { } while (0)
#endif

static volatile uint64_t line[8] __attribute__((aligned(64)));
static uint64_t rounds = 200000;
static int cpu_b = 1;

static int
pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* Hand the counter on: wait for first, first + 2, ...; answer each + 1. */
static void
bounce(uint64_t first)
{
	uint64_t i;

	for (i = first; i < 2 * rounds; i += 2) {
		while (line[0] != i)
			cpu_relax();
		line[0] = i + 1;
	}
}

static void *
pong(void *arg)
{
	(void)arg;
	if (pin(cpu_b) != 0)
		return (void *)1;
	bounce(1);
	return NULL;
}

int
main(int argc, char **argv)
{
	struct timespec a, b;
	pthread_t t;
	void *ret;
	int cpu_a = 0;

	if (argc >= 3) {
		cpu_a = atoi(argv[1]);
		cpu_b = atoi(argv[2]);
	}
	if (argc >= 4)
		rounds = strtoull(argv[3], NULL, 10);
	if (rounds == 0 || pin(cpu_a) != 0) {
		fprintf(stderr, "usage: %s [CPU_A CPU_B [ROUND_TRIPS]]\n",
			argv[0]);
		return 2;
	}
	if (pthread_create(&t, NULL, pong, NULL) != 0)
		return 1;
	clock_gettime(CLOCK_MONOTONIC, &a);
	bounce(0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	pthread_join(t, &ret);
	if (ret != NULL) {
		fprintf(stderr, "%s: cannot run on CPU %d\n", argv[0], cpu_b);
		return 1;
	}
	printf("xcore_rtt_ns %.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 +
				       (b.tv_nsec - a.tv_nsec)) / rounds);
	return 0;
}
