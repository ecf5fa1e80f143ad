/* SPDX-License-Identifier: Apache-2.0
 *
 * StateMap: every message in flight, in register arrays indexed by a slot
 *
 *     slot = crc32(client_id ++ msg_id) mod STATE_SLOTS
 *
 * (v1model hash, HashAlgorithm.crc32, base 0: the CRC-32 of zlib over the
 * 6 bytes client_id (big-endian u16) ++ msg_id (big-endian u32); the
 * control plane computes the same slot in Python). A slot holds the full
 * (client_id, msg_id), so another message hashing to a live slot is seen
 * and dropped as state_full, never mixed in. The rules are the DPDK card's
 * (docs/protocol.md, docs/control-socket.md):
 *
 * - A request fragment opens the entry (the request's type, shard and
 *   header fields are kept, and the fragment size it implies) or adds to
 *   it; a fragment whose header contradicts the entry's, or that is cut at
 *   another fragment size (it would overlap another fragment or leave a
 *   gap), is frag_mismatch. Fragments seen are a bitmap, their body bytes
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
 *   has passed, the entry is freed.
 * - Completed messages are counted by reply type (messages_completed) and
 *   by shard (completed_by_shard).
 * - BMv2 has no timer: an entry idle longer than the timeout is expired
 *   when a frame next touches its slot (counted in state_expired), and the
 *   slot is then free.
 */
#ifndef EMBNIC_STATE_MAP_P4
#define EMBNIC_STATE_MAP_P4

#include <core.p4>
#include <v1model.p4>

#include "headers.p4"

/*
 * slot_request, the request header an entry was opened with (168 bits):
 *   [167:160] msg_type  [159:144] shard_id  [143:128] num_tables  [127:112] frag_count
 *   [111:80] msg_len  [79:48] num_keys  [47:16] value_len
 *   [15:0] the fragment size as the length of the last fragment (below)
 * slot_reply, the first reply fragment's (72 bits):
 *   [71:64] msg_type  [63:48] frag_count  [47:16] msg_len  [15:0] last fragment's length
 */
