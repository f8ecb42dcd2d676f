// Fault-rule language: the parsed form of one rule (match keys -> actions) and the parser
// for rules and plans (SOFTRNIC_FAULTS / SOFTRNIC_FAULTS_FILE). Control path only: parsing
// allocates; the engine (emu/fault/fault.h) evaluates the parsed rules per packet without allocating.
//
// Grammar (one rule; a plan is rules separated by ';' or newlines, '#' comments to end of line):
//   rule    := [ "rule" NAME ] { match } "=>" action { "," action }
//   match   := KEY "=" VALUE | "once"
//   KEY     := name | dir | qpn | op | class | psn | nth | every | pkt | iter | p | prob
//            | len | src | dst | max
//     dir=tx|rx|any          direction as seen by this device's port
//     qpn=N | N..M           BTH destination QP (decimal or 0x hex)
//     op=PAT{|PAT}           opcode name glob, '*' wildcard, case-insensitive, matched against the
//                            full name (RC_RDMA_WRITE_ONLY) and without the RC_/UC_/UD_ prefix
//                            (RDMA_WRITE_*), or a number (0x0a)
//     class=C{|C}            send write read_req read_resp atomic atomic_ack atomic_write flush
//                            ack (positive ACK only) nak rnr_nak cnp req resp
//     psn=N | N..M           absolute PSN range
//     psn=+K | +K..+M        relative to the first PSN this rule saw on the (dir, qpn) flow
//     nth=N | N..M           1-based count among packets that passed the keys above
//     every=K                every K-th such packet (K, 2K, ...)
//     pkt=N | N..M           1-based index of the packet among all packets the engine saw
//     iter=N | N..M          transmission number of this (dir, qpn, psn): 1 = first, 2 = first
//                            retransmission, ... (tracked by the rule, window of 256 PSNs)
//     p=F | prob=F           probability 0..1 or "N%", drawn from the rule's seeded stream
//     len=N | N..M           payload bytes (pad excluded)
//     src=IP[:PORT] dst=...  endpoints ([v6]:port for IPv6 with a port)
//     max=N, once            fire at most N times (once = max=1)
//   action  := drop | dup[(N)] | duplicate[(N)] | delay(T) | reorder[(K[, max=T])]
//            | corrupt(payload|icrc|hdr [, bits=N] [, off=O] [, fix])
//            | rewrite(FIELD OP VALUE [, fix|nofix])     OP: = += -= ^=   VALUE: N | random
//            | truncate(N) | nak(CODE [, qpn=N] [, psn=N] [, msn=N] [, keep])
//            | rnr(TIMER [, qpn=N] [, psn=N] [, msn=N] [, keep]) | blackhole[(T)]
//     T: N[us|ms|s] (bare number = µs); blackhole without T (or "inf") lasts forever.
//     CODE: psn_seq inv_req rem_access rem_op inv_rd or 0..31.  TIMER: 0..31 (IB RNR code).
//     FIELD: one of these, per header "NAME [ALIAS]" (the list is kFaultFields below;
//            tests/emu/fault_rules_test.cc checks that this list equals it):
//       BTH: bth.opcode [opcode] bth.se [se] bth.mig [mig] bth.pad [pad] bth.tver [tver]
//            bth.pkey [pkey] bth.fecn [fecn] bth.becn [becn] bth.qpn [qpn] bth.ackreq [ackreq]
//            bth.psn [psn]
//       RETH: reth.va reth.rkey reth.len [dma_len]
//       AETH: aeth.syndrome [syndrome] aeth.msn [msn]
//       AtomicETH: atomic.va atomic.rkey atomic.swap atomic.compare
//       AtomicAckETH: atomicack.orig [orig]
//       DETH: deth.qkey [qkey] deth.srcqp [src_qp]
//       ImmDt: imm [immdt.imm]
//       IETH: ieth.rkey [inv_rkey]
//       RETH|AtomicETH: rkey va
//            (RETH's if the packet has one, else AtomicETH's)
//   Semantics: nth/every count packets that reached the rule and passed its other static keys
//   (evaluation stops at the first rule that returns a verdict, so later rules do not see that
//   packet). dup(N) sends N extra copies. reorder(K) holds the packet in the engine until K more
//   packets of the same direction and QPN have passed (or max=T, default 1ms, 0 = no limit),
//   then releases it through FaultEngine::drain(). blackhole(T) drops the triggering packet
//   and, for T, every packet the rule's static keys match. nak/rnr synthesize an ACKNOWLEDGE
//   toward the sender (QPN from qpn= or the engine's resolver) and drop the original unless
//   keep. A rule matches only packets that carry the headers its actions touch.
//   Terminal actions (drop, reorder, blackhole, nak/rnr without keep) must come last; dup and
//   delay exclude each other and the terminal ones. Defaults: rewrite fixes the ICRC, corrupt
//   does not (add "fix" / "nofix").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/port.h"

