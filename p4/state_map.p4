/* SPDX-License-Identifier: Apache-2.0
 *
 * StateMap: every message in flight, in register arrays indexed by a slot
 *
 *     home = crc32(client_id ++ msg_id) to STATE_SLOT_BITS bits,  slot = home or home ^ 1
 *
 * (the architecture's CRC hash, EMBNIC_SLOT_HASH: zlib's CRC-32 over the
 * 6 bytes client_id (big-endian u16) ++ msg_id (big-endian u32), mod
 * STATE_SLOTS, on v1model; DPDK's CRC-32C, its top bits, on PNA,
 * p4/pna/arch.p4; the control plane
 * computes the same home slot in Python). Two ways: a message takes its
 * home slot, or the neighbour when another message holds the home slot (a
 * frame of it looks in both). A slot holds the full (client_id, msg_id), so
 * a third message on a pair of live slots is seen and dropped as
 * state_full, never mixed in. The rules are the DPDK card's
 * (docs/protocol.md, docs/control-socket.md):
 *
 * - A request fragment opens the entry (the request's type, shard and
 *   header fields are kept, and the fragment size it implies) or adds to
 *   it; a fragment whose header contradicts the entry's, or that is cut at
 *   another fragment size (it would overlap another fragment or leave a
 *   gap), is frag_mismatch. Fragments seen are a bitmap (FRAG_WORDS
 *   registers of 64 bits per slot) and a count of the distinct ones, their body bytes
 *   counted once each (never more than msg_len); the entry is forwarded
 *   once every fragment has been seen.
 * - A reply passes only if it answers a live entry: same (client_id,
 *   msg_id) else unsolicited_reply; the header's shard_id the entry's shard
 *   (the sender was already checked against that shard's route by
 *   Forwarding) else wrong_shard_reply; LOOKUP_REPLY or ERROR to a lookup,
 *   UPDATE_ACK, UPDATE_NACK or ERROR to an update, SIZE_ACK or ERROR to a SIZE_REQ, else wrong_reply_type; a
 *   LOOKUP_REPLY whose value_len is not the request's (its length is not the one the request
 *   announced) is bad_reply_len. The reply's first fragment fixes its type, length, fragment
 *   count and size; a later one that differs is frag_mismatch. When every fragment of the reply
 *   has passed, the entry is freed — unless it is an ERROR and request fragments are still
 *   to come (a shard refusing a message at its fragment 0 answers before the rest came; an
 *   UPDATE_NACK asking for missing fragments frees it as any reply): the entry is then
 *   answered (replying, whole reply passed) and is freed when the request's last missing
 *   fragment passes, so those fragments open no entry nobody answers. For anything else an
 *   answered entry is as if freed: a reply is unsolicited_reply, a request fragment already
 *   seen or contradicting it opens the entry anew.
 * - Completed messages are counted by reply type (messages_completed) and
 *   by shard (completed_by_shard).
 * - No timer runs in the pipeline: an entry idle longer than the timeout
 *   is expired when a frame next looks at its slot (counted in
 *   state_expired), and the slot is then free. The clock is meta.now_us
 *   (v1model: ingress_global_timestamp; PNA: the DPDK host's, p4/pna/arch.p4).
 *
 * Every register is at most 64 bits wide (the SWX pipeline's limit, and
 * what BMv2's Thrift API reads): the request an entry was opened with is
 * kept field by field and compared field by field.
 */
#ifndef EMBNIC_STATE_MAP_P4
#define EMBNIC_STATE_MAP_P4

#include <core.p4>

#include "headers.p4"
#include "arith.p4"

