// Parser for the fault-rule language described in emu/fault/fault_rules.h. Every error names the
// rule text and a column; nothing is ignored silently.
#include "emu/fault/fault_rules.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <iterator>

#include "wire/hdr.h"
#include "wire/opcode.h"

namespace rnic::emu {

const char* fault_action_name(FaultActionKind k) {
  switch (k) {
    case FaultActionKind::kDrop: return "drop";
    case FaultActionKind::kDuplicate: return "dup";
    case FaultActionKind::kDelay: return "delay";
    case FaultActionKind::kReorder: return "reorder";
    case FaultActionKind::kCorrupt: return "corrupt";
    case FaultActionKind::kRewrite: return "rewrite";
    case FaultActionKind::kTruncate: return "truncate";
    case FaultActionKind::kNak: return "nak";
    case FaultActionKind::kBlackhole: return "blackhole";
  }
  return "?";
}

bool FaultAction::terminal() const {
  switch (kind) {
    case FaultActionKind::kDrop:
    case FaultActionKind::kReorder:
    case FaultActionKind::kBlackhole:
      return true;
    case FaultActionKind::kNak:
      return !keep;
    default:
      return false;
  }
}

namespace {

// kFaultFields is indexed by FaultField: each row names its own enumerator.
constexpr bool fields_in_enum_order() {
  for (size_t i = 0; i < std::size(kFaultFields); ++i)
    if (size_t(kFaultFields[i].field) != i) return false;
  return std::size(kFaultFields) == size_t(FaultField::kVa) + 1;
}
static_assert(fields_in_enum_order(), "kFaultFields rows must follow the FaultField order");

}  // namespace

const FaultFieldInfo& fault_field_info(FaultField f) { return kFaultFields[size_t(f)]; }

const char* fault_field_name(FaultField f) {
  return size_t(f) < std::size(kFaultFields) ? kFaultFields[size_t(f)].name : "?";
}

const char* fault_field_header_name(FieldHeader h) {
  switch (h) {
    case FieldHeader::kBth: return "BTH";
    case FieldHeader::kReth: return "RETH";
    case FieldHeader::kAeth: return "AETH";
    case FieldHeader::kAtomicEth: return "AtomicETH";
    case FieldHeader::kAtomicAckEth: return "AtomicAckETH";
    case FieldHeader::kDeth: return "DETH";
    case FieldHeader::kImmDt: return "ImmDt";
    case FieldHeader::kIeth: return "IETH";
    case FieldHeader::kRethOrAtomicEth: return "RETH|AtomicETH";
  }
  return "?";
}

const FaultFieldInfo* find_fault_field(std::string_view name) {
  for (const FaultFieldInfo& f : kFaultFields)
    if (name == f.name || (f.alias != nullptr && name == f.alias)) return &f;
  return nullptr;
}

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// A piece of the rule text with its offset in the (trimmed) rule.
struct Piece {
  std::string_view s;
  size_t off = 0;
};

Piece trim(Piece p) {
  while (!p.s.empty() && is_space(p.s.front())) {
    p.s.remove_prefix(1);
    ++p.off;
  }
  while (!p.s.empty() && is_space(p.s.back())) p.s.remove_suffix(1);
  return p;
}

// Splits at top-level commas (not inside parentheses).
std::vector<Piece> split_commas(Piece p) {
  std::vector<Piece> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= p.s.size(); ++i) {
    if (i == p.s.size() || (p.s[i] == ',' && depth == 0)) {
      out.push_back(trim(Piece{p.s.substr(start, i - start), p.off + start}));
      start = i + 1;
    } else if (p.s[i] == '(') {
      ++depth;
    } else if (p.s[i] == ')') {
      --depth;
    }
  }
  return out;
}

std::vector<Piece> split_spaces(Piece p) {
  std::vector<Piece> out;
  size_t i = 0;
  while (i < p.s.size()) {
    while (i < p.s.size() && is_space(p.s[i])) ++i;
    size_t start = i;
    while (i < p.s.size() && !is_space(p.s[i])) ++i;
    if (i > start) out.push_back(Piece{p.s.substr(start, i - start), p.off + start});
  }
  return out;
}

class RuleParser {
 public:
  RuleParser(std::string_view text, FaultRule* out) : text_(text), r_(out) {}

  std::string run();

 private:
  std::string fail(size_t off, const std::string& msg) const {
    return "fault rule \"" + std::string(text_) + "\": column " + std::to_string(off + 1) + ": " +
           msg;
  }
  std::string parse_match(Piece key, Piece val);
  std::string parse_action(Piece a, FaultAction* act);

