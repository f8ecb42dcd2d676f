// FaultEngine: rule evaluation per packet, the actions, reorder holding and NAK synthesis,
// trace and configuration from the environment. See emu/fault/fault.h for the contract.
#include "emu/fault/fault.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

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

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

int dir_index(Direction d) { return d == Direction::kTx ? 0 : 1; }
const char* dir_name(Direction d) { return d == Direction::kTx ? "tx" : "rx"; }

wire::IpUdpMeta meta_of(const Endpoint& src, const Endpoint& dst) {
  return wire::meta_between(src, dst);
}

// Rewrites the trailing ICRC of a RoCE packet (BTH .. ICRC) for these endpoints, IP ID 0.
void fix_icrc(std::span<uint8_t> roce, const Endpoint& src, const Endpoint& dst) {
  if (roce.size() < wire::kBthBytes + wire::kIcrcBytes) return;
  size_t body = roce.size() - wire::kIcrcBytes;
  uint32_t crc = wire::icrc_compute(meta_of(src, dst), roce.first(body));
  wire::store_le32(roce.data() + body, crc);
}

uint32_t field_bits(FaultField f) {
  switch (f) {
    case FaultField::kOpcode: return 8;
    case FaultField::kSe: case FaultField::kMig: case FaultField::kFecn: case FaultField::kBecn:
    case FaultField::kAckReq: return 1;
    case FaultField::kPad: return 2;
    case FaultField::kTver: return 4;
    case FaultField::kPkey: return 16;
    case FaultField::kQpn: case FaultField::kPsn: case FaultField::kAethMsn:
    case FaultField::kDethSrcQp: return 24;
    case FaultField::kAethSyndrome: return 8;
    case FaultField::kRethVa: case FaultField::kAtomicVa: case FaultField::kAtomicSwap:
    case FaultField::kAtomicCompare: case FaultField::kAtomicAckOrig: case FaultField::kVa:
      return 64;
    default: return 32;
  }
}

}  // namespace

const char* fault_field_name(FaultField f) {
  switch (f) {
    case FaultField::kOpcode: return "bth.opcode";
    case FaultField::kSe: return "bth.se";
    case FaultField::kMig: return "bth.mig";
    case FaultField::kPad: return "bth.pad";
    case FaultField::kTver: return "bth.tver";
    case FaultField::kPkey: return "bth.pkey";
    case FaultField::kFecn: return "bth.fecn";
    case FaultField::kBecn: return "bth.becn";
    case FaultField::kQpn: return "bth.qpn";
    case FaultField::kAckReq: return "bth.ackreq";
    case FaultField::kPsn: return "bth.psn";
    case FaultField::kRethVa: return "reth.va";
    case FaultField::kRethRkey: return "reth.rkey";
    case FaultField::kRethLen: return "reth.len";
    case FaultField::kAethSyndrome: return "aeth.syndrome";
    case FaultField::kAethMsn: return "aeth.msn";
    case FaultField::kAtomicVa: return "atomic.va";
    case FaultField::kAtomicRkey: return "atomic.rkey";
    case FaultField::kAtomicSwap: return "atomic.swap";
    case FaultField::kAtomicCompare: return "atomic.compare";
    case FaultField::kAtomicAckOrig: return "atomicack.orig";
    case FaultField::kDethQkey: return "deth.qkey";
    case FaultField::kDethSrcQp: return "deth.srcqp";
    case FaultField::kImm: return "imm";
    case FaultField::kIethRkey: return "ieth.rkey";
    case FaultField::kRkey: return "rkey";
    case FaultField::kVa: return "va";
  }
  return "?";
}

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
  rs.rng = seed_ ^ fnv1a(rs.rule.label());
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
  for (const auto& rs : rules_) {
    for (int d = 0; d < 2; ++d) {
      if (!(rs->rule.dirs & (1 << d))) continue;
      for (int w = 0; w < 4; ++w) m[d][w] |= rs->rule.opcodes[w];
    }
  }
  for (int d = 0; d < 2; ++d)
    for (int w = 0; w < 4; ++w) mask_[d][w].store(m[d][w], std::memory_order_relaxed);
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

