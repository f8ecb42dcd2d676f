// emu/transport/req.cc: the requester — send WQEs to packets (segmentation, PSNs, AckReq, fences,
// initiator depth, RC window), local ops inline, go-back-N rewind; the receive scatter helper.
#include "emu/transport/req.h"

#include <algorithm>
#include <cstring>

#include "emu/transport/comp.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/objects/mr.h"
#include "emu/objects/mw.h"
#include "wire/byteorder.h"
#include "wire/psn.h"

namespace rnic::emu {

using wire::psn_add;
using wire::psn_diff;
namespace op = wire::op;

// ---------------------------------------------------------------- receive scatter

WcStatus scatter_sges(Device& dev, const Pd* pd, const Sge* sges, uint32_t n, uint64_t offset,
                      const uint8_t* data, uint64_t len) {
  uint32_t i = 0;
  while (i < n && offset >= sges[i].length) {
    offset -= sges[i].length;
    ++i;
  }
  while (len > 0) {
    if (i >= n) return WcStatus::kLocLenErr;
    const Sge& s = sges[i];
    uint64_t avail = s.length - offset;
    if (avail == 0) {
      ++i;
      offset = 0;
      continue;
    }
    uint32_t k = static_cast<uint32_t>(std::min<uint64_t>(avail, len));
    Sge piece{s.addr + offset, k, s.lkey};
    uint64_t host = 0;
    WcStatus st = check_local(dev.keys(), piece, pd, true, dev.config().errors, &host);
    if (st != WcStatus::kSuccess) return st;
    if (!dev.mem().write(host, data, k)) return WcStatus::kLocProtErr;
    data += k;
    len -= k;
    offset += k;
  }
  return WcStatus::kSuccess;
}

// ---------------------------------------------------------------- helpers

namespace {

bool is_local_op(WrOpcode o) { return o == WrOpcode::kLocalInv || o == WrOpcode::kBindMw; }
bool is_read(WrOpcode o) { return o == WrOpcode::kRdmaRead; }
bool is_atomic(WrOpcode o) {
  return o == WrOpcode::kAtomicCmpAndSwp || o == WrOpcode::kAtomicFetchAndAdd;
}
bool is_send(WrOpcode o) {
  return o == WrOpcode::kSend || o == WrOpcode::kSendWithImm || o == WrOpcode::kSendWithInv;
}
bool is_write(WrOpcode o) { return o == WrOpcode::kRdmaWrite || o == WrOpcode::kRdmaWriteWithImm; }
bool has_imm(WrOpcode o) {
  return o == WrOpcode::kSendWithImm || o == WrOpcode::kRdmaWriteWithImm;
}

// IBA opcode for packet (first, last) of a SEND/WRITE on an RC or UC QP (UC = RC + 0x20),
// or a UD SEND.
uint8_t data_opcode(QpType t, WrOpcode o, bool first, bool last) {
  if (t == QpType::kUd) return o == WrOpcode::kSendWithImm ? op::kUdSendOnlyWithImm : op::kUdSendOnly;
  uint8_t v;
  if (is_send(o)) {
    if (first && last) {
      v = o == WrOpcode::kSendWithImm   ? op::kRcSendOnlyWithImm
          : o == WrOpcode::kSendWithInv ? op::kRcSendOnlyWithInv
                                        : op::kRcSendOnly;
    } else if (first) {
      v = op::kRcSendFirst;
    } else if (!last) {
      v = op::kRcSendMiddle;
    } else {
      v = o == WrOpcode::kSendWithImm   ? op::kRcSendLastWithImm
          : o == WrOpcode::kSendWithInv ? op::kRcSendLastWithInv
                                        : op::kRcSendLast;
    }
  } else {
    if (first && last) {
      v = o == WrOpcode::kRdmaWriteWithImm ? op::kRcRdmaWriteOnlyWithImm : op::kRcRdmaWriteOnly;
    } else if (first) {
      v = op::kRcRdmaWriteFirst;
    } else if (!last) {
      v = op::kRcRdmaWriteMiddle;
    } else {
      v = o == WrOpcode::kRdmaWriteWithImm ? op::kRcRdmaWriteLastWithImm : op::kRcRdmaWriteLast;
    }
  }
  return t == QpType::kUc ? static_cast<uint8_t>(v + 0x20) : v;
}

// Positions the gather cursor (sge_index/sge_offset) at w.offset.
void seek(SendWqe& w) {
  uint64_t rem = w.offset;
  uint32_t i = 0;
  while (i < w.num_sge && rem >= w.sge[i].length) {
    rem -= w.sge[i].length;
    ++i;
  }
  w.sge_index = i;
  w.sge_offset = static_cast<uint32_t>(rem);
}

// Every SGE of w passes the local check (lkey, PD, LOCAL_WRITE if written, range): S09.
WcStatus check_sges(Device& dev, const Qp& qp, const SendWqe& w, bool need_write) {
  if (w.is_inline) return WcStatus::kSuccess;
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    WcStatus st = check_local(dev.keys(), w.sge[i], qp.pd().get(), need_write,
                              dev.config().errors, nullptr);
    if (st != WcStatus::kSuccess) return st;
  }
  return WcStatus::kSuccess;
}

// Copies len payload bytes from the cursor into dst and advances the cursor.
WcStatus gather(Device& dev, const Qp& qp, SendWqe& w, uint8_t* dst, uint32_t len) {
  if (w.is_inline) {
    std::memcpy(dst, w.inline_data + w.offset, len);
    return WcStatus::kSuccess;
  }
  while (len > 0) {
    if (w.sge_index >= w.num_sge) return WcStatus::kLocLenErr;
    const Sge& s = w.sge[w.sge_index];
    uint32_t avail = s.length - w.sge_offset;
    if (avail == 0) {
      ++w.sge_index;
      w.sge_offset = 0;
      continue;
    }
    uint32_t n = std::min(avail, len);
    Sge piece{s.addr + w.sge_offset, n, s.lkey};
    uint64_t host = 0;
    WcStatus st = check_local(dev.keys(), piece, qp.pd().get(), false, dev.config().errors, &host);
    if (st != WcStatus::kSuccess) return st;
    if (!dev.mem().read(host, dst, n)) return WcStatus::kLocProtErr;
    dst += n;
    len -= n;
    w.sge_offset += n;
  }
  return WcStatus::kSuccess;
}

// Executes a local op WQE inline (IBA 10.6.3.3 / rxe: completes immediately as a WQE).
void exec_local(Engine& e, Qp& qp, SendWqe& w) {
  Device& dev = e.device();
  WcStatus st;
  if (w.opcode == WrOpcode::kLocalInv) {
    st = local_invalidate(dev, qp.pd().get(), w.invalidate_rkey);
  } else {
    st = bind_mw(dev, qp.pd().get(), qp.qpn(), w.bind, nullptr);
  }
  w.status = st;
  w.state = st == WcStatus::kSuccess ? WqeState::kDone : WqeState::kError;
}

}  // namespace