namespace rnic::emu {

enum class FaultActionKind : uint8_t {
  kDrop,
  kDuplicate,
  kDelay,
  kReorder,
  kCorrupt,
  kRewrite,
  kTruncate,
  kNak,  // NAK or RNR NAK (syndrome decides)
  kBlackhole,
};
const char* fault_action_name(FaultActionKind k);

enum class CorruptTarget : uint8_t { kPayload, kIcrc, kHeader };

// A header field rewrite(FIELD ...) can change. The enumerators index kFaultFields.
enum class FaultField : uint8_t {
  kOpcode, kSe, kMig, kPad, kTver, kPkey, kFecn, kBecn, kQpn, kAckReq, kPsn,
  kRethVa, kRethRkey, kRethLen, kAethSyndrome, kAethMsn,
  kAtomicVa, kAtomicRkey, kAtomicSwap, kAtomicCompare, kAtomicAckOrig,
  kDethQkey, kDethSrcQp, kImm, kIethRkey,
  kRkey,  // RETH or AtomicETH R_Key
  kVa,    // RETH or AtomicETH VA
};

// The header a field lives in. kRethOrAtomicEth: the RETH if the packet has one, else the
// AtomicETH; VA and R_Key sit at the same offsets in both (wire/hdr.h).
enum class FieldHeader : uint8_t {
  kBth, kReth, kAeth, kAtomicEth, kAtomicAckEth, kDeth, kImmDt, kIeth, kRethOrAtomicEth,
};

// One rewritable field: the ONE table the parser (names), the applier (where the bits are)
// and the printer (fault_field_name) use. Layouts as in wire/hdr.h (IBA 9.2 BTH, 9.3 ETHs).
// A field is `mask` within the big-endian word of `width` bytes at `offset` in its header;
// a rewrite also clears `clear` (reserved bits that wire/hdr.h's setter zeroes).
struct FaultFieldInfo {
  FaultField field;
  const char* name;    // canonical spelling
  const char* alias;   // the other accepted spelling, or nullptr
  FieldHeader header;
  uint8_t offset;
  uint8_t width;       // 1..8
  uint64_t mask;
  uint64_t clear = 0;
};

inline constexpr FaultFieldInfo kFaultFields[] = {
    // field                   name              alias        header                        off  w  mask [clear]
    {FaultField::kOpcode,        "bth.opcode",     "opcode",    FieldHeader::kBth,             0,  1, 0xff},
    {FaultField::kSe,            "bth.se",         "se",        FieldHeader::kBth,             1,  1, 0x80},
    {FaultField::kMig,           "bth.mig",        "mig",       FieldHeader::kBth,             1,  1, 0x40},
    {FaultField::kPad,           "bth.pad",        "pad",       FieldHeader::kBth,             1,  1, 0x30},
    {FaultField::kTver,          "bth.tver",       "tver",      FieldHeader::kBth,             1,  1, 0x0f},
    {FaultField::kPkey,          "bth.pkey",       "pkey",      FieldHeader::kBth,             2,  2, 0xffff},
    {FaultField::kFecn,          "bth.fecn",       "fecn",      FieldHeader::kBth,             4,  1, 0x80},
    {FaultField::kBecn,          "bth.becn",       "becn",      FieldHeader::kBth,             4,  1, 0x40},
    {FaultField::kQpn,           "bth.qpn",        "qpn",       FieldHeader::kBth,             5,  3, 0xffffff},
    {FaultField::kAckReq,        "bth.ackreq",     "ackreq",    FieldHeader::kBth,             8,  1, 0x80},
    {FaultField::kPsn,           "bth.psn",        "psn",       FieldHeader::kBth,             9,  3, 0xffffff},
    {FaultField::kRethVa,        "reth.va",        nullptr,     FieldHeader::kReth,            0,  8, ~0ull},
    {FaultField::kRethRkey,      "reth.rkey",      nullptr,     FieldHeader::kReth,            8,  4, 0xffffffff},
    {FaultField::kRethLen,       "reth.len",       "dma_len",   FieldHeader::kReth,            12, 4, 0xffffffff},
    {FaultField::kAethSyndrome,  "aeth.syndrome",  "syndrome",  FieldHeader::kAeth,            0,  1, 0xff},
    {FaultField::kAethMsn,       "aeth.msn",       "msn",       FieldHeader::kAeth,            1,  3, 0xffffff},
    {FaultField::kAtomicVa,      "atomic.va",      nullptr,     FieldHeader::kAtomicEth,       0,  8, ~0ull},
    {FaultField::kAtomicRkey,    "atomic.rkey",    nullptr,     FieldHeader::kAtomicEth,       8,  4, 0xffffffff},
    {FaultField::kAtomicSwap,    "atomic.swap",    nullptr,     FieldHeader::kAtomicEth,       12, 8, ~0ull},
    {FaultField::kAtomicCompare, "atomic.compare", nullptr,     FieldHeader::kAtomicEth,       20, 8, ~0ull},
    {FaultField::kAtomicAckOrig, "atomicack.orig", "orig",      FieldHeader::kAtomicAckEth,    0,  8, ~0ull},
    {FaultField::kDethQkey,      "deth.qkey",      "qkey",      FieldHeader::kDeth,            0,  4, 0xffffffff},
    // SrcQP with the reserved byte before it, which a rewrite zeroes (as Deth::set_src_qp).
    {FaultField::kDethSrcQp,     "deth.srcqp",     "src_qp",    FieldHeader::kDeth,            4,  4, 0x00ffffff, 0xff000000},
    {FaultField::kImm,           "imm",            "immdt.imm", FieldHeader::kImmDt,           0,  4, 0xffffffff},
    {FaultField::kIethRkey,      "ieth.rkey",      "inv_rkey",  FieldHeader::kIeth,            0,  4, 0xffffffff},
    {FaultField::kRkey,          "rkey",           nullptr,     FieldHeader::kRethOrAtomicEth, 8,  4, 0xffffffff},
    {FaultField::kVa,            "va",             nullptr,     FieldHeader::kRethOrAtomicEth, 0,  8, ~0ull},
};

// kFaultFields[f]; fault_field_name(f) is its canonical name.
const FaultFieldInfo& fault_field_info(FaultField f);
const char* fault_field_name(FaultField f);
// "BTH", "RETH", "AETH", "AtomicETH", "AtomicAckETH", "DETH", "ImmDt", "IETH", "RETH|AtomicETH".
const char* fault_field_header_name(FieldHeader h);
// The field whose name or alias is `name` (case as written in the table), or nullptr.
const FaultFieldInfo* find_fault_field(std::string_view name);

enum class RewriteOp : uint8_t { kSet, kAdd, kSub, kXor, kRandom };

struct FaultAction {
  FaultActionKind kind = FaultActionKind::kDrop;
  uint32_t count = 1;      // dup: extra copies; reorder: K; corrupt: bits; truncate: bytes
  uint64_t time_us = 0;    // delay; reorder: max hold (0 = none); blackhole: 0 = forever
  CorruptTarget target = CorruptTarget::kPayload;
  int32_t offset = -1;     // corrupt: byte offset inside the target, -1 = random
  bool fix_icrc = false;   // recompute the ICRC after corrupt / rewrite
  FaultField field = FaultField::kPsn;
  RewriteOp op = RewriteOp::kSet;
  uint64_t value = 0;
  uint8_t syndrome = 0;    // nak / rnr: the AETH syndrome to send
  bool has_qpn = false;    // nak: explicit destination QPN for the synthesized packet
  uint32_t qpn = 0;
  bool has_psn = false;    // nak: explicit PSN (default: the matched packet's PSN)
  uint32_t psn = 0;
  uint32_t msn = 0;
  bool keep = false;       // nak: also let the original through
  std::string text;        // the action as written (for traces and list)