control StateMap(inout headers_t hdr,
                 inout local_metadata_t meta) {

    @name(".slot_key") EMBNIC_REGISTER(bit<48>, STATE_SLOTS) slot_key;          /* client_id ++ msg_id */
    @name(".slot_state") EMBNIC_REGISTER(bit<8>, STATE_SLOTS) slot_state;       /* STATE_* */
    /* the request's header, as its first fragment gave it: [39:32] msg_type [31:16] num_tables
     * [15:0] frag_count; its shard, body length, key count, value length; and the fragment size
     * it implies, kept as the length of the message's last fragment (the DPDK card's
     * embnic_frag_last_len, no division) */
    @name(".slot_request_info") EMBNIC_REGISTER(bit<40>, STATE_SLOTS) slot_request_info;
    @name(".slot_shard") EMBNIC_REGISTER(bit<16>, STATE_SLOTS) slot_shard;
    @name(".slot_msg_len") EMBNIC_REGISTER(bit<32>, STATE_SLOTS) slot_msg_len;
    @name(".slot_num_keys") EMBNIC_REGISTER(bit<32>, STATE_SLOTS) slot_num_keys;
    @name(".slot_value_len") EMBNIC_REGISTER(bit<32>, STATE_SLOTS) slot_value_len;
    @name(".slot_request_last_len") EMBNIC_REGISTER(bit<16>, STATE_SLOTS) slot_request_last_len;
    /* the first reply fragment's: [39:32] msg_type [31:16] frag_count [15:0] last fragment's
     * length; and its msg_len */
    @name(".slot_reply_info") EMBNIC_REGISTER(bit<40>, STATE_SLOTS) slot_reply_info;
    @name(".slot_reply_msg_len") EMBNIC_REGISTER(bit<32>, STATE_SLOTS) slot_reply_msg_len;
    /* fragment bitmaps: cell (slot << FRAG_WORD_SHIFT) | (frag_index >> 6), bit frag_index & 63 */
    @name(".slot_request_frags") EMBNIC_REGISTER(bit<64>, STATE_SLOTS * FRAG_WORDS) slot_request_frags;
    @name(".slot_reply_frags") EMBNIC_REGISTER(bit<64>, STATE_SLOTS * FRAG_WORDS) slot_reply_frags;
    @name(".slot_frags_in") EMBNIC_REGISTER(bit<16>, STATE_SLOTS) slot_frags_in;     /* distinct fragments */
    @name(".slot_frags_out") EMBNIC_REGISTER(bit<16>, STATE_SLOTS) slot_frags_out;
    @name(".slot_frames_in") EMBNIC_REGISTER(bit<32>, STATE_SLOTS) slot_frames_in;
    @name(".slot_frames_out") EMBNIC_REGISTER(bit<32>, STATE_SLOTS) slot_frames_out;
    @name(".slot_bytes_in") EMBNIC_REGISTER(bit<64>, STATE_SLOTS) slot_bytes_in;    /* body bytes */
    @name(".slot_bytes_out") EMBNIC_REGISTER(bit<64>, STATE_SLOTS) slot_bytes_out;
    @name(".slot_first_us") EMBNIC_REGISTER(bit<48>, STATE_SLOTS) slot_first_us;    /* meta.now_us */
    @name(".slot_last_us") EMBNIC_REGISTER(bit<48>, STATE_SLOTS) slot_last_us;
    /* entry timeout in microseconds; 0 means STATE_TIMEOUT_US */
    @name(".state_timeout_us") EMBNIC_REGISTER(bit<48>, 1) state_timeout_us;
    @name(".messages_completed") EMBNIC_PACKET_COUNTER(NB_MSG_TYPES) messages_completed;  /* by reply type */
    @name(".completed_by_shard") EMBNIC_PACKET_COUNTER(NB_SHARDS) completed_by_shard;    /* by shard id */
    @name(".state_expired") EMBNIC_PACKET_COUNTER(1) state_expired;
    EMBNIC_SLOT_HASH_UNIT

    apply {
        EMBNIC_SLOT_HASH(meta.slot, hdr.embnic.client_id, hdr.embnic.msg_id);
        bit<48> key = ((bit<48>)hdr.embnic.client_id << 32) | (bit<48>)hdr.embnic.msg_id;
        bit<48> now = meta.now_us;
        bit<48> timeout;
        EMBNIC_READ(timeout, state_timeout_us, 0);
        if (timeout == 0) {
            timeout = STATE_TIMEOUT_US;
        }
        /* two ways: the home slot h and its neighbour h ^ 1; either expires here when idle
         * (nested ifs: p4c-dpdk 1.2.4.8 lowers `state != STATE_FREE && now - last_us > timeout`
         * without its second operand, so every live entry expired at the next frame) */
        slot_t home = meta.slot & (STATE_SLOTS - 1);
        slot_t other = home ^ 1;
        bit<8> home_state;
        bit<48> home_key;
        bit<48> home_last_us;
        bit<8> other_state;
        bit<48> other_key;
        bit<48> other_last_us;
        EMBNIC_READ(home_state, slot_state, home);
        EMBNIC_READ(home_key, slot_key, home);
        EMBNIC_READ(home_last_us, slot_last_us, home);
        EMBNIC_READ(other_state, slot_state, other);
        EMBNIC_READ(other_key, slot_key, other);
        EMBNIC_READ(other_last_us, slot_last_us, other);
        bit<48> home_idle = now - home_last_us;
        bit<48> other_idle = now - other_last_us;
        if (home_state != STATE_FREE) {
            if (home_idle > timeout) {
                EMBNIC_COUNT(state_expired, 0);
                home_state = STATE_FREE;
                slot_state.write(home, STATE_FREE);
            }
        }
        if (other_state != STATE_FREE) {
            if (other_idle > timeout) {
                EMBNIC_COUNT(state_expired, 0);
                other_state = STATE_FREE;
                slot_state.write(other, STATE_FREE);
            }
        }
        /* the way that holds this message, else a free one (home first), else home (held by
         * another message: state_full for a request, unsolicited_reply for a reply) */
        slot_t s = home;
        bit<8> state = home_state;
        bit<48> stored_key = home_key;
        if (home_state != STATE_FREE && home_key == key) {
            s = home;
        } else if (other_state != STATE_FREE && other_key == key) {
            s = other;
            state = other_state;
            stored_key = other_key;
        } else if (home_state == STATE_FREE) {
            s = home;
        } else if (other_state == STATE_FREE) {
            s = other;
            state = other_state;
            stored_key = other_key;
        }
        /* FrameValidation passed: 1 <= frag_count <= 256 and frag_index < frag_count */
        bit<32> word = (s << FRAG_WORD_SHIFT) | (bit<32>)(hdr.embnic.frag_index >> 6);
        bit<64> frag_bit = (bit<64>)1 << (bit<8>)(hdr.embnic.frag_index & 63);
        bit<64> body = (bit<64>)hdr.embnic.frag_len;
        bit<32> frames;
        bit<64> bytes;
        bit<16> nfrags;
        bit<64> frags;
        /*
         * One fragment size per message (docs/protocol.md, "Fragmentation": fragment i at
         * i*P, every one but the last P bytes). FrameValidation passed, so this fragment agrees
         * with some P; it implies the message's last fragment is msg_len - (frag_count-1)*P
         * bytes (the DPDK card's embnic_frag_last_len), which fixes P and which P fixes: kept
         * with the entry each way, a fragment that gives another value is cut at another size
         * (it would overlap another fragment or leave a gap) and is frag_mismatch.
         */
        bit<16> last_len;
        if (hdr.embnic.frag_index == hdr.embnic.frag_count - 1) {
            last_len = hdr.embnic.frag_len;
        } else {
            bit<64> full;
            EMBNIC_MUL9(full, hdr.embnic.frag_count - 1, hdr.embnic.frag_len)
            last_len = (bit<16>)((bit<64>)hdr.embnic.msg_len - full);
        }

        if (meta.is_request == 1) {
            bit<40> info = ((bit<40>)hdr.embnic.msg_type << 32) | ((bit<40>)hdr.embnic.num_tables << 16) |
                           (bit<40>)hdr.embnic.frag_count;
            /* open the entry: a free slot, or an answered entry (below) taking a new message */
            bool open_entry = false;
            bool differs = false;
            bool answered = false;
            frags = 0;
            if (state == STATE_FREE) {
                open_entry = true;
            } else if (stored_key == key) {
                bit<40> stored_info;
                bit<16> stored_shard;
                bit<32> stored_msg_len;
                bit<32> stored_num_keys;
                bit<32> stored_value_len;
                bit<16> stored_last_len;
                EMBNIC_READ(stored_info, slot_request_info, s);
                EMBNIC_READ(stored_shard, slot_shard, s);
                EMBNIC_READ(stored_msg_len, slot_msg_len, s);
                EMBNIC_READ(stored_num_keys, slot_num_keys, s);
                EMBNIC_READ(stored_value_len, slot_value_len, s);
                EMBNIC_READ(stored_last_len, slot_request_last_len, s);
                if (stored_info != info || stored_shard != hdr.embnic.shard_id ||
                    stored_msg_len != hdr.embnic.msg_len || stored_num_keys != hdr.embnic.num_keys ||
                    stored_value_len != hdr.embnic.value_len || stored_last_len != last_len) {
                    differs = true;
                }
                EMBNIC_READ(frags, slot_request_frags, word);
                /*
                 * Answered: the whole reply, an ERROR, passed before the whole request (a shard
                 * refusing the message at its fragment 0). The entry stays only for the request's
                 * fragments still to come, so they open no entry nobody answers; anything
                 * else finds it as if freed: a fragment already seen, or one contradicting
                 * it, is a new message with the same ids and opens the entry anew.
                 */
                if (state == STATE_REPLYING) {
                    bit<40> stored_reply;
                    bit<16> nout;
                    EMBNIC_READ(stored_reply, slot_reply_info, s);
                    EMBNIC_READ(nout, slot_frags_out, s);
                    if (nout == (bit<16>)(stored_reply >> 16)) {
                        answered = true;
                    }
                }
                if (answered) {
                    if (differs) {
                        open_entry = true;
                    } else if ((frags & frag_bit) != 0) {
                        open_entry = true;
                    }
                }
            }
            if (open_entry) {
                bit<32> first = s << FRAG_WORD_SHIFT;
                slot_key.write(s, key);
                slot_request_info.write(s, info);
                slot_shard.write(s, hdr.embnic.shard_id);
                slot_msg_len.write(s, hdr.embnic.msg_len);
                slot_num_keys.write(s, hdr.embnic.num_keys);
                slot_value_len.write(s, hdr.embnic.value_len);
                slot_request_last_len.write(s, last_len);
                slot_request_frags.write(first, 0);
                slot_request_frags.write(first + 1, 0);
                slot_request_frags.write(first + 2, 0);
                slot_request_frags.write(first + 3, 0);
                slot_request_frags.write(word, frag_bit);
                slot_reply_frags.write(first, 0);
                slot_reply_frags.write(first + 1, 0);
                slot_reply_frags.write(first + 2, 0);
                slot_reply_frags.write(first + 3, 0);
                slot_reply_info.write(s, 0);
                slot_reply_msg_len.write(s, 0);
                slot_frags_in.write(s, 1);
                slot_frags_out.write(s, 0);
                slot_frames_in.write(s, 1);
                slot_frames_out.write(s, 0);
                slot_bytes_in.write(s, body);
                slot_bytes_out.write(s, 0);
                slot_first_us.write(s, now);
                slot_last_us.write(s, now);
                if (hdr.embnic.frag_count == 1) {
                    slot_state.write(s, STATE_FORWARDED);
                } else {
                    slot_state.write(s, STATE_RECEIVING);
                }
            } else if (stored_key != key) {
                meta.drop_reason = DROP_STATE_FULL;     /* another message holds the slot */
            } else if (differs) {
                meta.drop_reason = DROP_FRAG_MISMATCH;
            } else {
                EMBNIC_READ(nfrags, slot_frags_in, s);
                if ((frags & frag_bit) == 0) {      /* a duplicate counts once */
                    EMBNIC_READ(bytes, slot_bytes_in, s);
                    slot_bytes_in.write(s, bytes + body);
                    slot_request_frags.write(word, frags | frag_bit);
                    nfrags = nfrags + 1;
                    slot_frags_in.write(s, nfrags);
                }
                EMBNIC_READ(frames, slot_frames_in, s);
                slot_frames_in.write(s, frames + 1);
                slot_last_us.write(s, now);
                if (nfrags == hdr.embnic.frag_count) {
                    if (state == STATE_RECEIVING) {
                        slot_state.write(s, STATE_FORWARDED);
                    } else if (answered) {
                        /* an answered entry's request is whole: free it */
                        slot_state.write(s, STATE_FREE);
                    }
                }
            }
        } else {
            bit<40> request_info;
            bit<16> request_shard;
            bit<32> request_value_len;
            EMBNIC_READ(request_info, slot_request_info, s);
            EMBNIC_READ(request_shard, slot_shard, s);
            EMBNIC_READ(request_value_len, slot_value_len, s);
            bit<8> request_type = (bit<8>)(request_info >> 32);
            /* an answering type: ERROR to anything, LOOKUP_REPLY to a lookup, UPDATE_ACK or
             * UPDATE_NACK to an update, SIZE_ACK to a SIZE_REQ (nested ifs: p4c-dpdk 1.2.4.8
             * lowers this condition as one expression into a jump to itself) */
            bool type_ok = false;
            if (hdr.embnic.msg_type == MSG_ERROR) {
                type_ok = true;
            } else if (request_type == MSG_LOOKUP_REQ) {
                if (hdr.embnic.msg_type == MSG_LOOKUP_REPLY) {
                    type_ok = true;
                }
            } else if (request_type == MSG_UPDATE_REQ) {
                if (hdr.embnic.msg_type == MSG_UPDATE_ACK || hdr.embnic.msg_type == MSG_UPDATE_NACK) {
                    type_ok = true;
                }
            } else if (request_type == MSG_SIZE_REQ) {
                if (hdr.embnic.msg_type == MSG_SIZE_ACK) {
                    type_ok = true;
                }
            }
            /* the reply so far: its first fragment's type, count and size, its fragments */
            bit<40> stored_reply;
            bit<32> stored_reply_len;
            EMBNIC_READ(stored_reply, slot_reply_info, s);
            EMBNIC_READ(stored_reply_len, slot_reply_msg_len, s);
            EMBNIC_READ(nfrags, slot_frags_out, s);
            /* answered (the whole reply passed, request fragments still to come): as if freed */
            bool answered = false;
            if (state == STATE_REPLYING) {
                if (nfrags == (bit<16>)(stored_reply >> 16)) {
                    answered = true;
                }
            }
            if (state == STATE_FREE || stored_key != key) {
                meta.drop_reason = DROP_UNSOLICITED_REPLY;
            } else if (answered) {
                meta.drop_reason = DROP_UNSOLICITED_REPLY;
            } else if (request_shard != hdr.embnic.shard_id) {
                meta.drop_reason = DROP_WRONG_SHARD_REPLY;
            } else if (!type_ok) {
                meta.drop_reason = DROP_WRONG_REPLY_TYPE;
            } else if (hdr.embnic.msg_type == MSG_LOOKUP_REPLY &&
                       hdr.embnic.value_len != request_value_len) {
                /* not the length the request announced: the rows of another request */
                meta.drop_reason = DROP_BAD_REPLY_LEN;
            } else {
                bit<40> reply = ((bit<40>)hdr.embnic.msg_type << 32) | ((bit<40>)hdr.embnic.frag_count << 16) |
                                (bit<40>)last_len;
                if (nfrags != 0 && (stored_reply != reply || stored_reply_len != hdr.embnic.msg_len)) {
                    meta.drop_reason = DROP_FRAG_MISMATCH;
                } else {
                    EMBNIC_READ(frags, slot_reply_frags, word);
                    if ((frags & frag_bit) == 0) {      /* a duplicate counts once */
                        EMBNIC_READ(bytes, slot_bytes_out, s);
                        slot_bytes_out.write(s, bytes + body);
                        slot_reply_frags.write(word, frags | frag_bit);
                        nfrags = nfrags + 1;
                        slot_frags_out.write(s, nfrags);
                    }
                    slot_reply_info.write(s, reply);
                    slot_reply_msg_len.write(s, hdr.embnic.msg_len);
                    EMBNIC_READ(frames, slot_frames_out, s);
                    slot_frames_out.write(s, frames + 1);
                    slot_last_us.write(s, now);
                    if (nfrags == hdr.embnic.frag_count) {
                        /* the whole reply has passed: free the entry, unless it is an ERROR and
                         * request fragments are still to come (answered: it stays replying for
                         * them) */
                        bit<16> nin;
                        EMBNIC_READ(nin, slot_frags_in, s);
                        if (nin == (bit<16>)request_info) {
                            slot_state.write(s, STATE_FREE);
                        } else if (hdr.embnic.msg_type != MSG_ERROR) {
                            /* an UPDATE_NACK asks for the missing fragments: they open a new
                             * entry, which the shard answers */
                            slot_state.write(s, STATE_FREE);
                        } else {
                            slot_state.write(s, STATE_REPLYING);
                        }
                        EMBNIC_COUNT(messages_completed, (bit<32>)(hdr.embnic.msg_type & 15));
                        EMBNIC_COUNT(completed_by_shard, (bit<32>)hdr.embnic.shard_id);
                    } else {
                        slot_state.write(s, STATE_REPLYING);
                    }
                }
            }
        }
    }
}

#endif /* EMBNIC_STATE_MAP_P4 */
