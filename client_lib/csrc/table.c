/* SPDX-License-Identifier: Apache-2.0
 *
 * The client's round, its message table (round.h): messages by id (open
 * addressing), the pending set in insertion order, each message's
 * fragments, window cost and largest datagram, and the ids of tail probes
 * whose answers may come after their round.
 */
#include "round.h"

/* -- the round's message table ------------------------------------------- */

static int
hash_slot(const struct ec_round *r, uint32_t id)
{
	uint32_t h = (id * 2654435761u) & r->hmask;

	while (r->hash[h] >= 0 && r->m[r->hash[h]].msg_id != id)
		h = (h + 1) & r->hmask;
	return (int)h;
}

int
ec_find(const struct ec_round *r, uint32_t id)
{
	return r->hash[hash_slot(r, id)];
}

static int
rehash(struct ec_round *r, uint32_t size)
{
	int *h = malloc(sizeof(int) * size);

	if (h == NULL)
		return -ENOMEM;
	free(r->hash);
	r->hash = h;
	r->hmask = size - 1;
	memset(h, 0xff, sizeof(int) * size);
	for (int i = 0; i < r->n; i++)
		r->hash[hash_slot(r, r->m[i].msg_id)] = i;
	return 0;
}

/* A new message (zeroed), or -ENOMEM. Indices stay valid, pointers not. */
int
ec_add_msg(struct ec_round *r, uint32_t id)
{
	if (r->n == r->cap) {
		int cap = r->cap * 2;
		struct ec_msg *m = realloc(r->m, sizeof(*m) * cap);

		if (m == NULL)
			return -ENOMEM;
		r->m = m;
		r->cap = cap;
	}
	if ((uint32_t)(r->n + 1) * 2 > r->hmask + 1 &&
	    rehash(r, (r->hmask + 1) * 2) < 0)
		return -ENOMEM;
	memset(&r->m[r->n], 0, sizeof(r->m[r->n]));
	r->m[r->n].msg_id = id;
	r->m[r->n].root = -1;
	r->m[r->n].next = -1;
	r->hash[hash_slot(r, id)] = r->n;
	return r->n++;
}

uint32_t
ec_alloc_id(struct ec_round *r)
{
	uint32_t i = r->next_id;

	r->next_id = (i + 1) ? i + 1 : 1;
	return i;
}

int
ec_pend_add(struct ec_round *r, int i)
{
	if (r->npend == r->cap_pend) {
		int k = 0;

		for (int j = 0; j < r->npend; j++)	/* compact first */
			if (r->pend[j] >= 0)
				r->pend[k++] = r->pend[j];
		r->npend = k;
		if (k * 2 > r->cap_pend) {
			int *p = realloc(r->pend, sizeof(int) * r->cap_pend * 2);

			if (p == NULL)
				return -ENOMEM;
			r->pend = p;
			r->cap_pend *= 2;
		}
	}
	r->pend[r->npend++] = i;
	r->live_pend++;
	r->m[i].state = Q_PENDING;
	return 0;
}

void
ec_pend_del(struct ec_round *r, int i, int state)
{
	for (int j = 0; j < r->npend; j++)
		if (r->pend[j] == i) {
			r->pend[j] = -1;
			break;
		}
	r->live_pend--;
	r->m[i].state = (uint8_t)state;
}

/* The message's frames, cost and largest datagram from its lengths. */
void
ec_geometry(const struct ec_ctx *c, struct ec_msg *m)
{
	uint64_t reply = m->type == EMBNIC_LOOKUP_REQ ? m->value_len : 0;
	uint64_t big_req = m->msg_len < c->p ? m->msg_len : c->p;
	uint64_t big_rep = reply < c->p ? reply : c->p;

	m->frames = m->msg_len ? (uint32_t)((m->msg_len + c->p - 1) / c->p) : 1;
	m->reply_frames = reply ? (uint32_t)((reply + c->p - 1) / c->p) : 1;
	m->cost = (int64_t)m->frames + m->reply_frames;
	m->datagram = EMBNIC_IPV4_LEN + EMBNIC_UDP_LEN + EMBNIC_HDR_LEN +
		      (int64_t)(big_req > big_rep ? big_req : big_rep);
}

void
ec_late_add(struct ec_ctx *c, uint32_t id)
{
	c->late[c->late_head] = id;
	c->late_head = (c->late_head + 1) % EC_LATE;
}

/* An answer of a probe after its round: consumed (1), else 0. */
int
ec_late_take(struct ec_ctx *c, uint32_t id)
{
	for (int j = 0; j < EC_LATE; j++)
		if (c->late[j] == id && id != 0) {
			c->late[j] = 0;
			return 1;
		}
	return 0;
}
