// FaultEngine: rule evaluation per packet, the actions, reorder holding and NAK synthesis,
// trace and configuration from the environment. See emu/fault/fault.h for the contract.
#include "emu/fault/fault.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "base/hash.h"
#include "wire/byteorder.h"
#include "wire/hdr.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/psn.h"

namespace rnic::emu {

using wire::Direction;
using wire::Endpoint;
using wire::Verdict;

namespace {

// Set while drain() hands a packet to its callback, so a drained tx packet that goes back
// through Port::send_batch is not filtered (and not counted) a second time.
thread_local bool t_emitting = false;

// splitmix64 (Steele, Lea, Flood 2014): tiny, full-period, good enough for fault decisions.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int dir_index(Direction d) { return d == Direction::kTx ? 0 : 1; }
const char* dir_name(Direction d) { return d == Direction::kTx ? "tx" : "rx"; }

// Rewrites the trailing ICRC of a RoCE packet (BTH .. ICRC) for these endpoints, IP ID 0.
void fix_icrc(std::span<uint8_t> roce, const Endpoint& src, const Endpoint& dst) {
  if (roce.size() < wire::kBthBytes + wire::kIcrcBytes) return;
  size_t body = roce.size() - wire::kIcrcBytes;
  uint32_t crc = wire::icrc_compute(wire::meta_between(src, dst), roce.first(body));
  wire::store_le32(roce.data() + body, crc);
}

// Big-endian words of 1..8 bytes: a rewritable field's container (emu/fault/fault_rules.h).
uint64_t load_be(const uint8_t* p, unsigned width) {
  uint64_t v = 0;
  for (unsigned i = 0; i < width; ++i) v = (v << 8) | p[i];
  return v;
}

void store_be(uint8_t* p, unsigned width, uint64_t v) {
  for (unsigned i = width; i-- > 0; v >>= 8) p[i] = uint8_t(v);
}

// First byte of the header that holds a field of `h` in a packet with this opcode row. The
// rule's require_* keys (RuleParser::require_for_field) guarantee the header is present.
uint8_t* field_header(std::span<uint8_t> roce, const wire::OpcodeInfo& info, FieldHeader h) {
  static constexpr wire::HdrType kHdrOf[] = {
      wire::kHdrBth,  wire::kHdrReth,  wire::kHdrAeth, wire::kHdrAtmEth, wire::kHdrAtmAck,
      wire::kHdrDeth, wire::kHdrImmDt, wire::kHdrIeth,
  };
  if (h == FieldHeader::kBth) return roce.data();
  wire::HdrType t = h == FieldHeader::kRethOrAtomicEth
                        ? ((info.mask & wire::kRethMask) ? wire::kHdrReth : wire::kHdrAtmEth)
                        : kHdrOf[size_t(h)];
  return roce.data() + info.offset[t];
}

}  // namespace

// ---- Internal state -----------------------------------------------------------------

struct FaultEngine::Packet {
  wire::PacketView v;
  uint8_t opcode = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  size_t payload_off = 0;  // from BTH start
  size_t payload_len = 0;
  size_t hdr_len = 0;
};

namespace {
struct Flow {
  bool used = false;
  Direction dir = Direction::kTx;
  uint32_t qpn = 0;
  uint32_t base_psn = 0;
  uint32_t tag[256];    // psn | kValid for the entry at psn & 255
  uint32_t count[256];  // transmissions of that psn
};
constexpr uint32_t kTagValid = 0x80000000u;
}  // namespace

struct FaultEngine::RuleState {
  uint32_t id = 0;
  FaultRule rule;
  uint64_t rng = 0;
  uint64_t matched = 0;
  uint64_t nth_count = 0;
  uint64_t fired = 0;
  bool bh_active = false;
  uint64_t bh_until_ns = 0;  // 0 with bh_active = forever
  std::unique_ptr<Flow[]> flows;
  uint32_t flow_next = 0;