  // Match keys: the lowercased key, its value.
  using KeyFn = std::string (RuleParser::*)(const std::string& k, Piece val);
  struct MatchKey {
    const char* names[4];
    KeyFn parse;
  };
  static const MatchKey kMatchKeys[];
  std::string parse_key_name(const std::string& k, Piece val);
  std::string parse_key_dir(const std::string& k, Piece val);
  std::string parse_key_qpn(const std::string& k, Piece val);
  std::string parse_key_op(const std::string& k, Piece val);
  std::string parse_key_class(const std::string& k, Piece val);
  std::string parse_key_psn(const std::string& k, Piece val);
  std::string parse_key_counter(const std::string& k, Piece val);
  std::string parse_key_count(const std::string& k, Piece val);
  std::string parse_key_prob(const std::string& k, Piece val);
  std::string parse_key_endpoint(const std::string& k, Piece val);

  // Actions: the lowercased word, the arguments (count checked against the table).
  using ActFn = std::string (RuleParser::*)(const std::string& w, const std::vector<Piece>& args,
                                            FaultAction* act);
  struct ActionSyntax {
    const char* words[3];
    FaultActionKind kind;
    size_t min_args, max_args;
    ActFn parse;
  };
  static const ActionSyntax kActionSyntax[];
  std::string parse_act_drop(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_dup(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_delay(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_reorder(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_corrupt(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_rewrite(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_truncate(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_nak(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_act_blackhole(const std::string& w, const std::vector<Piece>& args, FaultAction* act);
  std::string parse_range(Piece v, U64Range* r, bool allow_open);
  std::string parse_time(Piece v, uint64_t* us, bool allow_inf);
  std::string parse_opcodes(Piece v, std::array<uint64_t, 4>* set);
  std::string parse_classes(Piece v, std::array<uint64_t, 4>* set, uint8_t* aeth);
  std::string parse_endpoint(Piece v, EndpointMatch* m);
  std::string require_for_field(FaultField f);

  std::string_view text_;
  FaultRule* r_;
};

std::string RuleParser::parse_range(Piece v, U64Range* r, bool allow_open) {
  size_t dots = v.s.find("..");
  uint64_t a = 0, b = 0;
  if (dots == std::string_view::npos) {
    if (!parse_fault_u64(v.s, &a)) return fail(v.off, "expected a number, got \"" + std::string(v.s) + "\"");
    *r = U64Range{a, a};
    return "";
  }
  std::string_view lo = v.s.substr(0, dots), hi = v.s.substr(dots + 2);
  if (lo.empty() && hi.empty()) return fail(v.off, "empty range \"..\"");
  if ((lo.empty() || hi.empty()) && !allow_open) return fail(v.off, "range needs both ends");
  if (!lo.empty() && !parse_fault_u64(lo, &a))
    return fail(v.off, "expected a number, got \"" + std::string(lo) + "\"");
  b = UINT64_MAX;
  if (!hi.empty() && !parse_fault_u64(hi, &b))
    return fail(v.off + dots + 2, "expected a number, got \"" + std::string(hi) + "\"");
  if (a > b) return fail(v.off, "empty range: " + std::to_string(a) + " > " + std::to_string(b));
  *r = U64Range{a, b};
  return "";
}

std::string RuleParser::parse_time(Piece v, uint64_t* us, bool allow_inf) {
  std::string s = lower(v.s);
  if (allow_inf && (s == "inf" || s == "forever")) {
    *us = 0;
    return "";
  }
  uint64_t mult = 1;
  std::string_view num = s;
  auto ends = [&](std::string_view suf) {
    return num.size() > suf.size() && num.substr(num.size() - suf.size()) == suf;
  };
  if (ends("us")) {
    num.remove_suffix(2);
  } else if (ends("ms")) {
    num.remove_suffix(2);
    mult = 1000;
  } else if (ends("s")) {
    num.remove_suffix(1);
    mult = 1000000;
  }
  uint64_t n = 0;
  if (!parse_fault_u64(num, &n) || n > UINT64_MAX / mult)
    return fail(v.off, "bad time \"" + std::string(v.s) + "\" (want N, Nus, Nms or Ns)");
  *us = n * mult;
  return "";
}

// Case-insensitive glob with '*'.
bool glob_match(std::string_view pat, std::string_view s) {
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && pat[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pat.size() &&
               std::toupper(static_cast<unsigned char>(pat[p])) ==
                   std::toupper(static_cast<unsigned char>(s[i]))) {
      ++p;
      ++i;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

void set_bit(std::array<uint64_t, 4>* set, unsigned op) { (*set)[op >> 6] |= 1ull << (op & 63); }

std::string RuleParser::parse_opcodes(Piece v, std::array<uint64_t, 4>* set) {
  *set = {0, 0, 0, 0};
  size_t start = 0;
  for (size_t i = 0; i <= v.s.size(); ++i) {
    if (i != v.s.size() && v.s[i] != '|') continue;
    std::string_view pat = v.s.substr(start, i - start);
    size_t off = v.off + start;
    start = i + 1;
    if (pat.empty()) return fail(off, "empty opcode pattern");
    uint64_t num = 0;
    if (std::isdigit(static_cast<unsigned char>(pat[0]))) {
      if (!parse_fault_u64(pat, &num) || num > 255 || !wire::opcode_valid(uint8_t(num)))
        return fail(off, "unknown opcode number \"" + std::string(pat) + "\"");
      set_bit(set, unsigned(num));
      continue;
    }
    bool any = false;
    for (unsigned op = 0; op < 256; ++op) {
      const char* name = wire::opcode_info(uint8_t(op)).name;
      if (name == nullptr) continue;
      std::string_view n(name);
      std::string_view bare = n;
      if (bare.size() > 3 && (bare.substr(0, 3) == "RC_" || bare.substr(0, 3) == "UC_" ||
                              bare.substr(0, 3) == "UD_"))
        bare.remove_prefix(3);
      if (glob_match(pat, n) || glob_match(pat, bare)) {
        set_bit(set, op);
        any = true;
      }
    }
    if (!any) return fail(off, "unknown opcode \"" + std::string(pat) + "\" (matches no opcode)");
  }
  return "";
}

std::string RuleParser::parse_classes(Piece v, std::array<uint64_t, 4>* set, uint8_t* aeth) {
  *set = {0, 0, 0, 0};
  *aeth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= v.s.size(); ++i) {
    if (i != v.s.size() && v.s[i] != '|') continue;
    std::string c = lower(v.s.substr(start, i - start));
    size_t off = v.off + start;
    start = i + 1;
    uint32_t need = 0, need2 = 0;
    int only = -1;
    uint8_t aeth_bits = 0;
    if (c == "send") need = wire::kSendMask;
    else if (c == "write") need = wire::kWriteMask;
    else if (c == "read_req") need = wire::kReadMask, need2 = wire::kReqMask;
    else if (c == "read_resp") need = wire::kAckMask | wire::kPayloadMask;  // ACKs carry no payload
    else if (c == "atomic") need = wire::kAtomicMask, need2 = wire::kReqMask;
    else if (c == "atomic_ack") only = wire::op::kRcAtomicAcknowledge;
    else if (c == "atomic_write") need = wire::kAtomicWriteMask;
    else if (c == "flush") need = wire::kFlushMask;
    else if (c == "ack") only = wire::op::kRcAcknowledge, aeth_bits = kAethAck;
    else if (c == "nak") only = wire::op::kRcAcknowledge, aeth_bits = kAethNak;
    else if (c == "rnr_nak" || c == "rnr") only = wire::op::kRcAcknowledge, aeth_bits = kAethRnr;
    else if (c == "cnp") only = wire::op::kCnp;
    else if (c == "req") need = wire::kReqMask;
    else if (c == "resp") need = wire::kAckMask, aeth_bits = kAethAll;
    else
      return fail(off, "unknown class \"" + c +
                           "\" (send write read_req read_resp atomic atomic_ack atomic_write "
                           "flush ack nak rnr_nak cnp req resp)");
    bool any = false;
    for (unsigned op = 0; op < 256; ++op) {
      const wire::OpcodeInfo& info = wire::opcode_info(uint8_t(op));
      if (info.mask == 0) continue;
      bool hit = only >= 0 ? int(op) == only
                           : ((info.mask & need) == need && (need2 == 0 || (info.mask & need2)));
      if (hit) {
        set_bit(set, op);
        any = true;
      }
    }
    if (!any) return fail(off, "class \"" + c + "\" matches no opcode in the table");
    // ACKNOWLEDGE packets: which AETH types this class admits. Classes that do not name
    // ACKNOWLEDGE leave the bits alone; "resp" admits all of them.
    *aeth |= aeth_bits;
  }
  if (*aeth == 0) *aeth = kAethAll;
  return "";
}

std::string RuleParser::parse_endpoint(Piece v, EndpointMatch* m) {
  std::string_view s = v.s;
  std::string_view ip = s, port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos) return fail(v.off, "missing ']' in \"" + std::string(s) + "\"");
    ip = s.substr(1, close - 1);
    if (close + 1 < s.size()) {
      if (s[close + 1] != ':') return fail(v.off + close + 1, "expected ':PORT' after ']'");
      port = s.substr(close + 2);
    }
  } else if (std::count(s.begin(), s.end(), ':') == 1) {
    size_t c = s.find(':');
    ip = s.substr(0, c);
    port = s.substr(c + 1);
  }
  uint64_t p = 0;
  if (!port.empty() && (!parse_fault_u64(port, &p) || p > 65535))
    return fail(v.off, "bad port in \"" + std::string(s) + "\"");
  auto ep = wire::Endpoint::parse(ip, uint16_t(p));
  if (!ep) return fail(v.off, "bad IP address \"" + std::string(ip) + "\"");
  m->ep = *ep;
  m->any_port = port.empty();
  return "";
}

// ---- Match keys: one parse_key_* per key, found through kMatchKeys ------------------------

std::string RuleParser::parse_key_name(const std::string&, Piece val) {
  r_->name = std::string(val.s);
  return "";
}

std::string RuleParser::parse_key_dir(const std::string&, Piece val) {
  std::string v = lower(val.s);
  if (v == "tx") r_->dirs = 1;
  else if (v == "rx") r_->dirs = 2;
  else if (v == "any") r_->dirs = 3;
  else return fail(val.off, "bad direction \"" + std::string(val.s) + "\" (tx, rx or any)");
  return "";
}

std::string RuleParser::parse_key_qpn(const std::string&, Piece val) {
  U64Range q;
  if (auto e = parse_range(val, &q, false); !e.empty()) return e;
  if (q.hi > 0xffffff) return fail(val.off, "QPN is 24 bits (max 0xffffff)");
  r_->qpn = q;
  return "";
}

std::string RuleParser::parse_key_op(const std::string&, Piece val) {
  std::array<uint64_t, 4> set;
  if (auto e = parse_opcodes(val, &set); !e.empty()) return e;
  for (int i = 0; i < 4; ++i) r_->opcodes[i] &= set[i];
  return "";
}

std::string RuleParser::parse_key_class(const std::string&, Piece val) {
  std::array<uint64_t, 4> set;
  uint8_t aeth = 0;
  if (auto e = parse_classes(val, &set, &aeth); !e.empty()) return e;
  for (int i = 0; i < 4; ++i) r_->opcodes[i] &= set[i];
  r_->aeth_types &= aeth;
  return "";
}

// psn=N | N..M (absolute) or +K | +K..+M (relative; the second '+' optional).
std::string RuleParser::parse_key_psn(const std::string&, Piece val) {
  std::string_view s = val.s;
  const bool rel = s[0] == '+';
  U64Range q;
  if (rel) {
    std::string tmp(s.substr(1));
    size_t dots = tmp.find("..");
    if (dots != std::string::npos && dots + 2 < tmp.size() && tmp[dots + 2] == '+')
      tmp.erase(dots + 2, 1);
    if (!parse_range(Piece{tmp, val.off + 1}, &q, false).empty())
      return fail(val.off, "bad relative PSN \"" + std::string(s) + "\"");
  } else if (auto e = parse_range(val, &q, false); !e.empty()) {
    return e;
  }
  if (q.hi > 0xffffff) return fail(val.off, "PSN is 24 bits (max 0xffffff)");
  r_->psn = q;
  if (rel) r_->psn_relative = true;
  return "";
}

// nth= pkt= iter= len=: ranges, open ends allowed; the counters start at 1.
std::string RuleParser::parse_key_counter(const std::string& k, Piece val) {
  U64Range q;
  if (auto e = parse_range(val, &q, true); !e.empty()) return e;
  if (k != "len" && q.lo == 0) return fail(val.off, k + " counts from 1");
  (k == "nth" ? r_->nth : k == "pkt" ? r_->pkt : k == "iter" ? r_->iter : r_->len) = q;
  return "";
}

// every= and max=: a positive count.
std::string RuleParser::parse_key_count(const std::string& k, Piece val) {
  uint64_t n = 0;
  if (!parse_fault_u64(val.s, &n) || n == 0)
    return fail(val.off, k + "= needs a positive number, got \"" + std::string(val.s) + "\"");
  (k == "every" ? r_->every : r_->max_fires) = n;
  return "";
}

std::string RuleParser::parse_key_prob(const std::string&, Piece val) {
  std::string_view s = val.s;
  bool pct = s.back() == '%';
  if (pct) s.remove_suffix(1);
  double d = -1;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(d))
    return fail(val.off, "bad probability \"" + std::string(val.s) + "\"");
  if (pct) d /= 100.0;
  if (d < 0.0 || d > 1.0)
    return fail(val.off, "probability must be within 0..1 (or 0%..100%), got \"" +
                             std::string(val.s) + "\"");
  r_->prob = d;
  r_->use_prob = d < 1.0;
  // threshold = d * 2^64, computed without overflow (d < 1 here).
  r_->prob_threshold = r_->use_prob ? uint64_t(std::ldexp(d, 64)) : UINT64_MAX;
  return "";
}

std::string RuleParser::parse_key_endpoint(const std::string& k, Piece val) {
  EndpointMatch m;
  if (auto e = parse_endpoint(val, &m); !e.empty()) return e;
  (k == "src" ? r_->src : r_->dst) = m;
  return "";
}

const RuleParser::MatchKey RuleParser::kMatchKeys[] = {
    {{"name"}, &RuleParser::parse_key_name},
    {{"dir"}, &RuleParser::parse_key_dir},
    {{"qpn", "qp"}, &RuleParser::parse_key_qpn},
    {{"op", "opcode"}, &RuleParser::parse_key_op},
    {{"class"}, &RuleParser::parse_key_class},
    {{"psn"}, &RuleParser::parse_key_psn},
    {{"nth", "pkt", "iter", "len"}, &RuleParser::parse_key_counter},
    {{"every", "max"}, &RuleParser::parse_key_count},
    {{"p", "prob"}, &RuleParser::parse_key_prob},
    {{"src", "dst"}, &RuleParser::parse_key_endpoint},
};

std::string RuleParser::parse_match(Piece key, Piece val) {
  std::string k = lower(key.s);
  if (val.s.empty()) return fail(val.off, "missing value after \"" + k + "=\"");
  for (const MatchKey& m : kMatchKeys)
    for (const char* name : m.names)
      if (name != nullptr && k == name) return (this->*m.parse)(k, val);
  return fail(key.off, "unknown match key \"" + std::string(key.s) +
                           "\" (name dir qpn op class psn nth every pkt iter p len src dst max once)");
}

// A rule that rewrites a field matches only packets carrying the field's header.
std::string RuleParser::require_for_field(FaultField f) {
  switch (fault_field_info(f).header) {
    case FieldHeader::kBth: break;
    case FieldHeader::kReth: r_->require_all |= wire::kRethMask; break;
    case FieldHeader::kAeth: r_->require_all |= wire::kAethMask; break;
    case FieldHeader::kAtomicEth: r_->require_all |= wire::kAtmEthMask; break;
    case FieldHeader::kAtomicAckEth: r_->require_all |= wire::kAtmAckMask; break;
    case FieldHeader::kDeth: r_->require_all |= wire::kDethMask; break;
    case FieldHeader::kImmDt: r_->require_all |= wire::kImmMask; break;
    case FieldHeader::kIeth: r_->require_all |= wire::kIethMask; break;
    case FieldHeader::kRethOrAtomicEth: r_->require_any |= wire::kRethMask | wire::kAtmEthMask; break;
  }
  return "";
}

// ---- Actions: one parse_act_* per action, found through kActionSyntax -----------------------
// Each gets the action's lowercased word and its arguments (count already checked).

std::string RuleParser::parse_act_drop(const std::string&, const std::vector<Piece>&, FaultAction*) {
  return "";
}

std::string RuleParser::parse_act_dup(const std::string&, const std::vector<Piece>& args, FaultAction* act) {
  if (args.empty()) return "";
  uint64_t n = 0;
  if (!parse_fault_u64(args[0].s, &n) || n == 0 || n > 255) return fail(args[0].off, "dup count must be 1..255");
  act->count = uint32_t(n);
  return "";
}

std::string RuleParser::parse_act_delay(const std::string&, const std::vector<Piece>& args, FaultAction* act) {
  if (auto e = parse_time(args[0], &act->time_us, false); !e.empty()) return e;
  if (act->time_us == 0 || act->time_us > UINT32_MAX) return fail(args[0].off, "delay must be 1us..4294s");
  return "";
}

// reorder[(K[, max=T])]: default max hold 1 ms.
std::string RuleParser::parse_act_reorder(const std::string&, const std::vector<Piece>& args,
                                          FaultAction* act) {
  act->time_us = 1000;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view s = args[i].s;
    if (lower(s.substr(0, 4)) == "max=") {
      if (auto e = parse_time(Piece{s.substr(4), args[i].off + 4}, &act->time_us, true); !e.empty()) return e;
    } else if (i == 0) {
      uint64_t n = 0;
      if (!parse_fault_u64(s, &n) || n == 0 || n > 1000000)
        return fail(args[i].off, "reorder count must be 1..1000000");
      act->count = uint32_t(n);
    } else {
      return fail(args[i].off, "unknown reorder argument \"" + std::string(s) + "\" (K, max=T)");
    }
  }
  return "";
}

// corrupt(payload|icrc|hdr [, bits=N] [, off=O] [, fix|nofix]).
std::string RuleParser::parse_act_corrupt(const std::string&, const std::vector<Piece>& args,
                                          FaultAction* act) {
  std::string t = lower(args[0].s);
  if (t == "payload") act->target = CorruptTarget::kPayload, r_->require_payload = true;
  else if (t == "icrc") act->target = CorruptTarget::kIcrc;
  else if (t == "hdr" || t == "header") act->target = CorruptTarget::kHeader;
  else return fail(args[0].off, "corrupt target must be payload, icrc or hdr");
  for (size_t i = 1; i < args.size(); ++i) {
    std::string s = lower(args[i].s);
    uint64_t n = 0;
    if (s == "fix") {
      if (act->target == CorruptTarget::kIcrc) return fail(args[i].off, "corrupt(icrc, fix) makes no sense");
      act->fix_icrc = true;
    } else if (s == "nofix") {
      act->fix_icrc = false;
    } else if (s.rfind("bits=", 0) == 0) {
      if (!parse_fault_u64(std::string_view(s).substr(5), &n) || n == 0 || n > 64)
        return fail(args[i].off, "bits must be 1..64");
      act->count = uint32_t(n);
    } else if (s.rfind("off=", 0) == 0 || s.rfind("offset=", 0) == 0) {
      std::string_view v = std::string_view(s).substr(s.find('=') + 1);
      if (!parse_fault_u64(v, &n) || n > 65535) return fail(args[i].off, "offset must be 0..65535");
      act->offset = int32_t(n);
    } else {
      return fail(args[i].off, "unknown corrupt argument \"" + std::string(args[i].s) +
                                   "\" (bits=N, off=N, fix, nofix)");
    }
  }
  return "";
}

// rewrite(FIELD OP VALUE [, fix|nofix]): FIELD from kFaultFields; fixes the ICRC by default.
std::string RuleParser::parse_act_rewrite(const std::string&, const std::vector<Piece>& args,
                                          FaultAction* act) {
  act->fix_icrc = true;
  std::string_view s = args[0].s;
  size_t eq = s.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return fail(args[0].off, "rewrite needs FIELD=V, FIELD+=D, FIELD-=D or FIELD^=M");
  size_t fend = eq;
  act->op = RewriteOp::kSet;
  if (s[eq - 1] == '+' || s[eq - 1] == '-' || s[eq - 1] == '^') {
    act->op = s[eq - 1] == '+' ? RewriteOp::kAdd : s[eq - 1] == '-' ? RewriteOp::kSub : RewriteOp::kXor;
    fend = eq - 1;
  }
  std::string fname = lower(trim(Piece{s.substr(0, fend), 0}).s);
  const FaultFieldInfo* field = find_fault_field(fname);
  if (field == nullptr) return fail(args[0].off, "unknown header field \"" + fname + "\"");
  act->field = field->field;
  Piece v = trim(Piece{s.substr(eq + 1), args[0].off + eq + 1});
  if (lower(v.s) == "random") {
    if (act->op != RewriteOp::kSet) return fail(v.off, "random only with '='");
    act->op = RewriteOp::kRandom;
  } else if (!parse_fault_u64(v.s, &act->value)) {
    return fail(v.off, "bad value \"" + std::string(v.s) + "\"");
  }
  if (args.size() == 2) {
    std::string f = lower(args[1].s);
    if (f == "fix") act->fix_icrc = true;
    else if (f == "nofix") act->fix_icrc = false;
    else return fail(args[1].off, "expected fix or nofix, got \"" + std::string(args[1].s) + "\"");
  }
  return require_for_field(act->field);
}

std::string RuleParser::parse_act_truncate(const std::string&, const std::vector<Piece>& args,
                                           FaultAction* act) {
  uint64_t n = 0;
  if (!parse_fault_u64(args[0].s, &n) || n > 65535) return fail(args[0].off, "truncate needs a byte count");
  act->count = uint32_t(n);
  return "";
}

// nak(CODE, ...) / rnr(TIMER, ...) with optional qpn=, psn=, msn=, keep.
std::string RuleParser::parse_act_nak(const std::string& w, const std::vector<Piece>& args,
                                      FaultAction* act) {
  std::string c = lower(args[0].s);
  uint64_t n = 0;
  bool rnr = w != "nak";
  if (!rnr && (c == "psn_seq" || c == "seq")) n = wire::aeth::kNakPsnSeqError;
  else if (!rnr && c == "inv_req") n = wire::aeth::kNakInvalidRequest;
  else if (!rnr && c == "rem_access") n = wire::aeth::kNakRemoteAccessError;
  else if (!rnr && c == "rem_op") n = wire::aeth::kNakRemoteOperationalError;
  else if (!rnr && c == "inv_rd") n = wire::aeth::kNakInvalidRdRequest;
  else if (!parse_fault_u64(c, &n) || n > 31)
    return fail(args[0].off, rnr ? "rnr timer must be 0..31"
                                 : "nak code must be psn_seq, inv_req, rem_access, rem_op, inv_rd or 0..31");
  act->syndrome = rnr ? wire::aeth::rnr_nak(uint8_t(n)) : wire::aeth::nak(uint8_t(n));
  for (size_t i = 1; i < args.size(); ++i) {
    std::string s = lower(args[i].s);
    uint64_t v = 0;
    auto num_after = [&](size_t skip) { return parse_fault_u64(std::string_view(s).substr(skip), &v); };
    if (s == "keep") {
      act->keep = true;
    } else if (s.rfind("qpn=", 0) == 0) {
      if (!num_after(4) || v > 0xffffff) return fail(args[i].off, "bad qpn");
      act->has_qpn = true;
      act->qpn = uint32_t(v);
    } else if (s.rfind("psn=", 0) == 0) {
      if (!num_after(4) || v > 0xffffff) return fail(args[i].off, "bad psn");
      act->has_psn = true;
      act->psn = uint32_t(v);
    } else if (s.rfind("msn=", 0) == 0) {
      if (!num_after(4) || v > 0xffffff) return fail(args[i].off, "bad msn");
      act->msn = uint32_t(v);
    } else {
      return fail(args[i].off, "unknown " + w + " argument \"" + std::string(args[i].s) +
                                   "\" (qpn=N, psn=N, msn=N, keep)");
    }
  }
  return "";
}

std::string RuleParser::parse_act_blackhole(const std::string&, const std::vector<Piece>& args,
                                            FaultAction* act) {
  return args.empty() ? "" : parse_time(args[0], &act->time_us, true);
}

const RuleParser::ActionSyntax RuleParser::kActionSyntax[] = {
    {{"drop"}, FaultActionKind::kDrop, 0, 0, &RuleParser::parse_act_drop},
    {{"dup", "duplicate"}, FaultActionKind::kDuplicate, 0, 1, &RuleParser::parse_act_dup},
    {{"delay"}, FaultActionKind::kDelay, 1, 1, &RuleParser::parse_act_delay},
    {{"reorder"}, FaultActionKind::kReorder, 0, 2, &RuleParser::parse_act_reorder},
    {{"corrupt"}, FaultActionKind::kCorrupt, 1, 4, &RuleParser::parse_act_corrupt},
    {{"rewrite", "set"}, FaultActionKind::kRewrite, 1, 2, &RuleParser::parse_act_rewrite},
    {{"truncate"}, FaultActionKind::kTruncate, 1, 1, &RuleParser::parse_act_truncate},
    {{"nak", "rnr", "rnr_nak"}, FaultActionKind::kNak, 1, 5, &RuleParser::parse_act_nak},
    {{"blackhole"}, FaultActionKind::kBlackhole, 0, 1, &RuleParser::parse_act_blackhole},
};

// One action: WORD or WORD(ARG, ...).
std::string RuleParser::parse_action(Piece a, FaultAction* act) {
  act->text = std::string(a.s);
  size_t paren = a.s.find('(');
  Piece word = trim(Piece{a.s.substr(0, paren), a.off});
  std::vector<Piece> args;
  if (paren != std::string_view::npos) {
    if (a.s.back() != ')') return fail(a.off + a.s.size() - 1, "missing ')' in \"" + std::string(a.s) + "\"");
    Piece inner{a.s.substr(paren + 1, a.s.size() - paren - 2), a.off + paren + 1};
    if (!trim(inner).s.empty()) args = split_commas(inner);
    for (const Piece& p : args)
      if (p.s.empty()) return fail(p.off, "empty argument");
  }
  const std::string w = lower(word.s);
  for (const ActionSyntax& syn : kActionSyntax) {
    if (std::find_if(std::begin(syn.words), std::end(syn.words), [&](const char* n) {
          return n != nullptr && w == n;
        }) == std::end(syn.words))
      continue;
    act->kind = syn.kind;
    if (args.size() < syn.min_args || args.size() > syn.max_args) {
      std::string range = syn.min_args == syn.max_args
                              ? std::to_string(syn.min_args)
                              : std::to_string(syn.min_args) + ".." + std::to_string(syn.max_args);
      return fail(a.off, w + " takes " + range + " argument(s), got " + std::to_string(args.size()));
    }
    return (this->*syn.parse)(w, args, act);
  }
  return fail(word.off, "unknown action \"" + std::string(word.s) +
                            "\" (drop dup delay reorder corrupt rewrite truncate nak rnr blackhole)");
}

std::string RuleParser::run() {
  Piece all = trim(Piece{text_, 0});
  text_ = all.s;
  all.off = 0;
  if (text_.empty()) return "fault rule \"\": empty rule";
  size_t arrow = text_.find("=>");
  if (arrow == std::string_view::npos)
    return fail(text_.size() - 1, "missing \"=>\" between match keys and actions");
  FaultRule& r = *r_;
  r.text = std::string(text_);
  std::vector<Piece> toks = split_spaces(Piece{text_.substr(0, arrow), 0});
  size_t i = 0;
  if (!toks.empty() && lower(toks[0].s) == "rule") {
    if (toks.size() < 2 || toks[1].s.find('=') != std::string_view::npos)
      return fail(toks[0].off, "\"rule\" must be followed by a name");
    r.name = std::string(toks[1].s);
    i = 2;
  }
  for (; i < toks.size(); ++i) {
    const Piece& t = toks[i];
    if (lower(t.s) == "once") {
      r.max_fires = 1;
      continue;
    }
    size_t eq = t.s.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return fail(t.off, "expected KEY=VALUE, got \"" + std::string(t.s) + "\"");
    if (auto e = parse_match(Piece{t.s.substr(0, eq), t.off}, Piece{t.s.substr(eq + 1), t.off + eq + 1});
        !e.empty())
      return e;
  }
  Piece acts = trim(Piece{text_.substr(arrow + 2), arrow + 2});
  if (acts.s.empty()) return fail(arrow, "no action after \"=>\"");
  bool terminal = false, dup = false, delay = false;
  size_t terminal_off = 0;
  for (const Piece& p : split_commas(acts)) {
    if (p.s.empty()) return fail(p.off, "empty action");
    if (terminal)
      return fail(p.off, "action \"" + std::string(p.s) + "\" after terminal action at column " +
                             std::to_string(terminal_off + 1) + " would never run");
    FaultAction act;
    if (auto e = parse_action(p, &act); !e.empty()) return e;
    if (act.kind == FaultActionKind::kDuplicate) {
      if (dup) return fail(p.off, "more than one dup in a rule");
      dup = true;
    }
    if (act.kind == FaultActionKind::kDelay) {
      if (delay) return fail(p.off, "more than one delay in a rule");
      delay = true;
    }
    if (dup && delay) return fail(p.off, "dup and delay cannot be combined (the port applies one verdict)");
    if (act.terminal()) {
      if (dup || delay)
        return fail(p.off, "terminal action \"" + std::string(p.s) + "\" cannot follow dup or delay");
      terminal = true;
      terminal_off = p.off;
    }
    if (!r.actions_text.empty()) r.actions_text += ",";
    r.actions_text += act.text;
    r.actions.push_back(std::move(act));
  }
  bool any_op = false;
  for (uint64_t w : r.opcodes) any_op |= w != 0;
  if (!any_op) return fail(0, "op= and class= together match no opcode");
  return "";
}

}  // namespace

bool parse_fault_u64(std::string_view s, uint64_t* v) {
  if (s.empty()) return false;
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string parse_fault_rule(std::string_view text, FaultRule* out) {
  FaultRule r;
  std::string e = RuleParser(text, &r).run();
  if (e.empty()) *out = std::move(r);
  return e;
}

std::string parse_fault_plan(std::string_view text, std::string_view origin,
                             std::vector<FaultRule>* out, std::optional<uint64_t>* seed) {
  std::vector<FaultRule> rules;
  std::optional<uint64_t> new_seed;
  bool multiline = text.find('\n') != std::string_view::npos;
  size_t line = 1, rule_no = 0;
  size_t i = 0;
  while (i <= text.size()) {
    // One statement: up to ';', newline or end; '#' comments run to the end of the line.
    size_t end = i;
    while (end < text.size() && text[end] != ';' && text[end] != '\n' && text[end] != '#') ++end;
    std::string_view stmt = text.substr(i, end - i);
    size_t stmt_line = line;
    if (end < text.size() && text[end] == '#') {
      while (end < text.size() && text[end] != '\n') ++end;
    }
    if (end < text.size() && text[end] == '\n') ++line;
    i = end + 1;
    Piece p = trim(Piece{stmt, 0});
    if (p.s.empty()) continue;
    std::string where = std::string(origin);
    if (multiline) where += ":" + std::to_string(stmt_line);
    std::string low = lower(p.s);
    if (low.rfind("seed", 0) == 0 && p.s.find("=>") == std::string_view::npos &&
        (low.size() == 4 || low[4] == '=' || is_space(low[4]))) {
      std::string_view v = trim(Piece{p.s.substr(4), 0}).s;
      if (!v.empty() && v[0] == '=') v = trim(Piece{v.substr(1), 0}).s;
      uint64_t sd = 0;
      if (!parse_fault_u64(v, &sd)) return where + ": bad seed statement \"" + std::string(p.s) + "\"";
      new_seed = sd;
      continue;
    }
    ++rule_no;
    FaultRule r;
    std::string e = parse_fault_rule(p.s, &r);
    if (!e.empty()) return where + ": rule " + std::to_string(rule_no) + ": " + e;
    rules.push_back(std::move(r));
  }
  for (FaultRule& r : rules) out->push_back(std::move(r));
  if (seed != nullptr && new_seed) *seed = new_seed;
  return "";
}

}  // namespace rnic::emu
