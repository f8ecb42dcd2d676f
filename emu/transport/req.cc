// emu/transport/req.cc: the requester — send WQEs to packets (segmentation, PSNs, AckReq, fences,
// initiator depth, RC window), local ops inline, go-back-N rewind; the receive scatter helper.
#include "emu/transport/req.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "emu/transport/comp.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/transport/one_copy.h"
#include "emu/transport/scatter_cache.h"
#include "emu/transport/window.h"
#include "emu/objects/mr.h"
#include "emu/objects/mw.h"
#include "emu/objects/wr_opcode.h"
#include "wire/byteorder.h"
#include "wire/psn.h"

namespace rnic::emu {

using wire::psn_add;
using wire::psn_diff;
namespace op = wire::op;

// ---------------------------------------------------------------- receive scatter

bool ScatterCache::find(const KeyTable& keys, const Sge& piece, const Pd* pd, uint64_t* host) {
  for (int i = 0; i < n_; ++i) {
    Slot& s = slots_[i];
    if (s.keys != &keys || s.v.key != piece.lkey) continue;
    // Still the MR as checked, and no dereg / rereg waiting for the guard.
    if (s.mr->view_seq() != s.v.seq || s.mr->gate().closed()) {
      drop(i);
      return false;
    }
    if (s.v.pd != pd || !s.v.in_range(piece.addr, piece.length)) return false;
    *host = s.v.translate(piece.addr);
    ++hits_;
    return true;
  }
  return false;
}

void ScatterCache::keep(const KeyTable& keys, const Mr& mr, const MrView& v, AccessGuard&& g) {
  if (!g.held() || (v.access & kAccessLocalWrite) == 0 || v.state != MrState::kValid) return;
  int i = 0;
  while (i < n_ && !(slots_[i].keys == &keys && slots_[i].v.key == v.key)) ++i;
  if (i == n_) {
    if (n_ < kSlots) {
      ++n_;
    } else {
      i = next_;
      next_ = (next_ + 1) % kSlots;
    }
  }
  Slot& s = slots_[i];
  s.keys = &keys;
  s.v = v;
  s.g = std::move(g);  // lets the slot's previous guard go
  s.mr = &mr;
}

void ScatterCache::drop(int i) {
  if (i != n_ - 1) slots_[i] = std::move(slots_[n_ - 1]);  // the guard moved lets i's go
  slots_[--n_].clear();
}

uint64_t ScatterCache::reset_slow() {
  for (int i = 0; i < n_; ++i) slots_[i].clear();
  n_ = 0;
  next_ = 0;
  return std::exchange(hits_, 0);
}

WcStatus scatter_sges(Device& dev, const Pd* pd, const Sge* sges, uint32_t n, uint64_t offset,
                      const uint8_t* data, uint64_t len, Counters* qp_ctr, Counters* dev_ctr) {
  ScatterCache* sc = Engine::drain_scatter_cache();  // null outside a receive drain
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
    AccessGuard g;  // held until the write returned: dereg waits for it (issue 10 item 3)
    if (sc == nullptr || !sc->find(dev.keys(), piece, pd, &host)) {
      std::shared_ptr<Mr> mr;
      MrView v;
      WcStatus st = check_local(dev.keys(), piece, pd, true, dev.config().errors, &host, &g,
                                sc != nullptr ? &mr : nullptr, &v);
      if (st != WcStatus::kSuccess) return st;
      if (sc != nullptr && mr) sc->keep(dev.keys(), *mr, v, std::move(g));  // holds it on
    }
    if (!dev.mem().write(host, data, k)) {
      if (qp_ctr != nullptr) qp_ctr->add(Ctr::kMemFault);
      if (dev_ctr != nullptr) dev_ctr->add(Ctr::kMemFault);
      return WcStatus::kLocProtErr;
    }
    data += k;
    len -= k;
    offset += k;
  }
  return WcStatus::kSuccess;
}

// ---------------------------------------------------------------- helpers