  Flow* flow(Direction dir, uint32_t qpn, uint32_t psn) {
    for (size_t i = 0; i < kMaxFlows; ++i) {
      Flow& f = flows[i];
      if (f.used && f.dir == dir && f.qpn == qpn) return &f;
    }
    Flow& f = flows[flow_next++ % kMaxFlows];  // evicts the oldest flow
    f.used = true;
    f.dir = dir;
    f.qpn = qpn;
    f.base_psn = psn;
    std::memset(f.tag, 0, sizeof(f.tag));
    std::memset(f.count, 0, sizeof(f.count));
    return &f;
  }
};

struct FaultEngine::Slot {
  enum State : uint8_t { kFree, kHeld, kReady, kDraining };
  State state = kFree;
  Direction out_dir = Direction::kTx;
  Endpoint src, dst;
  uint32_t len = 0;
  uint64_t seq = 0;          // release order
  Direction hold_dir = Direction::kTx;
  uint32_t hold_qpn = 0;
  uint32_t remaining = 0;    // packets of (hold_dir, hold_qpn) still to pass
  uint64_t deadline_ns = 0;  // 0 = none
  uint8_t data[kSlotBytes];
};

// ---- Construction / configuration ------------------------------------------------------

FaultEngine::FaultEngine(uint64_t seed) : seed_(seed), slots_(new Slot[kSlots]) {}

FaultEngine::~FaultEngine() {
  if (owned_trace_file_ != nullptr) std::fclose(owned_trace_file_);
}

void FaultEngine::reset_rule_locked(RuleState& rs) {
  // Stream derived from (seed, label): adding or removing other rules does not perturb it.
  rs.rng = seed_ ^ base::fnv1a64(rs.rule.label());
  splitmix64(rs.rng);
  rs.matched = rs.nth_count = rs.fired = 0;
  rs.bh_active = false;
  rs.bh_until_ns = 0;
  rs.flow_next = 0;
  if (rs.flows) {
    for (size_t i = 0; i < kMaxFlows; ++i) rs.flows[i].used = false;
  }
}

void FaultEngine::rebuild_masks_locked() {
  uint64_t m[2][4] = {};
  // pkt= numbers every packet of both directions, and so do trace lines: all must be seen.
  bool all = trace_cap_ != 0 || trace_file_ != nullptr;
  for (const auto& rs : rules_) {
    if (rs->rule.pkt) all = true;
    for (int d = 0; d < 2; ++d) {
      if (!(rs->rule.dirs & (1 << d))) continue;
      for (int w = 0; w < 4; ++w) m[d][w] |= rs->rule.opcodes[w];
    }
  }
  for (int d = 0; d < 2; ++d) {
    bool any = all;
    for (int w = 0; w < 4; ++w) {
      mask_[d][w].store(m[d][w], std::memory_order_relaxed);
      any = any || m[d][w] != 0;
    }
    want_[d].store(any, std::memory_order_relaxed);
  }
  slow_all_.store(held_ != 0, std::memory_order_relaxed);
}

std::string FaultEngine::add_parsed(std::vector<FaultRule> rules, std::vector<uint32_t>* ids) {
  if constexpr (!wire::kFaultInjection) {
    if (!rules.empty())
      return "fault injection is compiled out of this build (meson -Dfault_injection=true)";
  }
  std::lock_guard lk(mu_);
  for (FaultRule& r : rules) {
    auto rs = std::make_unique<RuleState>();
    rs->id = next_id_++;
    if (ids != nullptr) ids->push_back(rs->id);
    rs->rule = std::move(r);
    if (rs->rule.needs_flows()) rs->flows.reset(new Flow[kMaxFlows]);
    reset_rule_locked(*rs);
    labels_.push_back(rs->rule.label());
    actions_.push_back(rs->rule.actions_text);
    rules_.push_back(std::move(rs));
  }
  rebuild_masks_locked();
  return "";
}

std::string FaultEngine::add_rules(std::string_view plan, std::string_view origin,
                                   std::vector<uint32_t>* ids) {
  std::vector<FaultRule> rules;
  std::optional<uint64_t> seed;
  std::string e = parse_fault_plan(plan, origin, &rules, &seed);
  if (!e.empty()) return e;
  if (seed) set_seed(*seed);
  return add_parsed(std::move(rules), ids);
}

std::vector<FaultRuleInfo> FaultEngine::list() const {
  std::lock_guard lk(mu_);
  std::vector<FaultRuleInfo> out;
  for (const auto& rs : rules_)
    out.push_back(FaultRuleInfo{rs->id, rs->rule.label(), rs->rule.text, rs->matched, rs->fired});
  return out;
}

std::string FaultEngine::list_text() const {
  std::string s;
  for (const FaultRuleInfo& r : list()) {
    s += std::to_string(r.id) + " matched=" + std::to_string(r.matched) +
         " fired=" + std::to_string(r.fired) + " " + r.text + "\n";
  }
  return s;
}

bool FaultEngine::remove_rule(uint32_t id) {
  std::lock_guard lk(mu_);
  auto it = std::find_if(rules_.begin(), rules_.end(), [&](const auto& rs) { return rs->id == id; });
  if (it == rules_.end()) return false;
  rules_.erase(it);
  rebuild_masks_locked();
  return true;
}

void FaultEngine::clear() {
  std::lock_guard lk(mu_);
  rules_.clear();
  // Nothing more will release held packets by count: release them now, in hold order.
  for (size_t i = 0; i < kSlots; ++i) {
    if (slots_[i].state == Slot::kHeld) {
      slots_[i].state = Slot::kReady;
      slots_[i].seq = ++slot_seq_;
    }
  }
  held_ = 0;
  rebuild_masks_locked();
}

void FaultEngine::set_seed(uint64_t seed) {
  std::lock_guard lk(mu_);
  seed_ = seed;
  for (auto& rs : rules_) reset_rule_locked(*rs);
  ctr_ = FaultCounters{};
  trace_.clear();
  pkt_index_.store(0, std::memory_order_relaxed);
}

uint64_t FaultEngine::seed() const {
  std::lock_guard lk(mu_);
  return seed_;
}

FaultCounters FaultEngine::counters() const {
  std::lock_guard lk(mu_);
  FaultCounters c = ctr_;
  c.packets = pkt_index_.load(std::memory_order_relaxed);
  return c;
}

std::string FaultEngine::counters_text() const {
  FaultCounters c = counters();
  const std::pair<const char*, uint64_t> rows[] = {
      {"fault_packets", c.packets},         {"fault_examined", c.examined},
      {"fault_fired", c.fired},             {"fault_dropped", c.dropped},
      {"fault_duplicated", c.duplicated},   {"fault_delayed", c.delayed},
      {"fault_reordered", c.reordered},     {"fault_corrupted", c.corrupted},
      {"fault_rewritten", c.rewritten},     {"fault_truncated", c.truncated},
      {"fault_injected", c.injected},       {"fault_blackholed", c.blackholed},
      {"fault_inject_unresolved", c.inject_unresolved},
      {"fault_hold_overflow", c.hold_overflow}, {"fault_trace_overflow", c.trace_overflow},
  };
  std::string s;
  for (const auto& [name, v] : rows) s += std::string(name) + " " + std::to_string(v) + "\n";
  return s;
}

void FaultEngine::set_qpn_resolver(FaultQpnResolver fn) {
  std::lock_guard lk(mu_);
  resolver_ = std::move(fn);
}

// ---- Trace ---------------------------------------------------------------------------

void FaultEngine::enable_trace(size_t max_events) {
  std::lock_guard lk(mu_);
  trace_.clear();
  trace_.shrink_to_fit();
  trace_.reserve(max_events);
  trace_cap_ = max_events;
  rebuild_masks_locked();
}

std::vector<FaultTraceEvent> FaultEngine::trace() const {
  std::lock_guard lk(mu_);
  return trace_;
}

std::string FaultEngine::format_event(const FaultTraceEvent& e) const {
  char buf[160];
  const char* name = wire::opcode_info(e.opcode).name;
  char opbuf[8];
  if (name == nullptr) {
    std::snprintf(opbuf, sizeof(opbuf), "0x%02x", e.opcode);
    name = opbuf;
  }
  std::snprintf(buf, sizeof(buf), "%" PRIu64 " %s %s qpn=0x%06x psn=%u rule=", e.pkt,
                dir_name(e.dir), name, e.qpn, e.psn);
  std::string s = buf;
  size_t i = e.rule_id - 1;
  s += i < labels_.size() ? labels_[i] : "?";
  s += " ";
  s += e.blackhole_window ? std::string("blackhole-window") : (i < actions_.size() ? actions_[i] : "?");
  return s;
}

std::string FaultEngine::format_trace() const {
  std::lock_guard lk(mu_);
  std::string s;
  for (const FaultTraceEvent& e : trace_) s += format_event(e) + "\n";
  return s;
}

void FaultEngine::set_trace_file(std::FILE* f) {
  std::lock_guard lk(mu_);
  trace_file_ = f;
  rebuild_masks_locked();
}

void FaultEngine::record_locked(const FaultTraceEvent& e) {
  if (trace_cap_ != 0) {
    if (trace_.size() < trace_cap_) trace_.push_back(e);  // capacity reserved: no allocation
    else ++ctr_.trace_overflow;
  }
  if (trace_file_ != nullptr) {
    const char* name = wire::opcode_info(e.opcode).name;
    size_t i = e.rule_id - 1;
    std::fprintf(trace_file_, "%" PRIu64 " %s %s qpn=0x%06x psn=%u rule=%s %s\n", e.pkt,
                 dir_name(e.dir), name != nullptr ? name : "?", e.qpn, e.psn,
                 i < labels_.size() ? labels_[i].c_str() : "?",
                 e.blackhole_window ? "blackhole-window"
                                    : (i < actions_.size() ? actions_[i].c_str() : "?"));
  }
}

// ---- Port integration ------------------------------------------------------------------

bool FaultEngine::attach(wire::Port& port) { return port.set_filter(this); }

void FaultEngine::detach(wire::Port& port) { port.set_filter(nullptr); }

void FaultEngine::release_expired_locked(uint64_t now_ns) {
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& s = slots_[i];
    if (s.state == Slot::kHeld && s.deadline_ns != 0 && s.deadline_ns <= now_ns) {
      s.state = Slot::kReady;
      s.seq = ++slot_seq_;
      --held_;
    }
  }
  slow_all_.store(held_ != 0, std::memory_order_relaxed);
}