bool FaultEngine::command(std::string_view line, std::string* reply) {
  auto trim_sv = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\n' || v.back() == '\r'))
      v.remove_suffix(1);
    return v;
  };
  line = trim_sv(line);
  size_t sp = line.find_first_of(" \t");
  std::string_view verb = line.substr(0, sp);
  std::string_view arg = sp == std::string_view::npos ? std::string_view() : trim_sv(line.substr(sp));
  if (verb == "add") {
    if (arg.empty()) return *reply = "add: missing rules", false;
    std::vector<uint32_t> ids;
    std::string e = add_rules(arg, "add", &ids);
    if (!e.empty()) return *reply = e, false;
    *reply = "added " + std::to_string(ids.size()) + " rule(s):";
    for (uint32_t id : ids) *reply += " " + std::to_string(id);
    return true;
  }
  if (verb == "list" && arg.empty()) return *reply = list_text(), true;
  if (verb == "remove") {
    uint64_t id = 0;
    if (!parse_fault_u64(arg, &id) || id > UINT32_MAX)
      return *reply = "remove: expected a rule id, got \"" + std::string(arg) + "\"", false;
    if (!remove_rule(uint32_t(id))) return *reply = "remove: no rule " + std::to_string(id), false;
    return *reply = "removed " + std::to_string(id), true;
  }
  if (verb == "clear" && arg.empty()) {
    size_t n = list().size();
    clear();
    return *reply = "cleared " + std::to_string(n) + " rule(s)", true;
  }
  if (verb == "seed") {
    if (!arg.empty()) {
      uint64_t sd = 0;
      if (!parse_fault_u64(arg, &sd)) return *reply = "seed: bad value \"" + std::string(arg) + "\"", false;
      set_seed(sd);
    }
    return *reply = "seed " + std::to_string(seed()), true;
  }
  if (verb == "stats" && arg.empty()) return *reply = counters_text(), true;
  if (verb == "trace" && arg.empty()) return *reply = format_trace(), true;
  *reply = "unknown fault command \"" + std::string(line) +
           "\" (add <rules> | list | remove <id> | clear | seed [<n>] | stats | trace)";
  return false;
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