control StateMap(inout headers_t hdr,
                 inout local_metadata_t meta,
                 in standard_metadata_t standard_metadata) {

    @name(".slot_key") register<bit<48>>(STATE_SLOTS) slot_key;         /* client_id ++ msg_id */
    @name(".slot_state") register<bit<8>>(STATE_SLOTS) slot_state;        /* STATE_* */
    @name(".slot_request") register<bit<168>>(STATE_SLOTS) slot_request;
    @name(".slot_request_frags") register<bit<256>>(STATE_SLOTS) slot_request_frags;
    /* what the control plane reads of the request (BMv2's Thrift API reads at most 64 bits
     * a cell, so not slot_request): [39:32] msg_type [31:16] num_tables [15:0] frag_count;
     * and its shard, body length, key count and value length */
    @name(".slot_request_info") register<bit<40>>(STATE_SLOTS) slot_request_info;
    @name(".slot_shard") register<bit<16>>(STATE_SLOTS) slot_shard;
    @name(".slot_msg_len") register<bit<32>>(STATE_SLOTS) slot_msg_len;
    @name(".slot_num_keys") register<bit<32>>(STATE_SLOTS) slot_num_keys;
    @name(".slot_value_len") register<bit<32>>(STATE_SLOTS) slot_value_len;
    @name(".slot_reply") register<bit<72>>(STATE_SLOTS) slot_reply;
    @name(".slot_reply_frags") register<bit<256>>(STATE_SLOTS) slot_reply_frags;
    @name(".slot_frames_in") register<bit<32>>(STATE_SLOTS) slot_frames_in;
    @name(".slot_frames_out") register<bit<32>>(STATE_SLOTS) slot_frames_out;
    @name(".slot_bytes_in") register<bit<64>>(STATE_SLOTS) slot_bytes_in;    /* body bytes */
    @name(".slot_bytes_out") register<bit<64>>(STATE_SLOTS) slot_bytes_out;
    @name(".slot_first_us") register<bit<48>>(STATE_SLOTS) slot_first_us;    /* ingress_global_timestamp */
    @name(".slot_last_us") register<bit<48>>(STATE_SLOTS) slot_last_us;
    /* entry timeout in microseconds; 0 means STATE_TIMEOUT_US */
    @name(".state_timeout_us") register<bit<48>>(1) state_timeout_us;
    @name(".messages_completed") counter(NB_MSG_TYPES, CounterType.packets) messages_completed;  /* by reply type */
    @name(".completed_by_shard") counter(NB_SHARDS, CounterType.packets) completed_by_shard;    /* by shard id */
    @name(".state_expired") counter(1, CounterType.packets) state_expired;

    apply {
        hash(meta.slot, HashAlgorithm.crc32, (bit<32>)0,
             { hdr.embnic.client_id, hdr.embnic.msg_id }, STATE_SLOTS);
        slot_t s = meta.slot;
        bit<48> key = hdr.embnic.client_id ++ hdr.embnic.msg_id;
        bit<48> now = standard_metadata.ingress_global_timestamp;
        bit<48> timeout;
        state_timeout_us.read(timeout, 0);
        if (timeout == 0) {
            timeout = STATE_TIMEOUT_US;
        }
        bit<8> state;
        bit<48> stored_key;
        bit<48> last_us;
        slot_state.read(state, s);
        slot_key.read(stored_key, s);
        slot_last_us.read(last_us, s);
        if (state != STATE_FREE && now - last_us > timeout) {
            state_expired.count(0);
            state = STATE_FREE;
            slot_state.write(s, STATE_FREE);
        }
        /* FrameValidation passed: 1 <= frag_count <= 256 and frag_index < frag_count, so both
         * shift amounts fit the 8 bits BMv2 allows */
        bit<256> frag_bit = (bit<256>)1 << (bit<8>)hdr.embnic.frag_index;
        /* the low frag_count bits set */
        bit<256> all_frags = ~(bit<256>)0 >> (bit<8>)(16w256 - hdr.embnic.frag_count);
        bit<64> body = (bit<64>)hdr.embnic.frag_len;
        bit<32> frames;
        bit<64> bytes;
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
            last_len = (bit<16>)(hdr.embnic.msg_len -
                                 (bit<32>)(hdr.embnic.frag_count - 1) * (bit<32>)hdr.embnic.frag_len);
        }

        if (meta.is_request == 1) {
            bit<168> request = hdr.embnic.msg_type ++ hdr.embnic.shard_id ++
                               hdr.embnic.num_tables ++ hdr.embnic.frag_count ++
                               hdr.embnic.msg_len ++ hdr.embnic.num_keys ++ hdr.embnic.value_len ++
                               last_len;
            if (state == STATE_FREE) {
                slot_key.write(s, key);
                slot_request.write(s, request);
                slot_request_info.write(s, hdr.embnic.msg_type ++ hdr.embnic.num_tables ++
                                           hdr.embnic.frag_count);
                slot_shard.write(s, hdr.embnic.shard_id);
                slot_msg_len.write(s, hdr.embnic.msg_len);
                slot_num_keys.write(s, hdr.embnic.num_keys);
                slot_value_len.write(s, hdr.embnic.value_len);
                slot_request_frags.write(s, frag_bit);
                slot_reply.write(s, 0);
                slot_reply_frags.write(s, 0);
                slot_frames_in.write(s, 1);
                slot_frames_out.write(s, 0);
                slot_bytes_in.write(s, body);
                slot_bytes_out.write(s, 0);
                slot_first_us.write(s, now);
                slot_last_us.write(s, now);
                slot_state.write(s, frag_bit == all_frags ? STATE_FORWARDED : STATE_RECEIVING);
            } else if (stored_key != key) {
                meta.drop_reason = DROP_STATE_FULL;     /* another message holds the slot */
            } else {
                bit<168> stored_request;
                slot_request.read(stored_request, s);
                if (stored_request != request) {
                    meta.drop_reason = DROP_FRAG_MISMATCH;
                } else {
                    bit<256> frags;
                    slot_request_frags.read(frags, s);
                    slot_bytes_in.read(bytes, s);
                    if ((frags & frag_bit) == 0) {
                        slot_bytes_in.write(s, bytes + body);   /* a duplicate counts once */
                    }
                    frags = frags | frag_bit;
                    slot_request_frags.write(s, frags);
                    slot_frames_in.read(frames, s);
                    slot_frames_in.write(s, frames + 1);
                    slot_last_us.write(s, now);
                    if (frags == all_frags && state == STATE_RECEIVING) {
                        slot_state.write(s, STATE_FORWARDED);
                    }
                }
            }
        } else {
            bit<168> stored_request;
            slot_request.read(stored_request, s);
            bit<8> request_type = stored_request[167:160];
            bit<16> request_shard = stored_request[159:144];
            bit<32> request_value_len = stored_request[47:16];
            if (state == STATE_FREE || stored_key != key) {
                meta.drop_reason = DROP_UNSOLICITED_REPLY;
            } else if (request_shard != hdr.embnic.shard_id) {
                meta.drop_reason = DROP_WRONG_SHARD_REPLY;
            } else if (!(hdr.embnic.msg_type == MSG_ERROR ||
                         (request_type == MSG_LOOKUP_REQ && hdr.embnic.msg_type == MSG_LOOKUP_REPLY) ||
                         (request_type == MSG_UPDATE_REQ && (hdr.embnic.msg_type == MSG_UPDATE_ACK ||
                                                              hdr.embnic.msg_type == MSG_UPDATE_NACK)) ||
                         (request_type == MSG_SIZE_REQ && hdr.embnic.msg_type == MSG_SIZE_ACK))) {
                meta.drop_reason = DROP_WRONG_REPLY_TYPE;
            } else if (hdr.embnic.msg_type == MSG_LOOKUP_REPLY &&
                       hdr.embnic.value_len != request_value_len) {
                /* not the length the request announced: the rows of another request */
                meta.drop_reason = DROP_BAD_REPLY_LEN;
            } else {
                bit<72> reply = hdr.embnic.msg_type ++ hdr.embnic.frag_count ++ hdr.embnic.msg_len ++
                                last_len;
                bit<72> stored_reply;
                bit<256> frags;
                slot_reply.read(stored_reply, s);
                slot_reply_frags.read(frags, s);
                if (frags != 0 && stored_reply != reply) {
                    meta.drop_reason = DROP_FRAG_MISMATCH;
                } else {
                    slot_bytes_out.read(bytes, s);
                    if ((frags & frag_bit) == 0) {
                        slot_bytes_out.write(s, bytes + body);  /* a duplicate counts once */
                    }
                    frags = frags | frag_bit;
                    slot_reply.write(s, reply);
                    slot_reply_frags.write(s, frags);
                    slot_frames_out.read(frames, s);
                    slot_frames_out.write(s, frames + 1);
                    slot_last_us.write(s, now);
                    if (frags == all_frags) {
                        /* the whole reply has passed: free the entry */
                        slot_state.write(s, STATE_FREE);
                        messages_completed.count((bit<32>)(hdr.embnic.msg_type & 15));
                        completed_by_shard.count((bit<32>)hdr.embnic.shard_id);
                    } else {
                        slot_state.write(s, STATE_REPLYING);
                    }
                }
            }
        }
    }
}

#endif /* EMBNIC_STATE_MAP_P4 */