size_t FaultEngine::drain(Direction dir, EmitFn fn, void* ctx) {
  size_t n = 0;
  for (;;) {
    Slot* pick = nullptr;
    {
      std::lock_guard lk(mu_);
      if (held_ != 0) release_expired_locked(wire::monotonic_ns());
      for (size_t i = 0; i < kSlots; ++i) {
        Slot& s = slots_[i];
        if (s.state == Slot::kReady && s.out_dir == dir && (pick == nullptr || s.seq < pick->seq))
          pick = &s;
      }
      if (pick == nullptr) return n;
      pick->state = Slot::kDraining;  // ours until freed below; slot memory is stable
    }
    t_emitting = true;
    fn(ctx, pick->src, pick->dst, std::span<const uint8_t>(pick->data, pick->len));
    t_emitting = false;
    std::lock_guard lk(mu_);
    pick->state = Slot::kFree;
    live_slots_.fetch_sub(1, std::memory_order_release);
    ++n;
  }
}

uint64_t FaultEngine::next_deadline_ns() const {
  std::lock_guard lk(mu_);
  uint64_t best = 0;
  for (size_t i = 0; i < kSlots; ++i) {
    const Slot& s = slots_[i];
    if (s.state == Slot::kHeld && s.deadline_ns != 0 && (best == 0 || s.deadline_ns < best))
      best = s.deadline_ns;
  }
  return best;
}