// ---------------------------------------------------------------- requester

void req_run(Engine& e, Qp& qp) {
  ReqState& r = qp.req_;
  CompState& c = qp.comp_;
  if (!r.ready || c.dead) return;
  const QpState st = qp.state();
  if (st != QpState::kRts && st != QpState::kSqd) return;
  if (r.rnr_wait) return;

  Device& dev = e.device();
  Ring<SendWqe>& sq = qp.sq();
  const QpType type = qp.type();
  const bool rc = type == QpType::kRc;
  const QpAttr& attr = qp.attr();
  TxBatch& tx = e.tx_batch();
  // Packets already in the thread's batch belong to an outer caller; we flush ours only.
  bool sent = false;
  const wire::Endpoint local = e.port().local();

  while (r.pos < sq.size()) {
    SendWqe& w = sq.at(r.pos);
    if (w.state == WqeState::kError) break;  // the completer will fail the QP
    if (w.state == WqeState::kDone || w.state == WqeState::kPending) {
      ++r.pos;
      continue;
    }
    if (w.state == WqeState::kPosted) {
      if (st == QpState::kSqd) break;  // SQD: no new WQE starts
      if (is_local_op(w.opcode)) {
        // LOCAL_INV waits for every earlier WQE to complete (rxe); BIND_MW runs in order.
        if (w.opcode == WrOpcode::kLocalInv && r.pos != 0) break;
        exec_local(e, qp, w);
        if (w.state == WqeState::kError) break;
        ++r.pos;
        continue;
      }
      if (w.opcode == WrOpcode::kAtomicWrite) {
        // ATOMIC_WRITE (and FLUSH) are not implemented: fail the WQE, nothing is sent.
        w.status = WcStatus::kLocQpOpErr;
        w.state = WqeState::kError;
        break;
      }
      // Fence: wait until every earlier READ/ATOMIC has completed (IBA 10.8.3.3).
      if ((w.send_flags & kSendFence) && r.rd_atomic_inflight > 0) break;
      const bool rd_at = is_read(w.opcode) || is_atomic(w.opcode);
      if (rd_at && r.rd_atomic_inflight >= r.max_rd_atomic) break;
      if (rc && psn_diff(r.psn, c.psn) >= static_cast<int32_t>(kMaxUnackedPsns)) break;
      const bool written = rd_at;  // READ data / atomic result land in the SGEs
      WcStatus cs = check_sges(dev, qp, w, written);
      if (cs != WcStatus::kSuccess) {
        w.status = cs;  // S09: no packet leaves
        w.state = WqeState::kError;
        break;
      }
      uint32_t mtu = r.mtu;
      if (type == QpType::kUd && w.length > mtu) {
        // C10-93.1.1 / rxe: an oversized UD send completes without being transmitted.
        w.state = WqeState::kDone;
        ++r.pos;
        continue;
      }
      w.offset = 0;
      w.sge_index = w.sge_offset = 0;
      // Every earlier WQE has been sent at least once: the new one starts past all of them.
      if (psn_diff(r.max_psn, r.psn) > 0) r.psn = r.max_psn;
      w.first_psn = r.psn;
      uint32_t n = is_atomic(w.opcode) ? 1u : num_pkts(w.length, mtu);
      w.last_psn = psn_add(r.psn, n - 1);
      w.state = WqeState::kProcessing;
      if (rd_at) ++r.rd_atomic_inflight;
      if (!is_send(w.opcode)) bump(c.ctr, e.counters(), Ctr::kRdmaSends);
    }
    // kProcessing: emit the next packet.
    if (rc && psn_diff(r.psn, c.psn) >= static_cast<int32_t>(kMaxUnackedPsns)) break;
    if (tx.full()) {
      e.flush(tx);
    }
    uint8_t* buf = tx.next();
    wire::PacketFields f;
    f.dest_qp = type == QpType::kUd ? w.remote_qpn : attr.dest_qp_num;
    // The PSN follows from the WQE's own progress, so a WQE completed by a late ACK while
    // being re-sent cannot shift the PSNs of the ones behind it.
    const uint32_t psn = psn_add(w.first_psn, static_cast<uint32_t>(w.offset / r.mtu));
    f.psn = psn;
    uint32_t plen = 0;
    bool last = true;
    uint32_t psn_used = 1;
    if (is_read(w.opcode)) {
      uint64_t rem = w.length - w.offset;
      f.opcode = op::kRcRdmaReadRequest;
      f.va = w.remote_addr + w.offset;
      f.rkey = w.rkey;
      f.dma_len = static_cast<uint32_t>(rem);
      f.ack_req = true;
      psn_used = num_pkts(rem, r.mtu);
    } else if (is_atomic(w.opcode)) {
      f.opcode = w.opcode == WrOpcode::kAtomicCmpAndSwp ? op::kRcCompareSwap : op::kRcFetchAdd;
      f.va = w.remote_addr;
      f.rkey = w.rkey;
      if (w.opcode == WrOpcode::kAtomicCmpAndSwp) {
        f.swap_add = w.swap;
        f.compare = w.compare_add;
      } else {
        f.swap_add = w.compare_add;
      }
      f.ack_req = true;
    } else {
      uint64_t rem = w.length - w.offset;
      const bool first = w.offset == 0;
      last = rem <= r.mtu;
      plen = static_cast<uint32_t>(std::min<uint64_t>(rem, r.mtu));
      f.opcode = data_opcode(type, w.opcode, first, last);
      if (is_write(w.opcode) && first) {
        f.va = w.remote_addr;
        f.rkey = w.rkey;
        f.dma_len = static_cast<uint32_t>(w.length);
      }
      if (last && has_imm(w.opcode)) {
        f.imm = wire::load_be32(reinterpret_cast<const uint8_t*>(&w.imm_data));
      }
      if (last && w.opcode == WrOpcode::kSendWithInv) f.inv_rkey = w.invalidate_rkey;
      if (last && (w.send_flags & kSendSolicited) &&
          (is_send(w.opcode) || w.opcode == WrOpcode::kRdmaWriteWithImm))
        f.se = true;
      if (type == QpType::kUd) {
        f.qkey = (w.remote_qkey & 0x80000000u) ? attr.qkey : w.remote_qkey;
        f.src_qp = qp.qpn();
      }
      if (rc) f.ack_req = last || r.pkts_since_ackreq + 1 >= kMaxPktsPerAck;
    }
    const size_t hl = wire::write_roce_headers(buf, f, plen);
    if (plen > 0) {
      WcStatus gs = gather(dev, qp, w, buf + hl, plen);
      if (gs != WcStatus::kSuccess) {
        w.status = gs;
        w.state = WqeState::kError;
        break;
      }
    }
    wire::Endpoint dst;
    const auto len = static_cast<uint32_t>(wire::roce_len(hl, plen));
    if (type == QpType::kUd) {
      dst = wire::Endpoint::v4(w.av.dest_ipv4, e.config().udp_port);
      wire::finish_roce(buf, hl, plen, wire::meta_between(local, dst, tx.ip_id_for(dst, len)));
    } else {
      dst = r.dst;
      wire::finish_roce(buf, hl, plen, r.meta, tx.ip_id_for(dst, len));
    }
    tx.commit(dst, len);
    bump(c.ctr, e.counters(), Ctr::kSentPkts);
    if (rc && psn_diff(psn, r.max_psn) < 0) bump(c.ctr, e.counters(), Ctr::kRetransPkts);
    sent = true;
    if (rc) r.pkts_since_ackreq = f.ack_req ? 0 : r.pkts_since_ackreq + 1;
    r.psn = psn_add(psn, psn_used);
    if (psn_diff(r.psn, r.max_psn) > 0) r.max_psn = r.psn;
    w.offset += plen;
    if (last) {
      w.offset = w.length;
      w.state = rc ? WqeState::kPending : WqeState::kDone;
      ++r.pos;
    }
  }
  e.flush(tx);
  if (sent && rc && c.timeout_ns != 0 && c.retrans_deadline_ns == 0) {
    c.retrans_deadline_ns = wire::monotonic_ns() + c.timeout_ns;
    e.arm_timer(c.retrans_deadline_ns);
  }
  comp_retire(e, qp);
}

void req_retry(Engine& e, Qp& qp) {
  (void)e;
  ReqState& r = qp.req_;
  CompState& c = qp.comp_;
  Ring<SendWqe>& sq = qp.sq();
  const uint32_t limit = std::min(r.pos + 1, sq.size());
  uint32_t first_active = ~0u;
  for (uint32_t i = 0; i < limit; ++i) {
    SendWqe& w = sq.at(i);
    if (w.state != WqeState::kPending && w.state != WqeState::kProcessing) continue;
    if (first_active == ~0u) first_active = i;
    // Partially acknowledged WQE: resume at its first unacknowledged PSN (rxe req_retry).
    int32_t done = psn_diff(c.psn, w.first_psn);
    if (done > 0 && psn_diff(c.psn, w.last_psn) <= 0 && !is_atomic(w.opcode)) {
      w.offset = std::min<uint64_t>(static_cast<uint64_t>(done) * r.mtu, w.length);
    } else {
      w.offset = 0;
    }
    w.state = WqeState::kProcessing;
    seek(w);
  }
  if (first_active != ~0u) r.pos = first_active;
  r.psn = c.psn;
  r.pkts_since_ackreq = 0;
}

}  // namespace rnic::emu