  // True if the action decides the packet's fate (ends rule evaluation).
  bool terminal() const;
};

struct U64Range {
  uint64_t lo = 0;
  uint64_t hi = UINT64_MAX;
  bool contains(uint64_t v) const { return v >= lo && v <= hi; }
};

// AETH type filter bits for RC_ACKNOWLEDGE packets.
inline constexpr uint8_t kAethAck = 1, kAethRnr = 2, kAethNak = 4, kAethAll = 7;

struct EndpointMatch {
  wire::Endpoint ep;
  bool any_port = true;
  bool matches(const wire::Endpoint& e) const {
    return e.same_ip(ep) && (any_port || e.port == ep.port);
  }
};

struct FaultRule {
  std::string name;   // from "rule NAME" / name=; empty if unnamed
  std::string text;   // the rule as written (trimmed)
  std::string actions_text;  // the actions as written, comma-joined
  uint8_t dirs = 3;   // bit 0 tx, bit 1 rx
  std::array<uint64_t, 4> opcodes{~0ull, ~0ull, ~0ull, ~0ull};  // 256-bit set
  uint8_t aeth_types = kAethAll;  // applies to RC_ACKNOWLEDGE only
  std::optional<U64Range> qpn, psn, nth, pkt, iter, len;
  bool psn_relative = false;
  uint64_t every = 0;
  double prob = 1.0;
  uint64_t prob_threshold = UINT64_MAX;  // draw < threshold fires (prob < 1 only)
  bool use_prob = false;
  std::optional<EndpointMatch> src, dst;
  uint64_t max_fires = UINT64_MAX;
  uint32_t require_all = 0;   // header mask bits every matched packet must carry
  uint32_t require_any = 0;   // ... at least one of these (0 = none required)
  bool require_payload = false;
  std::vector<FaultAction> actions;