size_t FaultEngine::pending() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (size_t i = 0; i < kSlots; ++i) n += slots_[i].state != Slot::kFree;
  return n;
}

bool FaultEngine::hold_locked(Direction dir, const Endpoint& src, const Endpoint& dst,
                              std::span<const uint8_t> bytes, uint32_t qpn, uint32_t k,
                              uint64_t max_us) {
  if (bytes.size() > kSlotBytes) return false;
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& s = slots_[i];
    if (s.state != Slot::kFree) continue;
    s.state = Slot::kHeld;
    s.out_dir = dir;
    s.src = src;
    s.dst = dst;
    s.len = uint32_t(bytes.size());
    std::memcpy(s.data, bytes.data(), bytes.size());
    s.hold_dir = dir;
    s.hold_qpn = qpn;
    s.remaining = k;
    s.deadline_ns = max_us != 0 ? wire::monotonic_ns() + max_us * 1000 : 0;
    ++held_;
    live_slots_.fetch_add(1, std::memory_order_release);
    slow_all_.store(true, std::memory_order_relaxed);
    return true;
  }
  return false;
}

// ---- Evaluation steps ----------------------------------------------------------------------
// evaluate_locked (below) runs, per packet: count_holds_locked, parse_packet, then for each
// rule static_keys_match -> blackhole_window_locked -> decide_locked -> fire_locked ->
// apply_actions_locked (one apply_* per action kind, dispatched through kApply).

// One packet under evaluation: its parsed form plus what the actions decided so far.
struct FaultEngine::Eval {
  uint64_t idx;
  Direction dir;
  const Endpoint& src;
  const Endpoint& dst;
  std::span<uint8_t> roce;
  wire::FilterOut& out;
  Packet p;
  uint32_t hmask = 0;            // headers the opcode carries (wire/opcode.h masks)
  uint8_t aeth_bit = kAethAll;   // ACKNOWLEDGE: which AETH type the syndrome is
  uint8_t dbit = 0;              // rule.dirs bit of dir
  uint64_t now_ns = 0;           // read lazily: only blackholes need the clock
  Verdict verdict = Verdict::kPass;
  bool stop = false;             // end evaluation even without a verdict (hold overflow)

  uint64_t now() {
    if (now_ns == 0) now_ns = wire::monotonic_ns();
    return now_ns;
  }
};

