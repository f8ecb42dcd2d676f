// Tests for the fault-rule parser (emu/fault/fault_rules.h): good rules parse into the expected
// fields; each malformed rule yields an error naming the rule text and the column; the field
// lists in fault_rules.h's grammar and in the README equal the kFaultFields table.
#include "emu/fault/fault_rules.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <tuple>

#include "wire/hdr.h"
#include "wire/opcode.h"

namespace rnic::emu {
namespace {

FaultRule parse_ok(std::string_view text) {
  FaultRule r;
  std::string e = parse_fault_rule(text, &r);
  EXPECT_EQ(e, "") << text;
  return r;
}

std::string parse_err(std::string_view text) {
  FaultRule r;
  return parse_fault_rule(text, &r);
}

std::vector<unsigned> opcodes_of(const FaultRule& r) {
  std::vector<unsigned> v;
  for (unsigned op = 0; op < 256; ++op)
    if (r.has_opcode(uint8_t(op))) v.push_back(op);
  return v;
}

TEST(FaultRulesTest, MinimalRuleMatchesEverything) {
  FaultRule r = parse_ok("=> drop");
  EXPECT_EQ(r.dirs, 3);
  EXPECT_EQ(opcodes_of(r).size(), 256u);
  ASSERT_EQ(r.actions.size(), 1u);
  EXPECT_EQ(r.actions[0].kind, FaultActionKind::kDrop);
  EXPECT_TRUE(r.actions[0].terminal());
  EXPECT_EQ(r.label(), "=> drop");
}

TEST(FaultRulesTest, OpcodeGlobMatchesRcAndUcWrites) {
  FaultRule r = parse_ok("dir=tx op=RDMA_WRITE_* nth=1 => drop");
  EXPECT_EQ(r.dirs, 1);
  std::vector<unsigned> want = {0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b};
  EXPECT_EQ(opcodes_of(r), want);
  ASSERT_TRUE(r.nth.has_value());
  EXPECT_EQ(r.nth->lo, 1u);
  EXPECT_EQ(r.nth->hi, 1u);
}

TEST(FaultRulesTest, OpcodeAlternativesNumbersAndFullNames) {
  FaultRule r = parse_ok("op=rc_send_only|0x0a|UD_SEND_* => drop");
  std::vector<unsigned> want = {0x04, 0x0a, 0x64, 0x65};
  EXPECT_EQ(opcodes_of(r), want);
}

TEST(FaultRulesTest, ClassesSelectOpcodesAndAethTypes) {
  FaultRule r = parse_ok("class=nak|rnr_nak => drop");
  EXPECT_EQ(opcodes_of(r), std::vector<unsigned>{wire::op::kRcAcknowledge});
  EXPECT_EQ(r.aeth_types, kAethNak | kAethRnr);

  // Classes span transports: RC's opcodes and XRC's (0xA0 | the RC opcode).
  FaultRule rr = parse_ok("class=read_resp => drop");
  EXPECT_EQ(opcodes_of(rr), (std::vector<unsigned>{0x0d, 0x0e, 0x0f, 0x10, 0xad, 0xae, 0xaf, 0xb0}));

  FaultRule a = parse_ok("class=atomic => drop");
  EXPECT_EQ(opcodes_of(a), (std::vector<unsigned>{0x13, 0x14, 0xb3, 0xb4}));

  FaultRule resp = parse_ok("class=resp => drop");
  EXPECT_TRUE(resp.has_opcode(wire::op::kRcAcknowledge));
  EXPECT_TRUE(resp.has_opcode(wire::op::kRcAtomicAcknowledge));
  EXPECT_TRUE(resp.has_opcode(wire::op::kRcRdmaReadResponseOnly));
  EXPECT_FALSE(resp.has_opcode(wire::op::kRcRdmaReadRequest));
  EXPECT_EQ(resp.aeth_types, kAethAll);

  // op and class intersect.
  FaultRule both = parse_ok("op=RC_* class=send => drop");
  for (unsigned op : opcodes_of(both)) EXPECT_LT(op, 0x20u);
  EXPECT_TRUE(both.has_opcode(wire::op::kRcSendOnly));
  EXPECT_FALSE(both.has_opcode(wire::op::kUcSendOnly));
}

TEST(FaultRulesTest, AllMatchKeys) {
  FaultRule r = parse_ok(
      "rule lose-retx dir=rx qpn=0x11..0x20 psn=+4 iter=2 pkt=5.. nth=2..3 every=2 p=1% "
      "len=..100 src=127.0.0.2 dst=127.0.0.3:4791 max=3 => drop");
  EXPECT_EQ(r.name, "lose-retx");
  EXPECT_EQ(r.label(), "lose-retx");
  EXPECT_EQ(r.dirs, 2);
  EXPECT_EQ(r.qpn->lo, 0x11u);
  EXPECT_EQ(r.qpn->hi, 0x20u);
  EXPECT_TRUE(r.psn_relative);
  EXPECT_EQ(r.psn->lo, 4u);
  EXPECT_EQ(r.psn->hi, 4u);
  EXPECT_EQ(r.iter->lo, 2u);
  EXPECT_EQ(r.pkt->lo, 5u);
  EXPECT_EQ(r.pkt->hi, UINT64_MAX);
  EXPECT_EQ(r.nth->lo, 2u);
  EXPECT_EQ(r.nth->hi, 3u);
  EXPECT_EQ(r.every, 2u);
  EXPECT_TRUE(r.use_prob);
  EXPECT_DOUBLE_EQ(r.prob, 0.01);
  EXPECT_EQ(r.len->lo, 0u);
  EXPECT_EQ(r.len->hi, 100u);
  EXPECT_TRUE(r.src->any_port);
  EXPECT_FALSE(r.dst->any_port);
  EXPECT_EQ(r.dst->ep.port, 4791);
  EXPECT_EQ(r.max_fires, 3u);
  EXPECT_TRUE(r.needs_flows());

  FaultRule o = parse_ok("name=x psn=10..20 once p=0.25 => drop");
  EXPECT_EQ(o.name, "x");
  EXPECT_FALSE(o.psn_relative);
  EXPECT_EQ(o.psn->lo, 10u);
  EXPECT_EQ(o.psn->hi, 20u);
  EXPECT_EQ(o.max_fires, 1u);
  EXPECT_EQ(o.prob_threshold, uint64_t{1} << 62);
  EXPECT_FALSE(o.needs_flows());
}

TEST(FaultRulesTest, Actions) {
  FaultRule r = parse_ok("=> dup(3)");
  EXPECT_EQ(r.actions[0].kind, FaultActionKind::kDuplicate);
  EXPECT_EQ(r.actions[0].count, 3u);
  EXPECT_EQ(parse_ok("=> duplicate").actions[0].count, 1u);
  EXPECT_EQ(parse_ok("=> delay(2ms)").actions[0].time_us, 2000u);
  EXPECT_EQ(parse_ok("=> delay(70)").actions[0].time_us, 70u);

  FaultAction ro = parse_ok("=> reorder(2, max=0)").actions[0];
  EXPECT_EQ(ro.kind, FaultActionKind::kReorder);
  EXPECT_EQ(ro.count, 2u);
  EXPECT_EQ(ro.time_us, 0u);
  EXPECT_EQ(parse_ok("=> reorder").actions[0].time_us, 1000u);

  FaultRule c = parse_ok("=> corrupt(payload, bits=3, off=2, fix)");
  EXPECT_EQ(c.actions[0].target, CorruptTarget::kPayload);
  EXPECT_EQ(c.actions[0].count, 3u);
  EXPECT_EQ(c.actions[0].offset, 2);
  EXPECT_TRUE(c.actions[0].fix_icrc);
  EXPECT_TRUE(c.require_payload);
  EXPECT_FALSE(parse_ok("=> corrupt(icrc)").actions[0].fix_icrc);

  FaultRule w = parse_ok("=> rewrite(rkey+=1)");
  EXPECT_EQ(w.actions[0].field, FaultField::kRkey);
  EXPECT_EQ(w.actions[0].op, RewriteOp::kAdd);
  EXPECT_EQ(w.actions[0].value, 1u);
  EXPECT_TRUE(w.actions[0].fix_icrc);
  EXPECT_EQ(w.require_any, wire::kRethMask | wire::kAtmEthMask);

  FaultRule w2 = parse_ok("=> rewrite(reth.rkey=0x1234, nofix), rewrite(psn=random), set(qpn^=1)");
  EXPECT_EQ(w2.actions[0].field, FaultField::kRethRkey);
  EXPECT_EQ(w2.actions[0].value, 0x1234u);
  EXPECT_FALSE(w2.actions[0].fix_icrc);
  EXPECT_EQ(w2.actions[1].op, RewriteOp::kRandom);
  EXPECT_EQ(w2.actions[2].op, RewriteOp::kXor);
  EXPECT_EQ(w2.require_all, wire::kRethMask);
  EXPECT_EQ(w2.actions_text, "rewrite(reth.rkey=0x1234, nofix),rewrite(psn=random),set(qpn^=1)");

  FaultAction n = parse_ok("=> nak(rem_access, qpn=0x12, msn=3)").actions[0];
  EXPECT_EQ(n.syndrome, 0x62);
  EXPECT_TRUE(n.has_qpn);
  EXPECT_EQ(n.qpn, 0x12u);
  EXPECT_EQ(n.msn, 3u);
  EXPECT_TRUE(n.terminal());
  FaultAction rnr = parse_ok("=> rnr(14, keep)").actions[0];
  EXPECT_EQ(rnr.syndrome, 0x2e);
  EXPECT_FALSE(rnr.terminal());

  EXPECT_EQ(parse_ok("=> blackhole(5ms)").actions[0].time_us, 5000u);
  EXPECT_EQ(parse_ok("=> blackhole").actions[0].time_us, 0u);
  EXPECT_EQ(parse_ok("=> truncate(20)").actions[0].count, 20u);
  // Modifiers compose with a verdict.
  EXPECT_EQ(parse_ok("=> corrupt(hdr), rewrite(psn+=1), dup").actions.size(), 3u);
}

// One test per malformed-rule kind, asserting the whole message.
TEST(FaultRulesTest, BadDirection) {
  EXPECT_EQ(parse_err("dir=up => drop"),
            "fault rule \"dir=up => drop\": column 5: bad direction \"up\" (tx, rx or any)");
}

TEST(FaultRulesTest, UnknownOpcode) {
  EXPECT_EQ(parse_err("op=RDMA_WRIT => drop"),
            "fault rule \"op=RDMA_WRIT => drop\": column 4: unknown opcode \"RDMA_WRIT\" "
            "(matches no opcode)");
  EXPECT_EQ(parse_err("op=SEND_ONLY|0x15 => drop"),
            "fault rule \"op=SEND_ONLY|0x15 => drop\": column 14: unknown opcode number \"0x15\"");
}

TEST(FaultRulesTest, MissingArrow) {
  EXPECT_EQ(parse_err("  dir=tx drop  "),
            "fault rule \"dir=tx drop\": column 11: missing \"=>\" between match keys and actions");
}

TEST(FaultRulesTest, BadProbability) {
  EXPECT_EQ(parse_err("p=1.5 => drop"),
            "fault rule \"p=1.5 => drop\": column 3: probability must be within 0..1 (or "
            "0%..100%), got \"1.5\"");
  EXPECT_EQ(parse_err("p=abc => drop"),
            "fault rule \"p=abc => drop\": column 3: bad probability \"abc\"");
}

TEST(FaultRulesTest, UnknownAction) {
  EXPECT_EQ(parse_err("=> explode"),
            "fault rule \"=> explode\": column 4: unknown action \"explode\" (drop dup delay "
            "reorder corrupt rewrite truncate nak rnr blackhole)");
}

TEST(FaultRulesTest, ActionAfterTerminal) {
  EXPECT_EQ(parse_err("=> drop, dup"),
            "fault rule \"=> drop, dup\": column 10: action \"dup\" after terminal action at "
            "column 4 would never run");
}

TEST(FaultRulesTest, DupWithDelay) {
  EXPECT_EQ(parse_err("=> dup, delay(5)"),
            "fault rule \"=> dup, delay(5)\": column 9: dup and delay cannot be combined (the "
            "port applies one verdict)");
}

// ---- The rewritable-field table and the lists written for humans -----------------------

std::string slurp(const std::string& rel) {
  std::ifstream in(std::string(SOFTRNIC_SOURCE_ROOT) + "/" + rel);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using FieldRow = std::tuple<std::string, std::string, std::string>;  // header, name, alias

std::vector<FieldRow> table_rows(bool with_alias) {
  std::vector<FieldRow> v;
  for (const FaultFieldInfo& f : kFaultFields)
    v.emplace_back(fault_field_header_name(f.header), f.name,
                   with_alias && f.alias != nullptr ? f.alias : "");
  return v;
}

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  std::istringstream in{std::string(s)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(FaultFieldTable, EveryNameAndAliasParsesToItsRow) {
  for (const FaultFieldInfo& f : kFaultFields) {
    EXPECT_STREQ(fault_field_name(f.field), f.name);
    EXPECT_EQ(&fault_field_info(f.field), &f);
    EXPECT_GE(f.width, 1u);
    EXPECT_LE(f.width, 8u);
    EXPECT_NE(f.mask, 0u);
    if (f.width < 8) {
      EXPECT_EQ(f.mask >> (8 * f.width), 0u) << f.name;  // the mask fits its word
    }
    EXPECT_EQ(f.mask & f.clear, 0u) << f.name;
    for (const char* n : {f.name, f.alias}) {
      if (n == nullptr) continue;
      FaultRule r = parse_ok(std::string("=> rewrite(") + n + "=1)");
      ASSERT_EQ(r.actions.size(), 1u);
      EXPECT_EQ(r.actions[0].field, f.field) << n;
      EXPECT_EQ(find_fault_field(n), &f);
    }
  }
  EXPECT_EQ(find_fault_field("bth.nothing"), nullptr);
}

// fault_rules.h's grammar comment lists FIELD as "HEADER: NAME [ALIAS] ..." lines.
TEST(FaultFieldTable, GrammarCommentListsExactlyTheTable) {
  std::string h = slurp("emu/fault/fault_rules.h");
  ASSERT_FALSE(h.empty()) << "cannot read emu/fault/fault_rules.h";
  size_t from = h.find("this list equals it):");
  size_t to = h.find("(RETH's if the packet has one", from);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  from = h.find('\n', from) + 1;
  std::vector<FieldRow> doc;
  std::string header;
  std::istringstream lines(h.substr(from, to - from));
  for (std::string line; std::getline(lines, line);) {
    ASSERT_EQ(line.rfind("//", 0), 0u) << line;
    for (const std::string& w : words(std::string_view(line).substr(2))) {
      if (w.back() == ':') header = w.substr(0, w.size() - 1);
      else if (w.front() == '[' && w.back() == ']' && !doc.empty()) std::get<2>(doc.back()) = w.substr(1, w.size() - 2);
      else doc.emplace_back(header, w, "");
    }
  }
  EXPECT_EQ(doc, table_rows(true));
}

// The README's "Fault rules" paragraph lists FIELD as "HEADER `name` ...;" groups.
TEST(FaultFieldTable, ReadmeListsExactlyTheTable) {
  std::string md = slurp("README.md");
  ASSERT_FALSE(md.empty()) << "cannot read README.md";
  size_t from = md.find("checks this list against it):");
  size_t to = md.find("(the RETH's if the packet has one)", from);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  from = md.find('\n', from) + 1;
  std::vector<FieldRow> doc;
  std::string text = md.substr(from, to - from);
  for (char& c : text)
    if (c == ';') c = ' ';
  std::string header;
  for (const std::string& w : words(text)) {
    if (w.size() > 2 && w.front() == '`' && w.back() == '`') doc.emplace_back(header, w.substr(1, w.size() - 2), "");
    else header = w;
  }
  EXPECT_EQ(doc, table_rows(false));
}

TEST(FaultRulesTest, UnknownField) {
  EXPECT_EQ(parse_err("=> rewrite(foo=1)"),
            "fault rule \"=> rewrite(foo=1)\": column 12: unknown header field \"foo\"");
}

TEST(FaultRulesTest, CountersStartAtOne) {
  EXPECT_EQ(parse_err("nth=0 => drop"), "fault rule \"nth=0 => drop\": column 5: nth counts from 1");
}

TEST(FaultRulesTest, EmptyRange) {
  EXPECT_EQ(parse_err("psn=20..10 => drop"),
            "fault rule \"psn=20..10 => drop\": column 5: empty range: 20 > 10");
}

TEST(FaultRulesTest, UnknownKey) {
  EXPECT_EQ(parse_err("dir=tx frob=1 => drop"),
            "fault rule \"dir=tx frob=1 => drop\": column 8: unknown match key \"frob\" (name "
            "dir qpn op class psn nth every pkt iter p len src dst max once)");
}

TEST(FaultRulesTest, QpnTooWide) {
  EXPECT_EQ(parse_err("qpn=0x1000000 => drop"),
            "fault rule \"qpn=0x1000000 => drop\": column 5: QPN is 24 bits (max 0xffffff)");
}

TEST(FaultRulesTest, BadNakCode) {
  EXPECT_EQ(parse_err("=> nak(bogus)"),
            "fault rule \"=> nak(bogus)\": column 8: nak code must be psn_seq, inv_req, "
            "rem_access, rem_op, inv_rd or 0..31");
}

TEST(FaultRulesTest, CorruptIcrcWithFix) {
  EXPECT_EQ(parse_err("=> corrupt(icrc, fix)"),
            "fault rule \"=> corrupt(icrc, fix)\": column 18: corrupt(icrc, fix) makes no sense");
}

TEST(FaultRulesTest, BadTime) {
  EXPECT_EQ(parse_err("=> delay(5 parsecs)"),
            "fault rule \"=> delay(5 parsecs)\": column 10: bad time \"5 parsecs\" (want N, Nus, "
            "Nms or Ns)");
}

TEST(FaultRulesTest, ArgumentCount) {
  EXPECT_EQ(parse_err("=> drop(3)"), "fault rule \"=> drop(3)\": column 4: drop takes 0 argument(s), got 1");
  EXPECT_EQ(parse_err("=> reorder(0)"),
            "fault rule \"=> reorder(0)\": column 12: reorder count must be 1..1000000");
}

TEST(FaultRulesTest, UnbalancedParen) {
  EXPECT_EQ(parse_err("=> dup(2"), "fault rule \"=> dup(2\": column 8: missing ')' in \"dup(2\"");
}

TEST(FaultRulesTest, OpAndClassDisjoint) {
  EXPECT_EQ(parse_err("op=ACKNOWLEDGE class=send => drop"),
            "fault rule \"op=ACKNOWLEDGE class=send => drop\": column 1: op= and class= together "
            "match no opcode");
}

TEST(FaultRulesTest, NoAction) {
  EXPECT_EQ(parse_err("dir=tx =>"), "fault rule \"dir=tx =>\": column 8: no action after \"=>\"");
}

TEST(FaultRulesTest, BadEndpoint) {
  EXPECT_EQ(parse_err("src=300.1.1.1 => drop"),
            "fault rule \"src=300.1.1.1 => drop\": column 5: bad IP address \"300.1.1.1\"");
}

TEST(FaultRulesTest, PlanSplitsOnSemicolonsAndLines) {
  std::vector<FaultRule> rules;
  std::optional<uint64_t> seed;
  EXPECT_EQ(parse_fault_plan("dir=tx => drop; ; class=ack => dup ;seed=99", "SOFTRNIC_FAULTS", &rules, &seed), "");
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[1].text, "class=ack => dup");
  EXPECT_EQ(seed, 99u);

  std::vector<FaultRule> file_rules;
  EXPECT_EQ(parse_fault_plan("# a plan\nseed 7\n\nrule a op=RDMA_WRITE_ONLY => drop  # lose writes\n"
                             "rule b class=nak => delay(10us)\n",
                             "plan.txt", &file_rules, &seed),
            "");
  ASSERT_EQ(file_rules.size(), 2u);
  EXPECT_EQ(file_rules[0].name, "a");
  EXPECT_EQ(file_rules[0].text, "rule a op=RDMA_WRITE_ONLY => drop");
  EXPECT_EQ(seed, 7u);
}

TEST(FaultRulesTest, PlanErrorNamesOriginLineAndRule) {
  std::vector<FaultRule> rules;
  EXPECT_EQ(parse_fault_plan("# comment\ndir=tx => drop\n\ndir=rx => droop\n", "plan.txt", &rules),
            "plan.txt:4: rule 2: fault rule \"dir=rx => droop\": column 11: unknown action "
            "\"droop\" (drop dup delay reorder corrupt rewrite truncate nak rnr blackhole)");
  EXPECT_TRUE(rules.empty());  // all or nothing
  EXPECT_EQ(parse_fault_plan("=> drop; => dup(0)", "SOFTRNIC_FAULTS", &rules),
            "SOFTRNIC_FAULTS: rule 2: fault rule \"=> dup(0)\": column 8: dup count must be 1..255");
  EXPECT_EQ(parse_fault_plan("seed=abc", "SOFTRNIC_FAULTS", &rules),
            "SOFTRNIC_FAULTS: bad seed statement \"seed=abc\"");
}

}  // namespace
}  // namespace rnic::emu
