// tests/emu/qp_state_test.cc: the QP state machine. For every (from, to, QP type): the
// transition with exactly its required bits is accepted, dropping any required bit, adding
// any forbidden bit, or attempting a non-existent transition is EINVAL and leaves every
// queried attribute unchanged; each optional bit is accepted. Plus out-of-range values.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "tests/emu/emu_test_util.h"

namespace rnic::emu {
namespace {

using testing::dump;
using testing::drive_to;
using testing::Env;
using testing::full_attr;
using testing::query_dump;

using S = QpState;
using T = QpType;

// Independent transcription of the IBA "QP state transition" attribute tables as Linux
// encodes them (drivers/infiniband/core/verbs.c qp_state_table):
// (from, to, type) -> {required, optional}. Absent = no transition.
struct Expect {
  uint32_t req;
  uint32_t opt;
};
std::map<std::tuple<S, S, T>, Expect> expected_table() {
  std::map<std::tuple<S, S, T>, Expect> m;
  const T kTypes[] = {T::kUd, T::kUc, T::kRc};
  const S kStates[] = {S::kReset, S::kInit, S::kRtr, S::kRts, S::kSqd, S::kSqe, S::kErr};
  for (T t : kTypes) {
    for (S s : kStates) {
      m[{s, S::kReset, t}] = {0, 0};
      if (s != S::kReset) m[{s, S::kErr, t}] = {0, 0};  // no RESET -> ERR in the kernel table
    }
    const bool ud = t == T::kUd, rc = t == T::kRc;
    const uint32_t base = kQpPkeyIndex | kQpPort | (ud ? kQpQkey : kQpAccessFlags);
    m[{S::kReset, S::kInit, t}] = {base, 0};
    m[{S::kInit, S::kInit, t}] = {0, base};
    uint32_t rtr_req = ud ? 0 : (kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn);
    if (rc) rtr_req |= kQpMaxDestRdAtomic | kQpMinRnrTimer;
    uint32_t rtr_opt = ud ? (kQpPkeyIndex | kQpQkey)
                          : (kQpAltPath | kQpAccessFlags | kQpPkeyIndex);
    m[{S::kInit, S::kRtr, t}] = {rtr_req, rtr_opt};
    uint32_t rts_req = kQpSqPsn;
    if (rc) rts_req |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
    uint32_t rts_opt = ud ? (kQpCurState | kQpQkey)
                          : (kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState |
                             (rc ? kQpMinRnrTimer : 0u));
    m[{S::kRtr, S::kRts, t}] = {rts_req, rts_opt};
    m[{S::kRts, S::kRts, t}] = {0, rts_opt};
    m[{S::kSqd, S::kRts, t}] = {0, rts_opt};
    m[{S::kRts, S::kSqd, t}] = {0, kQpEnSqdAsyncNotify};
    uint32_t sqd_opt =
        ud ? (kQpPkeyIndex | kQpQkey)
           : rc ? (kQpPort | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry |
                   kQpMaxQpRdAtomic | kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags |
                   kQpPkeyIndex | kQpMinRnrTimer | kQpPathMigState)
                : (kQpAv | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpPathMigState);
    m[{S::kSqd, S::kSqd, t}] = {0, sqd_opt};
    if (!rc) m[{S::kSqe, S::kRts, t}] = {0, ud ? (kQpCurState | kQpQkey)
                                               : (kQpCurState | kQpAccessFlags)};
  }
  return m;
}

// Every defined attribute-mask bit except kQpState.
std::vector<uint32_t> all_bits() {
  std::vector<uint32_t> v;
  for (int b = 1; b <= 20; ++b) v.push_back(1u << b);
  v.push_back(kQpRateLimit);
  return v;
}

const S kStates[] = {S::kReset, S::kInit, S::kRtr, S::kRts, S::kSqd, S::kSqe, S::kErr};
const T kTypes[] = {T::kRc, T::kUc, T::kUd};

struct Counts {
  int accepted = 0, rejected = 0;
};

// One modify on a fresh QP in `from`; checks the result and, on rejection, that nothing
// changed. Returns true if the outcome matched.
void try_modify(Env& env, T t, S from, S to, uint32_t mask, bool expect_ok, Counts* c,
                const char* why) {
  auto qp = env.qp(t);
  ASSERT_TRUE(qp);
  drive_to(*env.dev, qp, from);
  ASSERT_EQ(qp->state(), from);
  const std::string before = query_dump(*env.dev, qp);
  Status st = env.dev->modify_qp(qp, full_attr(to, from), mask);
  SCOPED_TRACE(std::string(qp_type_name(t)) + " " + qp_state_name(from) + "->" +
               qp_state_name(to) + " mask=" + std::to_string(mask) + " (" + why + ")");
  if (expect_ok) {
    EXPECT_TRUE(st.is_ok()) << errc_name(st.code());
    EXPECT_EQ(qp->state(), to);
    ++c->accepted;
  } else {
    EXPECT_EQ(st, Errc::kInval);
    EXPECT_EQ(qp->state(), from);
    EXPECT_EQ(query_dump(*env.dev, qp), before) << "rejected modify changed the QP";
    ++c->rejected;
  }
  ASSERT_TRUE(env.dev->destroy_qp(qp).is_ok());
}

TEST(QpStateMatrix, EveryTransitionTypeAndMask) {
  Env env;
  auto table = expected_table();
  Counts c;
  for (T t : kTypes) {
    for (S from : kStates) {
      for (S to : kStates) {
        auto it = table.find({from, to, t});
        if (it == table.end()) {
          // No such transition: rejected with just the state bit, and with everything.
          try_modify(env, t, from, to, kQpState, false, &c, "no transition");
          uint32_t every = kQpState;
          for (uint32_t b : all_bits()) every |= b;
          try_modify(env, t, from, to, every, false, &c, "no transition, all bits");
          continue;
        }
        const Expect e = it->second;
        // The library's table agrees with ours.
        QpTransition lt = qp_transition(from, to, t);
        EXPECT_TRUE(lt.valid);
        EXPECT_EQ(lt.required, e.req);
        EXPECT_EQ(lt.optional, e.opt);
        try_modify(env, t, from, to, kQpState | e.req, true, &c, "required only");
        for (uint32_t b : all_bits()) {
          if (e.req & b) {
            try_modify(env, t, from, to, (kQpState | e.req) & ~b, false, &c, "missing required");
          } else if (e.opt & b) {
            try_modify(env, t, from, to, kQpState | e.req | b, true, &c, "optional");
          } else {
            try_modify(env, t, from, to, kQpState | e.req | b, false, &c, "forbidden");
          }
        }
        if (e.opt != 0)
          try_modify(env, t, from, to, kQpState | e.req | e.opt, true, &c, "all optional");
      }
    }
  }
  // Sanity: the matrix really exercised both outcomes in bulk.
  EXPECT_GT(c.accepted, 150);
  EXPECT_GT(c.rejected, 1400);
  RecordProperty("accepted", c.accepted);
  RecordProperty("rejected", c.rejected);
}

TEST(QpStateMatrix, SameStateWithoutStateBit) {
  // No kQpState bit = "stay": RTS->RTS with an optional attribute works, RTR->RTR does not.
  Env env;
  auto qp = env.qp(T::kRc);
  drive_to(*env.dev, qp, S::kRts);
  QpAttr a = full_attr(S::kRts, S::kRts);
  a.min_rnr_timer = 20;
  ASSERT_TRUE(env.dev->modify_qp(qp, a, kQpMinRnrTimer).is_ok());
  QpAttr q;
  ASSERT_TRUE(env.dev->query_qp(qp, &q, nullptr).is_ok());
  EXPECT_EQ(q.min_rnr_timer, 20);
  auto qp2 = env.qp(T::kRc);
  drive_to(*env.dev, qp2, S::kRtr);
  EXPECT_EQ(env.dev->modify_qp(qp2, a, kQpMinRnrTimer), Errc::kInval);
}

TEST(QpStateMatrix, UnknownMaskBitRejected) {
  Env env;
  auto qp = env.qp(T::kRc);
  const std::string before = query_dump(*env.dev, qp);
  EXPECT_EQ(env.dev->modify_qp(qp, full_attr(S::kInit, S::kReset),
                               testing::init_mask(T::kRc) | (1u << 21)),
            Errc::kInval);
  EXPECT_EQ(query_dump(*env.dev, qp), before);
}

// Out-of-range values with an otherwise valid mask: EINVAL, nothing changes.
struct BadValue {
  const char* name;
  S from;
  S to;
  uint32_t mask;
  void (*poison)(QpAttr&);
};

TEST(QpStateMatrix, OutOfRangeValuesRejectedAndQpUnchanged) {
  const uint32_t init_m = testing::init_mask(T::kRc);
  const uint32_t rtr_m = testing::rtr_mask(T::kRc);
  const uint32_t rts_m = testing::rts_mask(T::kRc);
  const BadValue cases[] = {
      {"port 2", S::kReset, S::kInit, init_m, [](QpAttr& a) { a.port_num = 2; }},
      {"pkey index 1", S::kReset, S::kInit, init_m, [](QpAttr& a) { a.pkey_index = 1; }},
      {"bad access bit", S::kReset, S::kInit, init_m,
       [](QpAttr& a) { a.qp_access_flags |= kAccessZeroBased; }},
      {"path mtu 6", S::kInit, S::kRtr, rtr_m, [](QpAttr& a) { a.path_mtu = Mtu(6); }},
      {"path mtu 0", S::kInit, S::kRtr, rtr_m, [](QpAttr& a) { a.path_mtu = Mtu(0); }},
      {"dest qpn 2^24", S::kInit, S::kRtr, rtr_m,
       [](QpAttr& a) { a.dest_qp_num = 0x1000000; }},
      {"max_dest_rd_atomic 129", S::kInit, S::kRtr, rtr_m,
       [](QpAttr& a) { a.max_dest_rd_atomic = 129; }},
      {"min_rnr_timer 32", S::kInit, S::kRtr, rtr_m, [](QpAttr& a) { a.min_rnr_timer = 32; }},
      {"AV not global", S::kInit, S::kRtr, rtr_m, [](QpAttr& a) { a.ah_attr.is_global = 0; }},
      {"AV port 2", S::kInit, S::kRtr, rtr_m, [](QpAttr& a) { a.ah_attr.port_num = 2; }},
      {"AV sgid index 1", S::kInit, S::kRtr, rtr_m,
       [](QpAttr& a) { a.ah_attr.grh.sgid_index = 1; }},
      {"AV non-IPv4 GID", S::kInit, S::kRtr, rtr_m,
       [](QpAttr& a) { a.ah_attr.grh.dgid[0] = 0xfe; }},
      {"alt path bad port", S::kInit, S::kRtr, rtr_m | kQpAltPath,
       [](QpAttr& a) { a.alt_port_num = 3; }},
      {"timeout 32", S::kRtr, S::kRts, rts_m, [](QpAttr& a) { a.timeout = 32; }},
      {"retry_cnt 8", S::kRtr, S::kRts, rts_m, [](QpAttr& a) { a.retry_cnt = 8; }},
      {"rnr_retry 8", S::kRtr, S::kRts, rts_m, [](QpAttr& a) { a.rnr_retry = 8; }},
      {"max_rd_atomic 129", S::kRtr, S::kRts, rts_m, [](QpAttr& a) { a.max_rd_atomic = 129; }},
      {"cur_qp_state wrong", S::kRtr, S::kRts, rts_m | kQpCurState,
       [](QpAttr& a) { a.cur_qp_state = S::kInit; }},
      {"path mig state 3", S::kRtr, S::kRts, rts_m | kQpPathMigState,
       [](QpAttr& a) { a.path_mig_state = MigState(3); }},
      {"state 7", S::kRts, S::kRts, kQpState, [](QpAttr& a) { a.qp_state = S::kUnknown; }},
  };
  Env env;
  for (const BadValue& bv : cases) {
    SCOPED_TRACE(bv.name);
    auto qp = env.qp(T::kRc);
    drive_to(*env.dev, qp, bv.from);
    QpAttr a = full_attr(bv.to, bv.from);
    // Control: the unpoisoned call would be accepted on an identical QP.
    auto twin = env.qp(T::kRc);
    drive_to(*env.dev, twin, bv.from);
    if (bv.to != S::kUnknown) {
      EXPECT_TRUE(env.dev->modify_qp(twin, a, bv.mask).is_ok());
    }
    bv.poison(a);
    const std::string before = query_dump(*env.dev, qp);
    EXPECT_EQ(env.dev->modify_qp(qp, a, bv.mask), Errc::kInval);
    EXPECT_EQ(query_dump(*env.dev, qp), before);
    EXPECT_EQ(qp->state(), bv.from);
  }
}

// A connected QP's AV takes any 32-bit grh.flow_label and keeps its low 20 bits (as the
// kernel does; UCX passes 0xffffffff).
TEST(QpStateMatrix, AnyFlowLabelKeepsItsLow20Bits) {
  Env env;
  auto qp = env.qp(T::kRc);
  drive_to(*env.dev, qp, S::kInit);
  QpAttr a = full_attr(S::kRtr, S::kInit);
  a.ah_attr.grh.flow_label = 0xffffffffu;
  ASSERT_TRUE(env.dev->modify_qp(qp, a, testing::rtr_mask(T::kRc)).is_ok());
  EXPECT_EQ(qp->av().flow_label, 0xfffffu);
  QpAttr q;
  ASSERT_TRUE(env.dev->query_qp(qp, &q, nullptr).is_ok());
  EXPECT_EQ(q.ah_attr.grh.flow_label, 0xffffffffu);  // query shows what was set, as rxe
  EXPECT_EQ(qp->state(), S::kRtr);
}

TEST(QpStateMatrix, CommittedAttributesAreQueried) {
  Env env;
  auto qp = env.qp(T::kRc);
  drive_to(*env.dev, qp, S::kRts);
  QpAttr q;
  QpInitAttr init;
  ASSERT_TRUE(env.dev->query_qp(qp, &q, &init).is_ok());
  QpAttr want = full_attr(S::kRts, S::kRts);
  EXPECT_EQ(q.qp_state, S::kRts);
  EXPECT_EQ(q.cur_qp_state, S::kRts);
  EXPECT_EQ(q.path_mtu, want.path_mtu);
  EXPECT_EQ(q.dest_qp_num, want.dest_qp_num);
  EXPECT_EQ(q.rq_psn, want.rq_psn);
  EXPECT_EQ(q.sq_psn, want.sq_psn);
  EXPECT_EQ(q.qp_access_flags, want.qp_access_flags);
  EXPECT_EQ(q.max_rd_atomic, want.max_rd_atomic);
  EXPECT_EQ(q.max_dest_rd_atomic, want.max_dest_rd_atomic);
  EXPECT_EQ(q.timeout, want.timeout);
  EXPECT_EQ(q.retry_cnt, want.retry_cnt);
  EXPECT_EQ(q.rnr_retry, want.rnr_retry);
  EXPECT_EQ(q.min_rnr_timer, want.min_rnr_timer);
  EXPECT_EQ(testing::dump_ah(q.ah_attr), testing::dump_ah(want.ah_attr));
  EXPECT_EQ(qp->av().dest_ipv4, 0x7F000003u);
  EXPECT_EQ(init.qp_type, T::kRc);
  EXPECT_EQ(init.send_cq, env.cq);
  EXPECT_EQ(q.cap.max_send_wr, 16u);
  // PSNs are masked to 24 bits like rxe.
  QpAttr a = full_attr(S::kRts, S::kRts);
  auto qp2 = env.qp(T::kUd);
  drive_to(*env.dev, qp2, S::kRtr);
  a.sq_psn = 0xFF123456;
  ASSERT_TRUE(env.dev->modify_qp(qp2, a, kQpState | kQpSqPsn).is_ok());
  ASSERT_TRUE(env.dev->query_qp(qp2, &q, nullptr).is_ok());
  EXPECT_EQ(q.sq_psn, 0x123456u);
}

TEST(QpStateMatrix, ResetRestoresDefaults) {
  Env env;
  auto fresh = env.qp(T::kRc);
  auto qp = env.qp(T::kRc);
  drive_to(*env.dev, qp, S::kRts);
  ASSERT_TRUE(env.dev->modify_qp(qp, full_attr(S::kReset, S::kRts), kQpState).is_ok());
  EXPECT_EQ(query_dump(*env.dev, qp), query_dump(*env.dev, fresh));
}

}  // namespace
}  // namespace rnic::emu