namespace {

// The AETH type bit (kAethAck / kAethRnr / kAethNak) of an RC_ACKNOWLEDGE's syndrome.
uint8_t aeth_type_bit(uint8_t syn) {
  return wire::aeth::is_ack(syn) ? kAethAck : wire::aeth::is_rnr_nak(syn) ? kAethRnr
       : wire::aeth::is_nak(syn) ? kAethNak : 0;
}

// Flips a.count bits of target: consecutive from a.offset (clamped into the target), or
// distinct random bits drawn from rng (a repeat is re-drawn so flips never cancel).
void flip_bits(std::span<uint8_t> target, const FaultAction& a, uint64_t& rng) {
  const uint64_t len = target.size();
  uint64_t picked[64];
  for (uint32_t b = 0; b < a.count; ++b) {
    uint64_t bit;
    if (a.offset >= 0) {
      uint64_t base = std::min<uint64_t>(uint64_t(a.offset), len - 1) * 8;
      bit = std::min<uint64_t>(base + b, len * 8 - 1);
      if (b > 0 && bit == picked[b - 1]) break;
    } else {
      for (;;) {
        bit = splitmix64(rng) % (len * 8);
        if (std::find(picked, picked + b, bit) == picked + b) break;
        if (b >= len * 8) break;
      }
    }
    picked[b] = bit;
    target[bit / 8] ^= uint8_t(0x80u >> (bit % 8));
  }
}

// The new value of a rewritten field (already masked to the field's width by the caller).
uint64_t rewritten_value(const FaultAction& a, uint64_t old, uint64_t& rng) {
  switch (a.op) {
    case RewriteOp::kSet: return a.value;
    case RewriteOp::kAdd: return old + a.value;
    case RewriteOp::kSub: return old - a.value;
    case RewriteOp::kXor: return old ^ a.value;
    case RewriteOp::kRandom: return splitmix64(rng);
  }
  return old;
}

}  // namespace

// Fills *p from the packet (already known to hold a BTH and an ICRC); false if it does not
// parse, and the engine then passes it untouched.
bool FaultEngine::parse_packet(std::span<uint8_t> roce, uint32_t qpn, Packet* p) {
  if (wire::parse_roce(roce, &p->v) != wire::ParseError::kOk) return false;
  p->opcode = p->v.opcode;
  p->qpn = qpn;
  p->psn = p->v.bth().psn();
  p->hdr_len = p->v.hdr_len;
  p->payload_off = size_t(p->v.payload - p->v.hdr);
  p->payload_len = p->v.payload_len;
  return true;
}

// Reorder holds count the packets that pass after the held one (same direction and QPN).
void FaultEngine::count_holds_locked(Direction dir, uint32_t qpn) {
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& s = slots_[i];
    if (s.state == Slot::kHeld && s.hold_dir == dir && s.hold_qpn == qpn && --s.remaining == 0) {
      s.state = Slot::kReady;
      s.seq = ++slot_seq_;
      --held_;
    }
  }
  release_expired_locked(wire::monotonic_ns());
}

// The keys that need no per-rule state: direction, opcode, AETH type, QPN, length,
// endpoints and the headers the rule's actions touch.
bool FaultEngine::static_keys_match(const FaultRule& r, const Eval& e) {
  const Packet& p = e.p;
  if (!(r.dirs & e.dbit) || !r.has_opcode(p.opcode)) return false;
  if (p.opcode == wire::op::kRcAcknowledge && !(r.aeth_types & e.aeth_bit)) return false;
  if (r.qpn && !r.qpn->contains(p.qpn)) return false;
  if (r.len && !r.len->contains(p.payload_len)) return false;
  if (r.src && !r.src->matches(e.src)) return false;
  if (r.dst && !r.dst->matches(e.dst)) return false;
  if ((e.hmask & r.require_all) != r.require_all) return false;
  if (r.require_any != 0 && !(e.hmask & r.require_any)) return false;
  if (r.require_payload && p.payload_len == 0) return false;
  return true;
}

// An open blackhole window swallows everything the rule's static keys match: true when it
// did (the packet is dropped); an expired window closes here.
bool FaultEngine::blackhole_window_locked(RuleState& rs, Eval& e) {
  if (!rs.bh_active) return false;
  if (rs.bh_until_ns == 0 || e.now() < rs.bh_until_ns) {
    ++ctr_.blackholed;
    ++ctr_.dropped;
    record_locked(FaultTraceEvent{e.idx, e.dir, e.p.opcode, e.p.qpn, e.p.psn, rs.id, true});
    return true;
  }
  rs.bh_active = false;
  return false;
}