namespace {

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

// The MR a requester run last checked for the packets of one WQE (gather). A 64 KiB message
// is 16 packets of one SGE; checking each anew cost a key-table lookup, a view read and a
// gate entry, about nine atomic read-modify-writes on lines that the posting thread and the
// progress thread (which runs the requester after ACKs) both write: ~9% of ib_write_bw's CPU
// (docs/progress.md). While the guard is held the MR's view cannot change (dereg and rereg
// wait for it), so the next packets of that SGE only check the range, the key and that the
// gate is open; a gate that closed meanwhile (dereg or rereg started on another thread) or a
// key that changed (rereg from inside a copy on this thread) drops the cache, and the full
// check then refuses as it would have. Reset at each WQE's end, so no local operation of the same
// run (LOCAL_INV, BIND_MW) runs while it is held.
struct GatherCache {
  const SendWqe* w = nullptr;
  uint32_t sge = 0;
  MrView v;
  AccessGuard g;
  const Mr* mr = nullptr;  // kept alive by g

  // The key check catches a rereg on this thread (from inside a copy: a MemAccess hook), which
  // close_and_drain does not wait for and which reopens the gate: a new translation or PD
  // always comes with a new key (Device::rereg_mr).
  bool covers(const SendWqe& wqe, uint32_t i, const Sge& piece) const {
    return w == &wqe && sge == i && g.held() && !mr->gate().closed() && mr->lkey() == v.key &&
           v.in_range(piece.addr, piece.length);
  }
  // Keeps what check_local saw for SGE i of wqe (its view: the guard keeps it so).
  void keep(const SendWqe& wqe, uint32_t i, const Mr& m, const MrView& view,
            AccessGuard&& guard) {
    w = &wqe;
    sge = i;
    v = view;
    mr = &m;
    g = std::move(guard);
  }
  void reset() {
    w = nullptr;
    mr = nullptr;
    g.reset();
  }
};

// Every SGE of w passes the local check (lkey, PD, LOCAL_WRITE if written, range): S09.
// With gc (a payload the requester gathers from, not one it writes into), the first SGE's
// check is kept in it, as gather's own would be: a one-packet message then looks its key up
// once, not twice (path_bench).
WcStatus check_sges(Device& dev, Qp& qp, const SendWqe& w, bool need_write,
                    GatherCache* gc = nullptr) {
  if (w.is_inline) return WcStatus::kSuccess;
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    if (i == 0 && gc != nullptr && !need_write && w.sge[0].length != 0) {
      gc->reset();
      AccessGuard g;
      std::shared_ptr<Mr> mr;
      uint64_t host = 0;
      MrView v;
      WcStatus st = check_local(dev.keys(), w.sge[0], qp.pd().get(), false, dev.config().errors,
                                &host, &g, &mr, &v, &qp.req_.lkeys);
      if (st != WcStatus::kSuccess) return st;
      if (mr) gc->keep(w, 0, *mr, v, std::move(g));
      continue;
    }
    WcStatus st = check_local(dev.keys(), w.sge[i], qp.pd().get(), need_write,
                              dev.config().errors, nullptr, nullptr, nullptr, nullptr,
                              &qp.req_.lkeys);
    if (st != WcStatus::kSuccess) return st;
  }
  return WcStatus::kSuccess;
}