bool FaultEngine::inject_nak_locked(RuleState& rs, const FaultAction& a, const Packet& p,
                                    Direction dir, const Endpoint& src, const Endpoint& dst) {
  (void)rs;
  std::optional<uint32_t> qpn;
  if (a.has_qpn) qpn = a.qpn;
  else if (resolver_) qpn = resolver_(dir, src, dst, p.qpn);
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
    size_t len = wire::build_roce(std::span<uint8_t>(s.data, kSlotBytes), f, {}, meta_of(dst, src));
    if (len == 0) return false;
    s.state = Slot::kReady;
    s.out_dir = dir == Direction::kTx ? Direction::kRx : Direction::kTx;
    s.src = dst;
    s.dst = src;
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

Verdict FaultEngine::evaluate_locked(uint64_t idx, Direction dir, const Endpoint& src,
                                     const Endpoint& dst, std::span<uint8_t> roce,
                                     wire::FilterOut& out) {
  ++ctr_.examined;
  const uint32_t qpn = wire::load_be24(roce.data() + 5);
  // Reorder holds count the packets that pass after the held one (same direction and QPN).
  if (held_ != 0) {
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
  if (rules_.empty()) return Verdict::kPass;

  Packet p;
  if (wire::parse_roce(roce, &p.v) != wire::ParseError::kOk) return Verdict::kPass;
  p.opcode = p.v.opcode;
  p.qpn = qpn;
  p.psn = p.v.bth().psn();
  p.hdr_len = p.v.hdr_len;
  p.payload_off = size_t(p.v.payload - p.v.hdr);
  p.payload_len = p.v.payload_len;
  const uint32_t hmask = p.v.info->mask;
  uint8_t aeth_bit = kAethAll;
  if (p.opcode == wire::op::kRcAcknowledge) {
    uint8_t syn = p.v.aeth().syndrome();
    aeth_bit = wire::aeth::is_ack(syn) ? kAethAck : wire::aeth::is_rnr_nak(syn) ? kAethRnr
             : wire::aeth::is_nak(syn) ? kAethNak : 0;
  }
  const uint8_t dbit = uint8_t(1u << dir_index(dir));
  uint64_t now_ns = 0;  // read lazily: only blackholes need the clock

  Verdict verdict = Verdict::kPass;
  for (auto& rsp : rules_) {
    RuleState& rs = *rsp;
    const FaultRule& r = rs.rule;
    // Static keys.
    if (!(r.dirs & dbit) || !r.has_opcode(p.opcode)) continue;
    if (p.opcode == wire::op::kRcAcknowledge && !(r.aeth_types & aeth_bit)) continue;
    if (r.qpn && !r.qpn->contains(qpn)) continue;
    if (r.len && !r.len->contains(p.payload_len)) continue;
    if (r.src && !r.src->matches(src)) continue;
    if (r.dst && !r.dst->matches(dst)) continue;
    if ((hmask & r.require_all) != r.require_all) continue;
    if (r.require_any != 0 && !(hmask & r.require_any)) continue;
    if (r.require_payload && p.payload_len == 0) continue;
    ++rs.matched;
    // An open blackhole window swallows everything the static keys match.
    if (rs.bh_active) {
      if (now_ns == 0) now_ns = wire::monotonic_ns();
      if (rs.bh_until_ns == 0 || now_ns < rs.bh_until_ns) {
        ++ctr_.blackholed;
        ++ctr_.dropped;
        FaultTraceEvent ev{idx, dir, p.opcode, qpn, p.psn, rs.id, true};
        record_locked(ev);
        return Verdict::kDrop;
      }
      rs.bh_active = false;
    }
    Flow* flow = r.needs_flows() ? rs.flow(dir, qpn, p.psn) : nullptr;
    uint64_t iter = 1;
    if (r.iter) {
      uint32_t slot = p.psn & 255;
      if (flow->tag[slot] == (p.psn | kTagValid)) {
        iter = ++flow->count[slot];
      } else {
        flow->tag[slot] = p.psn | kTagValid;
        flow->count[slot] = 1;
      }
    }
    if (r.psn) {
      uint32_t v = r.psn_relative ? ((p.psn - flow->base_psn) & wire::kPsnMask) : p.psn;
      if (!r.psn->contains(v)) continue;
    }
    if (r.iter && !r.iter->contains(iter)) continue;
    if (r.pkt && !r.pkt->contains(idx)) continue;
    uint64_t n = ++rs.nth_count;
    if (r.nth && !r.nth->contains(n)) continue;
    if (r.every != 0 && n % r.every != 0) continue;
    if (r.use_prob && splitmix64(rs.rng) >= r.prob_threshold) continue;
    if (rs.fired >= r.max_fires) continue;

    // Fire.
    ++rs.fired;
    ++ctr_.fired;
    record_locked(FaultTraceEvent{idx, dir, p.opcode, qpn, p.psn, rs.id, false});
    for (const FaultAction& a : r.actions) {
      switch (a.kind) {
        case FaultActionKind::kDrop:
          ++ctr_.dropped;
          verdict = Verdict::kDrop;
          break;
        case FaultActionKind::kDuplicate:
          ctr_.duplicated += a.count;
          out.copies = uint8_t(a.count);
          verdict = Verdict::kDuplicate;
          break;
        case FaultActionKind::kDelay:
          ++ctr_.delayed;
          out.delay_us = uint32_t(a.time_us);
          verdict = Verdict::kDelay;
          break;
        case FaultActionKind::kReorder:
          if (hold_locked(dir, src, dst, roce.first(std::min<size_t>(out.len, roce.size())), qpn,
                          a.count, a.time_us)) {
            ++ctr_.reordered;
            verdict = Verdict::kDrop;  // the engine owns it now; drain() emits it later
          } else {
            ++ctr_.hold_overflow;
            verdict = Verdict::kPass;
            goto done;  // could not hold: deliver unchanged, stop like a verdict would
          }
          break;
        case FaultActionKind::kCorrupt: {
          size_t lo = 0, len = 0;
          if (a.target == CorruptTarget::kPayload) lo = p.payload_off, len = p.payload_len;
          else if (a.target == CorruptTarget::kIcrc) lo = roce.size() - wire::kIcrcBytes, len = wire::kIcrcBytes;
          else lo = 0, len = p.hdr_len;
          if (len == 0) break;
          uint64_t picked[64];
          for (uint32_t b = 0; b < a.count; ++b) {
            uint64_t bit;
            if (a.offset >= 0) {
              // Consecutive bits from the given byte (clamped into the target).
              uint64_t base = std::min<uint64_t>(uint64_t(a.offset), len - 1) * 8;
              bit = std::min<uint64_t>(base + b, len * 8 - 1);
              if (b > 0 && bit == picked[b - 1]) break;
            } else {
              // Distinct random bits (re-draw on a repeat so flips never cancel).
              for (;;) {
                bit = splitmix64(rs.rng) % (len * 8);
                if (std::find(picked, picked + b, bit) == picked + b) break;
                if (b >= len * 8) break;
              }
            }
            picked[b] = bit;
            roce[lo + bit / 8] ^= uint8_t(0x80u >> (bit % 8));
          }
          ++ctr_.corrupted;
          if (a.fix_icrc) fix_icrc(roce, src, dst);
          break;
        }
        case FaultActionKind::kRewrite: {
          uint8_t* h = roce.data();
          const wire::OpcodeInfo& info = *p.v.info;
          auto at = [&](wire::HdrType t) { return h + info.offset[t]; };
          FaultField f = a.field;
          if (f == FaultField::kRkey) f = (hmask & wire::kRethMask) ? FaultField::kRethRkey : FaultField::kAtomicRkey;
          if (f == FaultField::kVa) f = (hmask & wire::kRethMask) ? FaultField::kRethVa : FaultField::kAtomicVa;
          wire::Bth bth(h);
          uint64_t old = 0;
          switch (f) {
            case FaultField::kOpcode: old = bth.opcode(); break;
            case FaultField::kSe: old = bth.se(); break;
            case FaultField::kMig: old = bth.mig(); break;
            case FaultField::kPad: old = bth.pad_cnt(); break;
            case FaultField::kTver: old = bth.tver(); break;
            case FaultField::kPkey: old = bth.pkey(); break;
            case FaultField::kFecn: old = bth.fecn(); break;
            case FaultField::kBecn: old = bth.becn(); break;
            case FaultField::kQpn: old = bth.dest_qp(); break;
            case FaultField::kAckReq: old = bth.ack_req(); break;
            case FaultField::kPsn: old = bth.psn(); break;
            case FaultField::kRethVa: old = wire::Reth(at(wire::kHdrReth)).va(); break;
            case FaultField::kRethRkey: old = wire::Reth(at(wire::kHdrReth)).rkey(); break;
            case FaultField::kRethLen: old = wire::Reth(at(wire::kHdrReth)).dma_len(); break;
            case FaultField::kAethSyndrome: old = wire::Aeth(at(wire::kHdrAeth)).syndrome(); break;
            case FaultField::kAethMsn: old = wire::Aeth(at(wire::kHdrAeth)).msn(); break;
            case FaultField::kAtomicVa: old = wire::AtomicEth(at(wire::kHdrAtmEth)).va(); break;
            case FaultField::kAtomicRkey: old = wire::AtomicEth(at(wire::kHdrAtmEth)).rkey(); break;
            case FaultField::kAtomicSwap: old = wire::AtomicEth(at(wire::kHdrAtmEth)).swap_add(); break;
            case FaultField::kAtomicCompare: old = wire::AtomicEth(at(wire::kHdrAtmEth)).compare(); break;
            case FaultField::kAtomicAckOrig: old = wire::AtomicAckEth(at(wire::kHdrAtmAck)).orig(); break;
            case FaultField::kDethQkey: old = wire::Deth(at(wire::kHdrDeth)).qkey(); break;
            case FaultField::kDethSrcQp: old = wire::Deth(at(wire::kHdrDeth)).src_qp(); break;
            case FaultField::kImm: old = wire::ImmDt(at(wire::kHdrImmDt)).imm(); break;
            case FaultField::kIethRkey: old = wire::Ieth(at(wire::kHdrIeth)).inv_rkey(); break;
            default: break;
          }
          uint64_t v = 0;
          switch (a.op) {
            case RewriteOp::kSet: v = a.value; break;
            case RewriteOp::kAdd: v = old + a.value; break;
            case RewriteOp::kSub: v = old - a.value; break;
            case RewriteOp::kXor: v = old ^ a.value; break;
            case RewriteOp::kRandom: v = splitmix64(rs.rng); break;
          }
          uint32_t bits = field_bits(f);
          if (bits < 64) v &= (uint64_t{1} << bits) - 1;
          switch (f) {
            case FaultField::kOpcode: bth.set_opcode(uint8_t(v)); break;
            case FaultField::kSe: bth.set_se(v); break;
            case FaultField::kMig: bth.set_mig(v); break;
            case FaultField::kPad: bth.set_pad_cnt(uint8_t(v)); break;
            case FaultField::kTver: bth.set_tver(uint8_t(v)); break;
            case FaultField::kPkey: bth.set_pkey(uint16_t(v)); break;
            case FaultField::kFecn: bth.set_fecn(v); break;
            case FaultField::kBecn: bth.set_becn(v); break;
            case FaultField::kQpn: bth.set_dest_qp(uint32_t(v)); break;
            case FaultField::kAckReq: bth.set_ack_req(v); break;
            case FaultField::kPsn: bth.set_psn(uint32_t(v)); break;
            case FaultField::kRethVa: wire::Reth(at(wire::kHdrReth)).set_va(v); break;
            case FaultField::kRethRkey: wire::Reth(at(wire::kHdrReth)).set_rkey(uint32_t(v)); break;
            case FaultField::kRethLen: wire::Reth(at(wire::kHdrReth)).set_dma_len(uint32_t(v)); break;
            case FaultField::kAethSyndrome: wire::Aeth(at(wire::kHdrAeth)).set_syndrome(uint8_t(v)); break;
            case FaultField::kAethMsn: wire::Aeth(at(wire::kHdrAeth)).set_msn(uint32_t(v)); break;
            case FaultField::kAtomicVa: wire::AtomicEth(at(wire::kHdrAtmEth)).set_va(v); break;
            case FaultField::kAtomicRkey: wire::AtomicEth(at(wire::kHdrAtmEth)).set_rkey(uint32_t(v)); break;
            case FaultField::kAtomicSwap: wire::AtomicEth(at(wire::kHdrAtmEth)).set_swap_add(v); break;
            case FaultField::kAtomicCompare: wire::AtomicEth(at(wire::kHdrAtmEth)).set_compare(v); break;
            case FaultField::kAtomicAckOrig: wire::AtomicAckEth(at(wire::kHdrAtmAck)).set_orig(v); break;
            case FaultField::kDethQkey: wire::Deth(at(wire::kHdrDeth)).set_qkey(uint32_t(v)); break;
            case FaultField::kDethSrcQp: wire::Deth(at(wire::kHdrDeth)).set_src_qp(uint32_t(v)); break;
            case FaultField::kImm: wire::ImmDt(at(wire::kHdrImmDt)).set_imm(uint32_t(v)); break;
            case FaultField::kIethRkey: wire::Ieth(at(wire::kHdrIeth)).set_inv_rkey(uint32_t(v)); break;
            default: break;
          }
          ++ctr_.rewritten;
          if (a.fix_icrc) fix_icrc(roce, src, dst);
          break;
        }
        case FaultActionKind::kTruncate:
          out.len = std::min<uint32_t>(out.len, a.count);
          ++ctr_.truncated;
          break;
        case FaultActionKind::kNak:
          if (inject_nak_locked(rs, a, p, dir, src, dst)) {
            ++ctr_.injected;
            if (!a.keep) {
              ++ctr_.dropped;
              verdict = Verdict::kDrop;
            }
          } else {
            ++ctr_.inject_unresolved;
          }
          break;
        case FaultActionKind::kBlackhole:
          if (now_ns == 0) now_ns = wire::monotonic_ns();
          rs.bh_active = true;
          rs.bh_until_ns = a.time_us == 0 ? 0 : now_ns + a.time_us * 1000;
          ++ctr_.blackholed;
          ++ctr_.dropped;
          verdict = Verdict::kDrop;
          break;
      }
    }
    if (verdict != Verdict::kPass) break;  // the first rule with a verdict ends evaluation
  }
done:
  return verdict;
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