// The keys with per-rule state, in the documented order (fault_rules.h): psn (absolute or
// relative to the flow), iter, pkt, nth/every, then p (the only draw from the rule's
// stream, so it happens only when everything before matched) and max.
bool FaultEngine::decide_locked(RuleState& rs, Eval& e) {
  const FaultRule& r = rs.rule;
  const uint32_t psn = e.p.psn;
  Flow* flow = r.needs_flows() ? rs.flow(e.dir, e.p.qpn, psn) : nullptr;
  uint64_t iter = 1;
  if (r.iter) {
    uint32_t slot = psn & 255;
    if (flow->tag[slot] == (psn | kTagValid)) {
      iter = ++flow->count[slot];
    } else {
      flow->tag[slot] = psn | kTagValid;
      flow->count[slot] = 1;
    }
  }
  if (r.psn) {
    uint32_t v = r.psn_relative ? ((psn - flow->base_psn) & wire::kPsnMask) : psn;
    if (!r.psn->contains(v)) return false;
  }
  if (r.iter && !r.iter->contains(iter)) return false;
  if (r.pkt && !r.pkt->contains(e.idx)) return false;
  uint64_t n = ++rs.nth_count;
  if (r.nth && !r.nth->contains(n)) return false;
  if (r.every != 0 && n % r.every != 0) return false;
  if (r.use_prob && splitmix64(rs.rng) >= r.prob_threshold) return false;
  return rs.fired < r.max_fires;
}

// A firing: per-rule and engine counters, one trace event.
void FaultEngine::fire_locked(RuleState& rs, const Eval& e) {
  ++rs.fired;
  ++ctr_.fired;
  record_locked(FaultTraceEvent{e.idx, e.dir, e.p.opcode, e.p.qpn, e.p.psn, rs.id, false});
}

// ---- Actions: one function per FaultActionKind ---------------------------------------------

void FaultEngine::apply_drop(RuleState&, const FaultAction&, Eval& e) {
  ++ctr_.dropped;
  e.verdict = Verdict::kDrop;
}

void FaultEngine::apply_duplicate(RuleState&, const FaultAction& a, Eval& e) {
  ctr_.duplicated += a.count;
  e.out.copies = uint8_t(a.count);
  e.verdict = Verdict::kDuplicate;
}

void FaultEngine::apply_delay(RuleState&, const FaultAction& a, Eval& e) {
  ++ctr_.delayed;
  e.out.delay_us = uint32_t(a.time_us);
  e.verdict = Verdict::kDelay;
}

// The engine takes the packet (the port sees a drop) and drain() emits it later; without a
// free slot it is delivered unchanged and evaluation stops as a verdict would.
void FaultEngine::apply_reorder(RuleState&, const FaultAction& a, Eval& e) {
  std::span<const uint8_t> bytes = e.roce.first(std::min<size_t>(e.out.len, e.roce.size()));
  if (hold_locked(e.dir, e.src, e.dst, bytes, e.p.qpn, a.count, a.time_us)) {
    ++ctr_.reordered;
    e.verdict = Verdict::kDrop;
  } else {
    ++ctr_.hold_overflow;
    e.verdict = Verdict::kPass;
    e.stop = true;
  }
}

void FaultEngine::apply_corrupt(RuleState& rs, const FaultAction& a, Eval& e) {
  size_t lo = 0, len = 0;
  switch (a.target) {
    case CorruptTarget::kPayload: lo = e.p.payload_off, len = e.p.payload_len; break;
    case CorruptTarget::kIcrc: lo = e.roce.size() - wire::kIcrcBytes, len = wire::kIcrcBytes; break;
    case CorruptTarget::kHeader: lo = 0, len = e.p.hdr_len; break;
  }
  if (len == 0) return;
  flip_bits(e.roce.subspan(lo, len), a, rs.rng);
  ++ctr_.corrupted;
  if (a.fix_icrc) fix_icrc(e.roce, e.src, e.dst);
}

// Where the field is comes from kFaultFields (emu/fault/fault_rules.h) alone.
void FaultEngine::apply_rewrite(RuleState& rs, const FaultAction& a, Eval& e) {
  const FaultFieldInfo& fi = fault_field_info(a.field);
  uint8_t* at = field_header(e.roce, *e.p.v.info, fi.header) + fi.offset;
  const unsigned shift = unsigned(std::countr_zero(fi.mask));
  uint64_t word = load_be(at, fi.width);
  uint64_t v = rewritten_value(a, (word & fi.mask) >> shift, rs.rng);
  word = (word & ~(fi.mask | fi.clear)) | ((v << shift) & fi.mask);
  store_be(at, fi.width, word);
  ++ctr_.rewritten;
  if (a.fix_icrc) fix_icrc(e.roce, e.src, e.dst);
}