// Copies len payload bytes from the cursor into dst and advances the cursor. With gc, keeps the
// MR checked for the last piece in it (GatherCache).
WcStatus gather(Engine& e, Qp& qp, SendWqe& w, uint8_t* dst, uint32_t len,
                GatherCache* gc = nullptr) {
  Device& dev = e.device();
  if (w.has_operand) {  // ATOMIC_WRITE by value (ibv_wr_atomic_write)
    std::memcpy(dst, reinterpret_cast<const uint8_t*>(&w.operand) + w.offset, len);
    return WcStatus::kSuccess;
  }
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
    AccessGuard g;  // held until the read returned: dereg waits for it (issue 10 item 3)
    if (gc != nullptr && gc->covers(w, w.sge_index, piece)) {
      host = gc->v.translate(piece.addr);
    } else {
      if (gc != nullptr) gc->reset();
      std::shared_ptr<Mr> mr;
      MrView v;
      WcStatus st = check_local(dev.keys(), piece, qp.pd().get(), false, dev.config().errors,
                                &host, &g, gc != nullptr ? &mr : nullptr, &v, &qp.req_.lkeys);
      if (st != WcStatus::kSuccess) return st;
      if (gc != nullptr && mr) gc->keep(w, w.sge_index, *mr, v, std::move(g));
    }
    if (!dev.mem().read(host, dst, n)) {
      bump(qp.comp_.ctr, e.counters(), Ctr::kMemFault);
      if (gc != nullptr) gc->reset();
      return WcStatus::kLocProtErr;  // local SGE: local protection error
    }
    dst += n;
    len -= n;
    w.sge_offset += n;
  }
  return WcStatus::kSuccess;
}

