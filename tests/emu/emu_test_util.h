// tests/emu/emu_test_util.h: shared fixtures for the object-model tests: open a device on
// 127.0.0.2, make PD/CQ/QP, drive a QP through RESET->INIT->RTR->RTS, dump a QpAttr.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "emu/objects/device.h"

namespace rnic::emu::testing {

inline DeviceConfig test_config() {
  DeviceConfig c;
  c.ip = "127.0.0.2";
  c.netdev_mtu = 1500;  // no dependence on the host's interfaces
  return c;
}

inline std::shared_ptr<Device> open_device(DeviceConfig c = test_config()) {
  auto r = Device::open(c);
  EXPECT_TRUE(r.has_value()) << (r ? "" : errc_name(r.error()));
  return r.has_value() ? *r : nullptr;
}

// An AH attribute naming 127.0.0.3 (IPv4-mapped GID), valid for this device.
inline AhAttr peer_ah(uint8_t last_octet = 3) {
  AhAttr a;
  a.is_global = 1;
  a.port_num = 1;
  a.grh.dgid[10] = a.grh.dgid[11] = 0xFF;
  a.grh.dgid[12] = 127;
  a.grh.dgid[15] = last_octet;
  a.grh.hop_limit = 64;
  a.sl = 0;
  return a;
}

// Every attribute set to a valid, recognisable value (so a mask decides what is applied).
inline QpAttr full_attr(QpState to, QpState from) {
  QpAttr a;
  a.qp_state = to;
  a.cur_qp_state = from;
  a.path_mtu = Mtu::k1024;
  a.path_mig_state = MigState::kMigrated;
  a.qkey = 0x11111111;
  a.rq_psn = 0x123456;
  a.sq_psn = 0x654321;
  a.dest_qp_num = 0x4321;
  a.qp_access_flags = kAccessRemoteWrite | kAccessRemoteRead | kAccessLocalWrite;
  a.ah_attr = peer_ah(3);
  a.alt_ah_attr = peer_ah(4);
  a.pkey_index = 0;
  a.alt_pkey_index = 0;
  a.en_sqd_async_notify = 1;
  a.max_rd_atomic = 4;
  a.max_dest_rd_atomic = 5;
  a.min_rnr_timer = 12;
  a.port_num = 1;
  a.timeout = 14;
  a.retry_cnt = 6;
  a.rnr_retry = 5;
  a.alt_port_num = 1;
  a.alt_timeout = 13;
  return a;
}

inline uint32_t init_mask(QpType t) {
  return kQpState | kQpPkeyIndex | kQpPort | (t == QpType::kUd ? kQpQkey : kQpAccessFlags);
}
inline uint32_t rtr_mask(QpType t) {
  if (t == QpType::kUd) return kQpState;
  uint32_t m = kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
  if (t == QpType::kRc) m |= kQpMaxDestRdAtomic | kQpMinRnrTimer;
  return m;
}
inline uint32_t rts_mask(QpType t) {
  uint32_t m = kQpState | kQpSqPsn;
  if (t == QpType::kRc) m |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
  return m;
}

// Step qp from RESET up to `target` (INIT, RTR, RTS or SQD); ERR via INIT; SQE forced.
inline void drive_to(Device& dev, const std::shared_ptr<Qp>& qp, QpState target) {
  const QpType t = qp->type();
  auto step = [&](QpState to, uint32_t mask) {
    Status st = dev.modify_qp(qp, full_attr(to, qp->state()), mask);
    ASSERT_TRUE(st.is_ok()) << "to " << qp_state_name(to) << ": " << errc_name(st.code());
  };
  if (target == QpState::kReset) return;
  if (qp->state() == QpState::kReset) step(QpState::kInit, init_mask(t));
  if (target == QpState::kErr) {  // (RESET -> ERR does not exist; go through INIT)
    step(QpState::kErr, kQpState);
    return;
  }
  if (target == QpState::kInit) return;
  step(QpState::kRtr, rtr_mask(t));
  if (target == QpState::kRtr) return;
  step(QpState::kRts, rts_mask(t));
  if (target == QpState::kRts) return;
  if (target == QpState::kSqd) {
    step(QpState::kSqd, kQpState);
    return;
  }
  if (target == QpState::kSqe) {
    std::scoped_lock lk(qp->send_mutex(), qp->recv_mutex());
    qp->enter_sqe_locked();
    return;
  }
}

inline std::string dump_ah(const AhAttr& a) {
  std::string s;
  char b[160];
  for (uint8_t x : a.grh.dgid) {
    std::snprintf(b, sizeof b, "%02x", x);
    s += b;
  }
  std::snprintf(b, sizeof b, " fl=%u sgid=%u hl=%u tc=%u dlid=%u sl=%u spb=%u sr=%u g=%u p=%u",
                a.grh.flow_label, a.grh.sgid_index, a.grh.hop_limit, a.grh.traffic_class,
                a.dlid, a.sl, a.src_path_bits, a.static_rate, a.is_global, a.port_num);
  return s + b;
}

// Every field of a QpAttr as text: equality of dumps == equality of attributes.
inline std::string dump(const QpAttr& a) {
  char b[1024];
  std::snprintf(
      b, sizeof b,
      "state=%d cur=%d mtu=%d mig=%d qkey=%x rq=%x sq=%x dqp=%x acc=%x cap=%u/%u/%u/%u/%u "
      "pk=%u apk=%u sqdn=%u drain=%u rd=%u drd=%u rnr=%u port=%u to=%u rc=%u rr=%u ap=%u "
      "ato=%u rl=%u",
      int(a.qp_state), int(a.cur_qp_state), int(a.path_mtu), int(a.path_mig_state), a.qkey,
      a.rq_psn, a.sq_psn, a.dest_qp_num, a.qp_access_flags, a.cap.max_send_wr,
      a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data,
      a.pkey_index, a.alt_pkey_index, a.en_sqd_async_notify, a.sq_draining, a.max_rd_atomic,
      a.max_dest_rd_atomic, a.min_rnr_timer, a.port_num, a.timeout, a.retry_cnt, a.rnr_retry,
      a.alt_port_num, a.alt_timeout, a.rate_limit);
  return std::string(b) + " av=[" + dump_ah(a.ah_attr) + "] alt=[" + dump_ah(a.alt_ah_attr) +
         "]";
}

inline std::string query_dump(Device& dev, const std::shared_ptr<Qp>& qp) {
  QpAttr a;
  EXPECT_TRUE(dev.query_qp(qp, &a, nullptr).is_ok());
  return dump(a);
}

// A device with one PD and one CQ, and a helper to create QPs.
struct Env {
  std::shared_ptr<Device> dev;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> cq;
  explicit Env(DeviceConfig c = test_config(), int cqe = 256) {
    dev = open_device(c);
    pd = *dev->alloc_pd();
    cq = *dev->create_cq(cqe, nullptr, 0);
  }
  std::shared_ptr<Qp> qp(QpType t, uint32_t wr = 16, std::shared_ptr<Srq> srq = nullptr,
                         bool sig_all = false) {
    QpInitAttr in;
    in.qp_type = t;
    in.send_cq = cq;
    in.recv_cq = cq;
    in.srq = std::move(srq);
    in.cap.max_send_wr = wr;
    in.cap.max_recv_wr = wr;
    in.cap.max_send_sge = 4;
    in.cap.max_recv_sge = 4;
    in.cap.max_inline_data = 64;
    in.sq_sig_all = sig_all;
    auto r = dev->create_qp(pd, in);
    EXPECT_TRUE(r.has_value());
    return r.has_value() ? *r : nullptr;
  }
  std::vector<Cqe> drain() {
    std::vector<Cqe> v;
    Cqe e[16];
    for (;;) {
      int n = cq->poll(e, 16);
      if (n <= 0) break;
      v.insert(v.end(), e, e + n);
    }
    return v;
  }
};

}  // namespace rnic::emu::testing