void FaultEngine::apply_truncate(RuleState&, const FaultAction& a, Eval& e) {
  e.out.len = std::min<uint32_t>(e.out.len, a.count);
  ++ctr_.truncated;
}

void FaultEngine::apply_nak(RuleState&, const FaultAction& a, Eval& e) {
  if (!inject_nak_locked(a, e)) {
    ++ctr_.inject_unresolved;
    return;
  }
  ++ctr_.injected;
  if (!a.keep) {
    ++ctr_.dropped;
    e.verdict = Verdict::kDrop;
  }
}

void FaultEngine::apply_blackhole(RuleState& rs, const FaultAction& a, Eval& e) {
  rs.bh_active = true;
  rs.bh_until_ns = a.time_us == 0 ? 0 : e.now() + a.time_us * 1000;
  ++ctr_.blackholed;
  ++ctr_.dropped;
  e.verdict = Verdict::kDrop;
}

// Indexed by FaultActionKind.
const FaultEngine::ApplyFn FaultEngine::kApply[] = {
    &FaultEngine::apply_drop,    &FaultEngine::apply_duplicate, &FaultEngine::apply_delay,
    &FaultEngine::apply_reorder, &FaultEngine::apply_corrupt,   &FaultEngine::apply_rewrite,
    &FaultEngine::apply_truncate, &FaultEngine::apply_nak,      &FaultEngine::apply_blackhole,
};

// Runs the rule's actions in order; true if evaluation ends with this rule (a verdict, or a
// hold that could not be made).
bool FaultEngine::apply_actions_locked(RuleState& rs, Eval& e) {
  static_assert(std::size(kApply) == size_t(FaultActionKind::kBlackhole) + 1);
  for (const FaultAction& a : rs.rule.actions) {
    (this->*kApply[size_t(a.kind)])(rs, a, e);
    if (e.stop) return true;
  }
  return e.verdict != Verdict::kPass;
}

// Synthesizes an ACKNOWLEDGE carrying a.syndrome toward the matched packet's sender, ready
// to drain. False if the requester's QPN is unknown or no slot is free.
bool FaultEngine::inject_nak_locked(const FaultAction& a, const Eval& e) {
  const Packet& p = e.p;
  std::optional<uint32_t> qpn;
  if (a.has_qpn) qpn = a.qpn;
  else if (resolver_) qpn = resolver_(e.dir, e.src, e.dst, p.qpn);
  if (!qpn) return false;
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& s = slots_[i];
    if (s.state != Slot::kFree) continue;
    wire::PacketFields f;
    f.opcode = wire::op::kRcAcknowledge;
    f.pkey = p.v.bth().pkey();
    f.dest_qp = *qpn;
    f.psn = a.has_psn ? a.psn : p.psn;
    f.syndrome = a.syndrome;
    f.msn = a.msn;
    // Toward the sender: from the matched packet's destination to its source. A tx match
    // (we are the requester) comes back to us on rx; an rx match goes out on tx.
    size_t len = wire::build_roce(std::span<uint8_t>(s.data, kSlotBytes), f, {},
                                  wire::meta_between(e.dst, e.src));
    if (len == 0) return false;
    s.state = Slot::kReady;
    s.out_dir = e.dir == Direction::kTx ? Direction::kRx : Direction::kTx;
    s.src = e.dst;
    s.dst = e.src;
    s.len = uint32_t(len);
    s.seq = ++slot_seq_;
    live_slots_.fetch_add(1, std::memory_order_release);
    return true;
  }
  ++ctr_.hold_overflow;
  return false;
}

// ---- The filter --------------------------------------------------------------------------

Verdict FaultEngine::on_packet(Direction dir, const Endpoint& src, const Endpoint& dst,
                               std::span<uint8_t> roce, wire::FilterOut& out) {
  if constexpr (!wire::kFaultInjection) {
    (void)dir, (void)src, (void)dst, (void)roce, (void)out;
    return Verdict::kPass;
  } else {
    if (t_emitting) return Verdict::kPass;  // our own drained packet coming back through
    uint64_t idx = pkt_index_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (roce.size() < wire::kBthBytes + wire::kIcrcBytes) return Verdict::kPass;
    uint8_t op = roce[0];
    int d = dir_index(dir);
    // Quick reject: no rule can match this direction and opcode, and nothing is held.
    if (((mask_[d][op >> 6].load(std::memory_order_relaxed) >> (op & 63)) & 1) == 0 &&
        !slow_all_.load(std::memory_order_relaxed))
      return Verdict::kPass;
    std::lock_guard lk(mu_);
    return evaluate_locked(idx, dir, src, dst, roce, out);
  }
}

