// FaultEngine: the seeded, deterministic fault injector that plugs into the port layer as its
// wire::PacketFilter (drop, duplicate, delay, reorder, corrupt, rewrite, truncate, inject
// NAK/RNR NAK, blackhole), with per-rule counters, a replayable trace and env/file loading.
//
// Installing it:
//   std::unique_ptr<FaultEngine> eng;
//   std::string err = FaultEngine::from_env(&eng);       // SOFTRNIC_FAULTS[_FILE], _SEED, _TRACE
//   if (!err.empty()) -> fail device open with err;      // never ignore a bad rule
//   if (eng) eng->attach(port);                           // port.set_filter(eng.get())
//   After every send_batch / recv_batch the device drains what the engine holds or made:
//     eng->drain(Direction::kTx, [&](src, dst, bytes) { send bytes to dst unfiltered... });
//     eng->drain(Direction::kRx, [&](src, dst, bytes) { process as a received datagram });
//   and its progress thread wakes at next_deadline_ns() to drain expired reorder holds.
//   (Drained tx packets may go back through port.send_batch: the engine passes packets it
//   emitted itself straight through, see on_packet.)
//
// Semantics (per packet, under the engine lock once the quick reject has passed):
//   rules are tried in order; a rule fires when all its keys match (see fault_rules.h for the
//   order: static keys, blackhole window, psn, iter, pkt, nth/every, p, max). A rule whose
//   actions only modify the packet (corrupt, rewrite, truncate, nak(..., keep)) lets evaluation
//   continue with the next rule, which sees the modified bytes; the first rule that fires with
//   a verdict (drop, dup, delay, reorder, blackhole, nak/rnr) ends it.
//   Determinism: each rule has its own splitmix64 stream seeded from (seed, rule label), drawn
//   only when the rule's other keys matched, so decisions depend only on the seed and the packet
//   sequence. Time enters only through delay/blackhole durations and reorder's max hold.
//
// Threading: every public method is thread-safe. on_packet() is the hot path: when no rule can
// match the packet's direction and opcode (and nothing is held) it returns after one relaxed
// atomic increment and two loads, without locking or allocating. The matching path takes the
// engine mutex and never allocates (state is preallocated when rules are added).
// Compiled out (meson -Dfault_injection=false): on_packet() returns kPass, attach() and
// add_rules() fail with a message; the parser still works.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "emu/fault/fault_rules.h"
#include "wire/port.h"

namespace rnic::emu {

// Engine-wide counters (sums over rules plus packets seen).
struct FaultCounters {
  uint64_t packets = 0;      // on_packet calls (excluding the engine's own re-emitted packets)
  uint64_t examined = 0;     // packets that passed the quick reject
  uint64_t fired = 0;        // rule firings (one per rule per packet)
  uint64_t dropped = 0;
  uint64_t duplicated = 0;   // extra copies requested
  uint64_t delayed = 0;
  uint64_t reordered = 0;    // packets held for reordering
  uint64_t corrupted = 0;
  uint64_t rewritten = 0;
  uint64_t truncated = 0;
  uint64_t injected = 0;     // NAK / RNR NAK packets synthesized
  uint64_t blackholed = 0;   // packets dropped inside a blackhole window (incl. the trigger)
  uint64_t inject_unresolved = 0;  // nak/rnr could not learn the requester's QPN (passed)
  uint64_t hold_overflow = 0;      // no free slot / packet too big to hold (passed unchanged)
  uint64_t trace_overflow = 0;     // trace events lost because the trace buffer was full
};

// One rule as listed by list().
struct FaultRuleInfo {
  uint32_t id = 0;        // stable id for remove_rule(); assigned 1, 2, ... per engine
  std::string label;      // name, or the rule text if unnamed
  std::string text;
  uint64_t matched = 0;   // packets that passed the rule's static keys
  uint64_t fired = 0;
};

// One firing. Formatted by FaultEngine::format_trace() as
//   "<pkt> <tx|rx> <OPCODE> qpn=<hex> psn=<dec> rule=<label> <actions>"
struct FaultTraceEvent {
  uint64_t pkt = 0;       // engine packet index (1-based)
  wire::Direction dir = wire::Direction::kTx;
  uint8_t opcode = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint32_t rule_id = 0;
  bool blackhole_window = false;  // dropped by an open blackhole window (not a new firing)
};

// Finds the QPN a synthesized NAK must be addressed to (the requester's QP). Called under the
// engine lock with the matched packet's direction, endpoints and BTH destination QPN; must not
// call back into the engine. rx: dest_qpn is a local QP -> return its remote QPN. tx: dest_qpn
// is the remote QP -> return the local QP sending to it.
using FaultQpnResolver = std::function<std::optional<uint32_t>(
    wire::Direction dir, const wire::Endpoint& src, const wire::Endpoint& dst, uint32_t dest_qpn)>;

class FaultEngine final : public wire::PacketFilter, public wire::HeldPacketSource {
 public:
  static constexpr uint64_t kDefaultSeed = 1;
  static constexpr size_t kSlots = 64;          // held + injected packets at once
  static constexpr size_t kSlotBytes = 4352;    // largest packet that can be held (MTU 4096+)
  static constexpr size_t kMaxFlows = 16;       // per rule using psn=+K or iter=

