/* SPDX-License-Identifier: Apache-2.0
 *
 * Types and constants of the embnic card, on every architecture (v1model,
 * PNA). Protocol constants
 * come from docs/protocol.md (client_lib/consts.py is the Python copy);
 * the drop reasons follow the DPDK card's list (dataplane/include/
 * embnic_parse.h, EMBNIC_DROP_REASONS) index for index, so a counter index
 * means the same reason on both targets. tests/p4/test_p4_source.py checks
 * both against the Python and C definitions.
 */
#ifndef EMBNIC_TYPES_P4
#define EMBNIC_TYPES_P4

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<16> l4_port_t;
typedef bit<32> port_id_t;         /* a card port (v1model's 9-bit port and PNA's PortId_t are cast
                                    * to and from it by the architecture files) */
typedef bit<16> shard_id_t;
typedef bit<16> client_id_t;
typedef bit<32> msg_id_t;
typedef bit<8>  drop_reason_t;
typedef bit<32> slot_t;            /* index of a state map slot */

/* Ethernet, IPv4, UDP, ARP */
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP  = 0x0806;
const bit<8>  IP_PROTO_UDP   = 17;
const bit<16> ARP_HTYPE_ETHERNET = 1;
const bit<16> ARP_OPER_REQUEST   = 1;
const bit<16> ARP_OPER_REPLY     = 2;
const bit<8>  CARD_TTL = 64;       /* TTL of every frame the card sends */
const bit<16> ETH_HDR_LEN  = 14;
const bit<16> IPV4_HDR_LEN = 20;
const bit<16> UDP_HDR_LEN  = 8;

/* embnic wire protocol v2 (docs/protocol.md); a version-1 frame is bad_version */
const l4_port_t EMBNIC_UDP_PORT = 7878;
const bit<16> EMBNIC_MAGIC   = 0x454D;
const bit<8>  EMBNIC_VERSION = 2;
const bit<16> EMBNIC_HDR_LEN = 44;
const bit<16> EMBNIC_MAX_FRAGS = 256;   /* fragments per message, at most */
/* body sizes the header's msg_len is checked with (docs/protocol.md, "Body"); the card
 * never reads a body, only these counts of the header */
const bit<64> EMBNIC_DIR_ENTRY  = 16;   /* bytes per table of a request's directory */
const bit<64> EMBNIC_KEY_SIZE   = 8;    /* bytes per key */
const bit<64> EMBNIC_SIZE_ENTRY = 16;   /* bytes per entry of a SIZE_REQ */
const bit<64> EMBNIC_MIN_ROW    = 2;    /* bytes of the smallest row: one fp16 value */
const bit<64> EMBNIC_NACK_LEN   = 32;   /* body of an UPDATE_NACK: a bitmap of EMBNIC_MAX_FRAGS bits */
const bit<16> EMBNIC_NO_TABLE   = 0xFFFF;  /* table_id of a header that names no table */

const bit<8> MSG_LOOKUP_REQ   = 1;
const bit<8> MSG_LOOKUP_REPLY = 2;
const bit<8> MSG_UPDATE_REQ   = 3;
const bit<8> MSG_UPDATE_ACK   = 4;
const bit<8> MSG_ERROR        = 5;
const bit<8> MSG_SIZE_REQ     = 6;   /* fixed-length mode: sizes of the data to come */
const bit<8> MSG_SIZE_ACK     = 7;
const bit<8> MSG_UPDATE_NACK  = 8;   /* the fragments of an update a shard holds (a 32-byte bitmap) */

const bit<8> FLAG_RETRANSMIT = 0x01;

/*
 * Drop reasons: the index of each reason in the drop_reasons counter.
 * 0 is "not dropped". ring_full, no_mbuf, tx_full and too_long_for_port
 * are DPDK-card reasons a P4 pipeline never has (no header ring to fill,
 * no mempool, no TX queue, no PMD frame size): their cells stay 0 on BMv2
 * (p4/README.md, "Differences").
 * Protocol v2 dropped v1's bad_dtype (the card sees no dtype: it lives in
 * the body's directory, which hosts check) and added bad_reply_len.
 */