  bool has_opcode(uint8_t op) const { return (opcodes[op >> 6] >> (op & 63)) & 1; }
  // Label for traces and listings: the name, or the rule text if unnamed.
  const std::string& label() const { return name.empty() ? text : name; }
  // True if the rule keeps per-flow state (relative PSN or iter).
  bool needs_flows() const { return psn_relative || iter.has_value(); }
};

// Parses one rule. Returns "" on success, else an error naming the rule text and the column
// (1-based, in the trimmed rule text): `fault rule "TEXT": column C: MESSAGE`.
std::string parse_fault_rule(std::string_view text, FaultRule* out);

// Parses a plan: rules separated by ';' or newlines; '#' starts a comment to the end of the
// line; blank rules are skipped. A statement "seed=N" (or "seed N") sets *seed if non-null.
// `origin` prefixes errors (e.g. "SOFTRNIC_FAULTS" or "faults.txt"); errors name the rule
// number (1-based among non-blank rules), and for multi-line text the line.
// All-or-nothing: on error *out is left unchanged.
std::string parse_fault_plan(std::string_view text, std::string_view origin,
                             std::vector<FaultRule>* out, std::optional<uint64_t>* seed = nullptr);

// Number parsers shared with the engine's configuration (decimal or 0x hex). False on junk.
bool parse_fault_u64(std::string_view s, uint64_t* v);

}  // namespace rnic::emu