  explicit FaultEngine(uint64_t seed = kDefaultSeed);
  ~FaultEngine() override;
  FaultEngine(const FaultEngine&) = delete;
  FaultEngine& operator=(const FaultEngine&) = delete;

  // ---- Configuration (thread-safe; control path, may allocate) -----------------------
  // Parses a plan (see parse_fault_plan) and appends its rules, all or nothing. A "seed=N"
  // statement in the plan re-seeds the engine (as set_seed). Returns "" or the error.
  // *ids (optional) receives the new rules' ids.
  std::string add_rules(std::string_view plan, std::string_view origin = "rules",
                        std::vector<uint32_t>* ids = nullptr);
  // Appends already-parsed rules.
  std::string add_parsed(std::vector<FaultRule> rules, std::vector<uint32_t>* ids = nullptr);
  std::vector<FaultRuleInfo> list() const;
  // Text form of list(): one line per rule "id matched fired label: text".
  std::string list_text() const;
  bool remove_rule(uint32_t id);
  // Removes every rule; held reorder packets are released to the drain queue.
  void clear();
  // Re-seeds every rule's stream and resets all per-rule state and counters, the packet
  // index and the trace (for replaying the same traffic).
  void set_seed(uint64_t seed);
  uint64_t seed() const;
  FaultCounters counters() const;
  // counters() as "name value" lines (names stable, for `softrnic stats` and logs).
  std::string counters_text() const;

  void set_qpn_resolver(FaultQpnResolver fn);

  // ---- Trace ---------------------------------------------------------------------------
  // Keeps up to max_events firings in memory (preallocated here). 0 turns it off.
  void enable_trace(size_t max_events);
  std::vector<FaultTraceEvent> trace() const;
  // The trace as text, one line per event (identical across runs with the same plan, seed
  // and traffic).
  std::string format_trace() const;
  std::string format_event(const FaultTraceEvent& e) const;
  // Also writes each firing's line to f as it happens (not owned; nullptr stops).
  void set_trace_file(std::FILE* f);

  // ---- Port integration ------------------------------------------------------------
  // port.set_filter(this); false when fault injection is compiled out.
  bool attach(wire::Port& port);
  void detach(wire::Port& port);
  // Emits held packets whose release condition has been met and synthesized packets, for
  // one direction, in order: fn(src, dst, bytes). kTx: send to dst (src is this device's
  // endpoint). kRx: process as if received from src. Also releases reorder holds whose
  // max hold time has passed. Returns the number emitted. fn runs outside the engine lock.
  // Lock-free early out when nothing is pending; the callback is not type-erased on the heap.
  using EmitFn = wire::HeldPacketSource::EmitFn;
  size_t drain(wire::Direction dir, EmitFn fn, void* ctx) override;
  template <typename Fn>
  size_t drain(wire::Direction dir, Fn&& fn) {
    return drain_with(dir, std::forward<Fn>(fn));
  }
  bool maybe_pending() const override { return live_slots_.load(std::memory_order_acquire) != 0; }
  // CLOCK_MONOTONIC ns of the earliest reorder hold deadline, or 0 if none.
  uint64_t next_deadline_ns() const override;
  // Packets waiting in the engine (held or ready to drain).
  size_t pending() const;