// One copy (one_copy.h): when the payload of w's next packet (plen bytes at the cursor, PSN
// psn) lies in one shadowed piece of one SGE and the peer device links with us, fills *d with
// a descriptor of it and advances the cursor as gather() would. False: send it by value.
// Only a first transmission goes as a descriptor: whatever made a packet go again (a loss, or
// a peer that could not resolve it: no mapping, no fd to spare, a link it dropped), its
// resend carries the bytes, so a QP always makes progress.
bool one_copy_desc(Engine& e, Qp& qp, SendWqe& w, uint32_t plen, uint32_t psn,
                   OneCopyDesc* d) {
  OneCopy* oc = e.one_copy();
  ReqState& r = qp.req_;
  if (oc == nullptr || plen < kOneCopyMinBytes || w.is_inline || w.has_operand ||
      qp.type() != QpType::kRc || psn_diff(psn, r.max_psn) < 0 || e.fault_engine_attached())
    return false;
  if (r.oc_state == 1 && OneCopy::broken(r.oc_link)) r.oc_state = 0;  // link again
  if (r.oc_state == 2) {
    if (wire::monotonic_ns() < r.oc_retry_ns) return false;
    r.oc_state = 0;
  }
  uint32_t i = w.sge_index, off = w.sge_offset;
  while (i < w.num_sge && off == w.sge[i].length) {
    ++i;
    off = 0;
  }
  if (i >= w.num_sge || w.sge[i].length - off < plen) return false;
  Device& dev = e.device();
  const Sge piece{w.sge[i].addr + off, plen, w.sge[i].lkey};
  uint64_t host = 0;
  std::shared_ptr<Mr> mr;
  if (check_local(dev.keys(), piece, qp.pd().get(), false, dev.config().errors, &host, nullptr,
                  &mr, nullptr, &r.lkeys) != WcStatus::kSuccess)
    return false;  // gather() reports it
  std::shared_ptr<PinnedRange> pin = mr ? mr->pin() : nullptr;
  PinLoc loc;
  if (!pin || !pin->locate(host, plen, &loc)) return false;
  if (r.oc_state == 0) {
    r.oc_link = oc->link(r.dst);
    r.oc_shared = 0;
    r.oc_state = r.oc_link != nullptr ? 1 : 2;
    if (r.oc_state == 2) {
      r.oc_retry_ns = wire::monotonic_ns() + 1'000'000'000;  // look again a second later
      return false;
    }
  }
  if (loc.backing->id != r.oc_shared) {
    if (!oc->share(r.oc_link, loc.backing)) return false;
    r.oc_shared = loc.backing->id;
  }
  *d = OneCopyDesc{OneCopy::token(r.oc_link), loc.backing->id, plen, loc.off};
  w.sge_index = i;
  w.sge_offset = off + plen;
  return true;
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

namespace {

// What req_run does with the WQE at r.pos (pick_wqe).
enum class Pick : uint8_t {
  kEmit,  // it has a packet to send now
  kNext,  // nothing to send for it (finished, local op done, oversized UD): look at the next
  kStop,  // the send queue cannot advance now (error, fence, depth, window, SQD, LOCAL_INV)
};

// What the steps of one req_run call share; one stack object (no allocation, no locks).
struct ReqRun {
  Engine& e;
  Qp& qp;
  ReqState& r;
  CompState& c;
  Device& dev;
  const QpType type;
  const bool rc;
  const QpState st;
  TxBatch& tx;
  const wire::Endpoint local;
  bool sent = false;  // a packet of ours went into the batch
  GatherCache gc;     // the MR of the current WQE's payload (gather)
  // A held ACK still to be taken after this run's requests (EngineConfig::ack_tail), and the
  // index of the run's first descriptor in tx, where it goes if it cannot be their tail.
  bool ack_tail = false;
  int tail_first = 0;
  // One clock reading for a packet's steps (a held ACK taken, the RTT sample, the retransmit
  // timer of the run's last packet): three reads a 64 B post before. Reset for every packet,
  // so a long run never times a later packet from an early reading.
  uint64_t now_ns = 0;
  uint64_t now() {
    if (now_ns == 0) now_ns = wire::monotonic_ns();
    return now_ns;
  }
  // The reading Engine::take_ack needs: none where no ACK can be held (UD, UC, holding off).
  uint64_t ack_now() { return e.holds_acks(qp) ? now() : 0; }
};

// One request packet: its header fields and how far it moves the WQE.
struct ReqPkt {
  wire::PacketFields f;
  uint32_t psn = 0;
  uint32_t plen = 0;      // payload bytes
  uint32_t psn_used = 1;  // PSNs it consumes (a READ request: one per response packet)
  bool last = true;       // last packet of the WQE
  uint32_t wire_len = 0;  // RoCE bytes written (emit_packet)
};

// RC window: at most cwnd (1..kMaxUnackedPsns, window.h) PSNs past the oldest unacknowledged
// one.
// With EngineConfig::window_share, also at most the QP's share of the window towards its
// destination, taken afresh each time the share is what fills it (Engine::window_share). A
// QP that cwnd holds back (a CNP, a loss, a timeout) is not counted as a sender.
bool window_full(ReqRun& x) {
  if (!x.rc) return false;
  const int32_t out = psn_diff(x.r.psn, x.c.psn);
  if (out < static_cast<int32_t>(std::min(x.c.win.cwnd, x.r.win_share))) return false;
  if (!x.e.config().window_share || out < static_cast<int32_t>(x.r.win_share)) return true;
  x.r.win_share = x.e.window_share(x.r.dst, &x.r.share_epoch, x.now());
  return out >= static_cast<int32_t>(std::min(x.c.win.cwnd, x.r.win_share));
}

// Fence and initiator depth (and the window): may WQE w, with facts m, start now?
bool can_start(ReqRun& x, const SendWqe& w, uint32_t m) {
  // Fence: wait until every earlier READ/ATOMIC has completed (IBA 10.8.3.3).
  if ((w.send_flags & kSendFence) && x.r.rd_atomic_inflight > 0) return false;
  if ((m & kWrRdAtomicMask) && x.r.rd_atomic_inflight >= x.r.max_rd_atomic) return false;
  return !window_full(x);
}

// Gives a starting WQE its PSN range and takes its initiator-depth slot.
void assign_psns(ReqRun& x, SendWqe& w, uint32_t m) {
  ReqState& r = x.r;
  w.offset = 0;
  w.sge_index = w.sge_offset = 0;
  // Every earlier WQE has been sent at least once: the new one starts past all of them.
  if (psn_diff(r.max_psn, r.psn) > 0) r.psn = r.max_psn;
  w.first_psn = r.psn;
  const uint32_t n = (m & kWrAtomicMask) ? 1u : num_pkts(w.length, r.mtu);
  w.last_psn = psn_add(r.psn, n - 1);
  w.state = WqeState::kProcessing;
  if (m & kWrRdAtomicMask) ++r.rd_atomic_inflight;
  if (!(m & kWrSendMask)) bump(x.c.ctr, x.e.counters(), Ctr::kRdmaSends);
}

// A posted WQE starts: a local op runs inline; any other is checked and numbered.
Pick start_wqe(ReqRun& x, SendWqe& w) {
  const uint32_t m = wr_mask(x.type, w.opcode);
  if (m & kWrLocalMask) {
    // LOCAL_INV waits for every earlier WQE to complete (rxe); BIND_MW runs in order.
    if ((m & kWrWaitSqMask) && x.r.pos != 0) return Pick::kStop;
    exec_local(x.e, x.qp, w);
    return w.state == WqeState::kError ? Pick::kStop : Pick::kNext;
  }
  if (m & kWrUnimplementedMask) {
    // A valid opcode the engine does not execute (none today): fail it, nothing is sent.
    w.status = WcStatus::kLocQpOpErr;
    w.state = WqeState::kError;
    return Pick::kStop;
  }
  if (!can_start(x, w, m)) return Pick::kStop;
  // READ data / atomic results land in the SGEs, which then need LOCAL_WRITE.
  const bool local_write = (m & kWrLocalWriteMask) != 0;
  WcStatus cs = check_sges(x.dev, x.qp, w, local_write, local_write ? nullptr : &x.gc);
  if (cs != WcStatus::kSuccess) {
    w.status = cs;  // S09: no packet leaves
    w.state = WqeState::kError;
    return Pick::kStop;
  }
  if (x.type == QpType::kUd && w.length > x.r.mtu) {
    // C10-93.1.1 / rxe: an oversized UD send completes without being transmitted.
    w.state = WqeState::kDone;
    return Pick::kNext;
  }
  if (!(m & (kWrReadMask | kWrAtomicMask))) x.c.answerable = true;
  assign_psns(x, w, m);
  return Pick::kEmit;
}

// Step 1: the WQE at r.pos — skip finished ones, start posted ones.
Pick pick_wqe(ReqRun& x, SendWqe& w) {
  switch (w.state) {
    case WqeState::kError: return Pick::kStop;  // the completer will fail the QP
    case WqeState::kDone:
    case WqeState::kPending: return Pick::kNext;
    case WqeState::kPosted:
      if (x.st == QpState::kSqd) return Pick::kStop;  // SQD: no new WQE starts
      return start_wqe(x, w);
    case WqeState::kProcessing: break;
  }
  return Pick::kEmit;
}

// READ request: one packet asks for the rest of the data (ack_req; one PSN per response).
void fill_read(const ReqRun& x, const SendWqe& w, ReqPkt& k) {
  const uint64_t rem = w.length - w.offset;
  k.f.opcode = wr_bth_opcode(x.type, w.opcode, true, true);
  k.f.va = w.remote_addr + w.offset;
  k.f.rkey = w.rkey;
  k.f.dma_len = static_cast<uint32_t>(rem);
  k.f.ack_req = true;
  k.psn_used = num_pkts(rem, x.r.mtu);
}

// CMP_AND_SWP / FETCH_AND_ADD: one packet with the AtomicETH.
void fill_atomic(const ReqRun& x, const SendWqe& w, uint32_t m, ReqPkt& k) {
  k.f.opcode = wr_bth_opcode(x.type, w.opcode, true, true);
  k.f.va = w.remote_addr;
  k.f.rkey = w.rkey;
  if (m & kWrCompareMask) {
    k.f.swap_add = w.swap;
    k.f.compare = w.compare_add;
  } else {
    k.f.swap_add = w.compare_add;
  }
  k.f.ack_req = true;
}

// FLUSH: one packet, RETH (range) + FETH (placement type, selectivity level), no payload.
void fill_flush(const ReqRun& x, const SendWqe& w, ReqPkt& k) {
  k.f.opcode = wr_bth_opcode(x.type, w.opcode, true, true);
  k.f.va = w.remote_addr;
  k.f.rkey = w.rkey;
  k.f.dma_len = static_cast<uint32_t>(w.flush_len);
  k.f.flush_plt = w.flush_type;
  k.f.flush_sel = w.flush_level;
  k.f.ack_req = true;
}

// SEND / WRITE / ATOMIC_WRITE: the next MTU of payload; RETH on a WRITE's first packet (and
// on the one ATOMIC_WRITE packet, DMA length 8); ImmDt, IETH and SE
// on the last.
void fill_data(const ReqRun& x, const SendWqe& w, uint32_t m, ReqPkt& k) {
  const ReqState& r = x.r;
  const uint64_t rem = w.length - w.offset;
  const bool first = w.offset == 0;
  const bool last = rem <= r.mtu;
  k.last = last;
  k.plen = static_cast<uint32_t>(std::min<uint64_t>(rem, r.mtu));
  k.f.opcode = wr_bth_opcode(x.type, w.opcode, first, last);
  if ((m & (kWrWriteMask | kWrAtomicWriteMask)) && first) {
    k.f.va = w.remote_addr;
    k.f.rkey = w.rkey;
    k.f.dma_len = static_cast<uint32_t>(w.length);
  }
  if (last && (m & kWrImmMask))
    k.f.imm = wire::load_be32(reinterpret_cast<const uint8_t*>(&w.imm_data));
  if (last && (m & kWrInvMask)) k.f.inv_rkey = w.invalidate_rkey;
  if (last && (w.send_flags & kSendSolicited) && (m & kWrSolicitedMask)) k.f.se = true;
  if (x.type == QpType::kUd) {
    k.f.qkey = (w.remote_qkey & 0x80000000u) ? x.qp.attr().qkey : w.remote_qkey;
    k.f.src_qp = x.qp.qpn();
  }
  if (x.rc)
    k.f.ack_req = last || r.pkts_since_ackreq + 1 >=
                              win_ackreq_every(x.c.win, kMaxPktsPerAck, r.win_share);
}

// Step 2: the header fields of w's next packet.
void build_packet(const ReqRun& x, const SendWqe& w, ReqPkt& k) {
  const uint32_t m = wr_mask(x.type, w.opcode);
  k.f.dest_qp = x.type == QpType::kUd ? w.remote_qpn : x.qp.attr().dest_qp_num;
  // The PSN follows from the WQE's own progress, so a WQE completed by a late ACK while
  // being re-sent cannot shift the PSNs of the ones behind it.
  k.psn = psn_add(w.first_psn, static_cast<uint32_t>(w.offset / x.r.mtu));
  k.f.psn = k.psn;
  k.f.xrc_srqn = w.xrc_srqn;  // XRCETH (XRC requests only; ignored by other opcodes)
  if (m & kWrReadMask) {
    fill_read(x, w, k);
  } else if (m & kWrAtomicMask) {
    fill_atomic(x, w, m, k);
  } else if (m & kWrFlushMask) {
    fill_flush(x, w, k);
  } else {
    fill_data(x, w, m, k);
  }
}

// Takes the held ACK of an ack_tail run: the short last segment of the run's requests' GSO
// run when it is shorter than they are (the receiver handles such an ACK first:
// Engine::drain_locked), else a datagram of its own moved ahead of the run's requests, where
// it went without the tail. emit_packet calls it while the batch still has room for it, so
// no request of the run leaves before it.
void place_held_ack(ReqRun& x) {
  if (!x.ack_tail) return;
  x.ack_tail = false;
  const int before = x.tx.size();
  x.tx.allow_tail(true);
  x.e.take_ack(x.qp, x.tx, x.ack_now());
  x.tx.allow_tail(false);
  if (x.tx.size() > before && x.tail_first < before) x.tx.move_last_to(x.tail_first);
}

// Step 3: writes the packet into the thread's batch (headers, gathered payload, ICRC).
// False (w failed) when the gather fails its local checks.
bool emit_packet(ReqRun& x, SendWqe& w, ReqPkt& k) {
  Engine& e = x.e;
  ReqState& r = x.r;
  TxBatch& tx = x.tx;
  const wire::PacketFields& f = k.f;
  const uint32_t plen = k.plen;
  // A held ACK goes before the batch can fill: a flush would send requests ahead of it.
  if (x.ack_tail && !tx.room_for(2)) place_held_ack(x);
  if (tx.full()) {
    e.flush(tx);
  }
  uint8_t* buf = tx.next();
  OneCopyDesc desc;
  size_t hl;
  uint32_t wire_plen = plen;  // payload bytes on the wire
  if (plen > 0 && one_copy_desc(e, x.qp, w, plen, k.psn, &desc)) {
    wire::PacketFields fd = f;
    fd.tver = wire::kTverOneCopy;
    wire_plen = kOneCopyDescBytes;
    hl = wire::write_roce_headers(buf, fd, wire_plen);
    put_one_copy_desc(buf + hl, desc);
    bump(x.c.ctr, e.counters(), Ctr::kOneCopyTx);
  } else {
    hl = wire::write_roce_headers(buf, f, plen);
    if (plen > 0) {
      WcStatus gs = gather(x.e, x.qp, w, buf + hl, plen, &x.gc);
      if (gs != WcStatus::kSuccess) {
        w.status = gs;
        w.state = WqeState::kError;
        return false;
      }
    }
  }
  wire::Endpoint dst;
  const auto len = static_cast<uint32_t>(wire::roce_len(hl, wire_plen));
  const bool small = wire_plen != plen;  // a descriptor
  if (x.type == QpType::kUd) {
    dst = peer_endpoint(w.av, e.config().udp_port);
    wire::finish_roce(buf, hl, wire_plen,
                      wire::meta_between(e.local_for(dst), dst, tx.ip_id_for(dst, len)));
  } else {
    dst = r.dst;
    wire::finish_roce(buf, hl, wire_plen, r.meta, tx.ip_id_for(dst, len, small));
  }
  tx.commit(dst, len, small);
  k.wire_len = len;
  return true;
}

// Step 4: after a packet is queued — counters, PSNs, AckReq spacing, the WQE's progress.
void advance(ReqRun& x, SendWqe& w, const ReqPkt& k) {
  ReqState& r = x.r;
  bump(x.c.ctr, x.e.counters(), Ctr::kSentPkts);
  if (x.rc && psn_diff(k.psn, r.max_psn) < 0) {
    bump(x.c.ctr, x.e.counters(), Ctr::kRetransPkts);
    bump(x.c.ctr, x.e.counters(), Ctr::kRetransBytes, k.wire_len);
  } else if (x.rc && k.f.ack_req) {
    win_rtt_start(x.c.win, k.psn, x.now());  // first transmission: may be timed
  }
  x.sent = true;
  if (x.rc) r.pkts_since_ackreq = k.f.ack_req ? 0 : r.pkts_since_ackreq + 1;
  r.psn = psn_add(k.psn, k.psn_used);
  if (psn_diff(r.psn, r.max_psn) > 0) r.max_psn = r.psn;
  w.offset += k.plen;
  if (k.last) {
    w.offset = w.length;
    w.state = x.rc ? WqeState::kPending : WqeState::kDone;
    ++r.pos;
  }
}

// Step 5: sends the batch, arms the retransmit timer for what was sent, retires WQEs.
void send_batch(ReqRun& x) {
  CompState& c = x.c;
  x.e.flush(x.tx);
  // The timer counts from after the send: sendmmsg blocks while the socket buffer is full.
  if (x.sent && x.rc && c.timeout_ns != 0 && c.retrans_deadline_ns == 0) {
    x.now_ns = 0;
    comp_arm_retrans(x.e, x.qp, x.now());
  }
  comp_retire(x.e, x.qp);
}

}  // namespace

void req_run(Engine& e, Qp& qp) {
  ReqState& r = qp.req_;
  CompState& c = qp.comp_;
  if (!r.ready || c.dead) return;
  const QpState st = qp.state();
  if (st != QpState::kRts && st != QpState::kSqd) return;
  if (r.rnr_wait) return;

  // Packets already in the thread's batch belong to an outer caller; we flush ours only.
  ReqRun x{e, qp, r, c, e.device(), qp.type(), is_reliable(qp.type()), st, e.tx_batch(),
           e.port().local()};
  Ring<SendWqe>& sq = qp.sq();
  while (r.pos < sq.size()) {
    x.now_ns = 0;
    SendWqe& w = sq.at(r.pos);
    const Pick pick = pick_wqe(x, w);
    if (pick == Pick::kStop) break;
    if (pick == Pick::kNext) {
      ++r.pos;
      continue;
    }
    if (window_full(x)) break;
    // Every request goes after the ACK this QP's responder owes (Engine::take_ack).
    if (!x.sent) {
      // With GSO and nothing watching the packets, the held ACK is taken after the requests
      // instead, as the last segment of their datagram (below): one datagram per answer.
      if (e.config().ack_tail && e.gso() && !e.fault_engine_attached()) {
        x.ack_tail = true;
        x.tx.close_run();
        x.tail_first = x.tx.size();
      } else {
        e.take_ack(qp, x.tx, x.ack_now());
      }
    }
    ReqPkt k;
    build_packet(x, w, k);
    if (!emit_packet(x, w, k)) break;
    advance(x, w, k);
    if (k.last) x.gc.reset();
    // A post waits for the send lock (Qp::post_waiting): let it in at this message boundary.
    // Only on RC/XRC with a retransmit timer (timeout != 0), where the message's last packet
    // asked for an ACK and send_batch below arms the timer: the ACK (or the timer) runs the
    // requester again for what is left, as for a post that doorbell batching deferred.
    // Without the timer a lost last packet or ACK would leave the rest unsent for good.
    if (k.last && x.rc && x.c.timeout_ns != 0 && qp.post_waiting()) break;
  }
  x.gc.reset();
  place_held_ack(x);
  send_batch(x);
}

void req_probe(Engine& e, Qp& qp) {
  ReqState& r = qp.req_;
  CompState& c = qp.comp_;
  if (!r.ready || c.dead || !is_reliable(qp.type())) return;
  const QpState st = qp.state();
  if (st != QpState::kRts && st != QpState::kSqd) return;
  Ring<SendWqe>& sq = qp.sq();
  const uint32_t limit = std::min(r.pos + 1, sq.size());
  for (uint32_t i = 0; i < limit; ++i) {
    const SendWqe& cur = sq.at(i);
    if (cur.state != WqeState::kPending && cur.state != WqeState::kProcessing) continue;
    if (psn_diff(c.psn, cur.first_psn) < 0 || psn_diff(c.psn, cur.last_psn) > 0) return;
    // A copy: the probe leaves the WQE's progress (and r.psn) alone.
    SendWqe w = cur;
    const uint32_t m = wr_mask(qp.type(), w.opcode);
    const auto done = static_cast<uint64_t>(psn_diff(c.psn, w.first_psn));
    w.offset = (m & kWrAtomicMask) ? 0 : std::min<uint64_t>(done * r.mtu, w.length);
    seek(w);
    ReqRun x{e, qp, r, c, e.device(), qp.type(), true, st, e.tx_batch(), e.port().local()};
    ReqPkt k;
    build_packet(x, w, k);
    k.f.ack_req = true;  // the answer is the point of the probe
    if (emit_packet(x, w, k)) {
      bump(c.ctr, e.counters(), Ctr::kSentPkts);
      bump(c.ctr, e.counters(), Ctr::kRetransPkts);
      bump(c.ctr, e.counters(), Ctr::kRetransBytes, k.wire_len);
      win_rtt_cancel(c.win);
    }
    e.flush(x.tx);
    return;
  }
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
    if (done > 0 && psn_diff(c.psn, w.last_psn) <= 0 &&
        !(wr_mask(qp.type(), w.opcode) & kWrAtomicMask)) {
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
  c.win.probe_out = false;
  c.win.sel_out = false;
  win_rtt_cancel(c.win);  // Karn: no RTT sample across a retransmission
}

}  // namespace rnic::emu