// Rules are tried in order (semantics in emu/fault/fault.h): the first rule whose actions
// give a verdict ends evaluation; modifying actions let the next rule see the new bytes.
Verdict FaultEngine::evaluate_locked(uint64_t idx, Direction dir, const Endpoint& src,
                                     const Endpoint& dst, std::span<uint8_t> roce,
                                     wire::FilterOut& out) {
  ++ctr_.examined;
  const uint32_t qpn = wire::load_be24(roce.data() + 5);
  if (held_ != 0) count_holds_locked(dir, qpn);
  if (rules_.empty()) return Verdict::kPass;
  Eval e{idx, dir, src, dst, roce, out, {}};
  if (!parse_packet(roce, qpn, &e.p)) return Verdict::kPass;
  e.hmask = e.p.v.info->mask;
  if (e.p.opcode == wire::op::kRcAcknowledge) e.aeth_bit = aeth_type_bit(e.p.v.aeth().syndrome());
  e.dbit = uint8_t(1u << dir_index(dir));
  for (auto& rsp : rules_) {
    RuleState& rs = *rsp;
    if (!static_keys_match(rs.rule, e)) continue;
    ++rs.matched;
    if (blackhole_window_locked(rs, e)) return Verdict::kDrop;
    if (!decide_locked(rs, e)) continue;
    fire_locked(rs, e);
    if (apply_actions_locked(rs, e)) break;
  }
  return e.verdict;
}

// ---- Environment -------------------------------------------------------------------------

std::string FaultEngine::from_values(const char* faults, const char* faults_file,
                                     const char* seed, const char* trace_path,
                                     std::unique_ptr<FaultEngine>* out) {
  out->reset();
  auto set = [](const char* s) { return s != nullptr && s[0] != '\0'; };
  uint64_t sd = kDefaultSeed;
  bool seed_given = set(seed);
  if (seed_given && !parse_fault_u64(seed, &sd))
    return std::string("SOFTRNIC_FAULT_SEED: bad value \"") + seed +
           "\" (want a decimal or 0x-hex 64-bit number)";
  if (!set(faults) && !set(faults_file) && !set(trace_path)) return "";
  std::vector<FaultRule> rules;
  std::optional<uint64_t> plan_seed;
  if (set(faults_file)) {
    std::FILE* f = std::fopen(faults_file, "r");
    if (f == nullptr)
      return std::string("SOFTRNIC_FAULTS_FILE: cannot open \"") + faults_file + "\": " + std::strerror(errno);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    std::fclose(f);
    std::string e = parse_fault_plan(text, std::string("SOFTRNIC_FAULTS_FILE ") + faults_file, &rules, &plan_seed);
    if (!e.empty()) return e;
  }
  if (set(faults)) {
    std::string e = parse_fault_plan(faults, "SOFTRNIC_FAULTS", &rules, &plan_seed);
    if (!e.empty()) return e;
  }
  if (!seed_given && plan_seed) sd = *plan_seed;
  if constexpr (!wire::kFaultInjection) {
    if (set(faults) || set(faults_file))
      return "SOFTRNIC_FAULTS / SOFTRNIC_FAULTS_FILE are set but fault injection is compiled out "
             "of this build (meson -Dfault_injection=true)";
    return "SOFTRNIC_FAULT_TRACE is set but fault injection is compiled out of this build "
           "(meson -Dfault_injection=true)";
  }
  auto eng = std::make_unique<FaultEngine>(sd);
  if (std::string e = eng->add_parsed(std::move(rules)); !e.empty()) return e;
  if (set(trace_path)) {
    std::FILE* tf = std::fopen(trace_path, "a");
    if (tf == nullptr)
      return std::string("SOFTRNIC_FAULT_TRACE: cannot open \"") + trace_path + "\": " + std::strerror(errno);
    std::setvbuf(tf, nullptr, _IOLBF, 0);
    eng->owned_trace_file_ = tf;
    eng->set_trace_file(tf);
  }
  *out = std::move(eng);
  return "";
}

std::string FaultEngine::from_env(std::unique_ptr<FaultEngine>* out) {
  return from_values(std::getenv("SOFTRNIC_FAULTS"), std::getenv("SOFTRNIC_FAULTS_FILE"),
                     std::getenv("SOFTRNIC_FAULT_SEED"), std::getenv("SOFTRNIC_FAULT_TRACE"), out);
}

}  // namespace rnic::emu