  // PacketFilter::wants: a direction no rule can match is not presented (rx-only rules keep
  // the tx path and its GSO runs as without faults), unless a rule counts every packet
  // (pkt=), something is held, or a trace numbers the packets. Lock-free.
  bool wants(wire::Direction dir) const override {
    return want_[dir == wire::Direction::kTx ? 0 : 1].load(std::memory_order_relaxed) ||
           slow_all_.load(std::memory_order_relaxed);
  }

  // PacketFilter: see wire/port.h. Allocation-free.
  wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint& src,
                          const wire::Endpoint& dst, std::span<uint8_t> roce,
                          wire::FilterOut& out) override;

  // ---- Environment ------------------------------------------------------------------
  // Builds an engine from the values of SOFTRNIC_FAULTS (inline plan), SOFTRNIC_FAULTS_FILE
  // (path), SOFTRNIC_FAULT_SEED and SOFTRNIC_FAULT_TRACE (path; trace lines appended).
  // Any may be null. *out = nullptr when neither a plan nor a trace path is given (and no
  // error). A trace path without a plan gives an engine with no rules that traces the rules
  // added later at run time (`softrnic fault add`). An error names the variable, the file
  // and line, the rule and the column.
  static std::string from_values(const char* faults, const char* faults_file, const char* seed,
                                 const char* trace_path, std::unique_ptr<FaultEngine>* out);
  static std::string from_env(std::unique_ptr<FaultEngine>* out);

 private:
  struct RuleState;
  struct Slot;
  struct Packet;
  struct Eval;
  using ApplyFn = void (FaultEngine::*)(RuleState&, const FaultAction&, Eval&);

  void rebuild_masks_locked();
  void reset_rule_locked(RuleState& rs);
  // Per packet under the lock; the steps it runs are defined next to it in fault.cc.
  wire::Verdict evaluate_locked(uint64_t idx, wire::Direction dir, const wire::Endpoint& src,
                                const wire::Endpoint& dst, std::span<uint8_t> roce,
                                wire::FilterOut& out);
  static bool parse_packet(std::span<uint8_t> roce, uint32_t qpn, Packet* p);
  void count_holds_locked(wire::Direction dir, uint32_t qpn);
  static bool static_keys_match(const FaultRule& r, const Eval& e);
  bool blackhole_window_locked(RuleState& rs, Eval& e);
  bool decide_locked(RuleState& rs, Eval& e);
  void fire_locked(RuleState& rs, const Eval& e);
  bool apply_actions_locked(RuleState& rs, Eval& e);
  // One per FaultActionKind, in kApply.
  void apply_drop(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_duplicate(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_delay(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_reorder(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_corrupt(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_rewrite(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_truncate(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_nak(RuleState& rs, const FaultAction& a, Eval& e);
  void apply_blackhole(RuleState& rs, const FaultAction& a, Eval& e);
  static const ApplyFn kApply[];
  bool hold_locked(wire::Direction dir, const wire::Endpoint& src, const wire::Endpoint& dst,
                   std::span<const uint8_t> bytes, uint32_t qpn, uint32_t k, uint64_t max_us);
  bool inject_nak_locked(const FaultAction& a, const Eval& e);
  void record_locked(const FaultTraceEvent& e);
  void release_expired_locked(uint64_t now_ns);

  mutable std::mutex mu_;
  uint64_t seed_;
  uint32_t next_id_ = 1;
  std::vector<std::unique_ptr<RuleState>> rules_;
  std::vector<std::string> labels_;  // by rule id (index id-1), kept after removal for traces
  std::vector<std::string> actions_; // by rule id
  FaultQpnResolver resolver_;
  FaultCounters ctr_;
  std::vector<FaultTraceEvent> trace_;
  size_t trace_cap_ = 0;
  std::FILE* trace_file_ = nullptr;
  std::FILE* owned_trace_file_ = nullptr;
  std::unique_ptr<Slot[]> slots_;
  uint64_t slot_seq_ = 0;
  size_t held_ = 0;  // slots waiting on a reorder condition

  // Quick reject: per direction, the union of the opcodes any rule can match.
  std::atomic<uint64_t> mask_[2][4] = {};
  std::atomic<bool> slow_all_{false};      // something held: every packet must be examined
  std::atomic<bool> want_[2] = {};         // per direction: wants() (rebuild_masks_locked)
  std::atomic<uint32_t> live_slots_{0};    // slots not free (held, ready or draining)
  std::atomic<uint64_t> pkt_index_{0};
};

}  // namespace rnic::emu