const drop_reason_t DROP_NONE              = 0;
const drop_reason_t DROP_TOO_SHORT         = 1;
const drop_reason_t DROP_BAD_ETHER         = 2;
const drop_reason_t DROP_BAD_IP            = 3;
const drop_reason_t DROP_IP_OPTIONS        = 4;
const drop_reason_t DROP_NOT_UDP           = 5;
const drop_reason_t DROP_BAD_UDP           = 6;
const drop_reason_t DROP_BAD_PORT          = 7;
const drop_reason_t DROP_BAD_MAGIC         = 8;
const drop_reason_t DROP_BAD_VERSION       = 9;
const drop_reason_t DROP_BAD_TYPE          = 10;
const drop_reason_t DROP_BAD_LENGTH        = 11;
const drop_reason_t DROP_UNKNOWN_CLIENT    = 12;
const drop_reason_t DROP_UNKNOWN_SERVER    = 13;
const drop_reason_t DROP_UNKNOWN_SHARD     = 14;
const drop_reason_t DROP_RING_FULL         = 15;
const drop_reason_t DROP_NO_MBUF           = 16;
const drop_reason_t DROP_TX_FULL           = 17;
const drop_reason_t DROP_STATE_FULL        = 18;
const drop_reason_t DROP_ARP_IGNORED       = 19;
const drop_reason_t DROP_WRONG_DST         = 20;
const drop_reason_t DROP_FRAG_MISMATCH     = 21;
const drop_reason_t DROP_TOO_MANY_FRAGS    = 22;
const drop_reason_t DROP_UNSOLICITED_REPLY = 23;
const drop_reason_t DROP_WRONG_SHARD_REPLY = 24;
const drop_reason_t DROP_WRONG_REPLY_TYPE  = 25;
const drop_reason_t DROP_BAD_REPLY_LEN     = 26;  /* a LOOKUP_REPLY whose value_len is not its request's */
const drop_reason_t DROP_TRUNCATED         = 27;  /* IPv4 total length beyond the bytes received */
const drop_reason_t DROP_TOO_LONG_FOR_PORT = 28;  /* longer than its egress port sends (DPDK PMD limit) */
const drop_reason_t DROP_WRONG_PORT        = 29;  /* a registered sender's address from another card port or MAC */
const bit<32> NB_DROP_REASONS = 30;     /* cells of drop_reasons */

/* Message states in the state map (slot_state) */
const bit<8> STATE_FREE      = 0;
const bit<8> STATE_RECEIVING = 1;       /* some request fragments seen */
const bit<8> STATE_FORWARDED = 2;       /* every request fragment seen */
const bit<8> STATE_REPLYING  = 3;       /* some reply fragments passed */

/* Sizes */
const bit<32> STATE_SLOTS = 4096;       /* state map slots (power of two) */
const bit<8>  STATE_SLOT_BITS = 12;    /* log2(STATE_SLOTS) */
/* a message's fragment bitmap: EMBNIC_MAX_FRAGS bits as FRAG_WORDS registers of 64 bits
 * (register cell (slot << FRAG_WORD_SHIFT) | (frag_index >> 6), bit frag_index & 63) */
const bit<32> FRAG_WORDS = 4;
const bit<8>  FRAG_WORD_SHIFT = 2;      /* log2(FRAG_WORDS) */
const bit<48> STATE_TIMEOUT_US = 5000000;  /* default entry timeout */
const bit<32> RING_SLOTS = 1024;        /* header ring entries (power of two) */
const bit<32> NB_PORTS = 512;           /* cells of the per-port counters */
const bit<32> NB_MSG_TYPES = 16;        /* cells of the per-type counters (msg_type & 15) */
const bit<32> NB_SHARDS = 65536;        /* cells of the per-shard counters (any shard_id) */
const int ROUTE_TABLE_SIZE = 4096;
const int CLIENT_TABLE_SIZE = 4096;
const int ALLOWLIST_SIZE = 8192;
const int CARD_PORT_TABLE_SIZE = 512;

#endif /* EMBNIC_TYPES_P4 */
