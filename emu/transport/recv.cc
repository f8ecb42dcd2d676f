// emu/transport/recv.cc: ingress checks in the order of docs/checks.md §2.1 (ICRC first), then
// dispatch to resp (requests) or comp (responses); each drop logs one rate-limited line.
#include "emu/transport/recv.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "emu/transport/comp.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/transport/resp.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/psn.h"

namespace rnic::emu {

EndpointText::EndpointText(const wire::Endpoint& ep) {
  char ip[INET6_ADDRSTRLEN] = "?";
  (void)inet_ntop(ep.ipv6 ? AF_INET6 : AF_INET, ep.addr, ip, sizeof(ip));
  std::snprintf(s_, sizeof(s_), ep.ipv6 ? "[%s]:%u" : "%s:%u", ip, unsigned{ep.port});
}

const char* opcode_log_name(uint8_t opcode) {
  const char* n = wire::opcode_info(opcode).name;
  return n != nullptr ? n : "UNKNOWN";
}

// Largest payload one packet carries (path MTU 4096).
constexpr uint32_t kOneCopyMaxLen = 4096;

bool resolve_one_copy(Engine& e, const wire::RxDesc& d, wire::PacketView* p) {
  Counters& dc = e.counters();
  OneCopy* oc = e.one_copy();
  OneCopyDesc desc;
  const char* why = nullptr;
  const uint8_t* src = nullptr;
  if (oc == nullptr) {
    why = "one-copy descriptor, but one-copy is off";
  } else if (!wire::is_rc(p->opcode) || !p->has(wire::kReqMask) ||
             !(p->has(wire::kSendMask) || p->has(wire::kWriteMask))) {
    why = "one-copy descriptor on an opcode other than an RC SEND or WRITE";
  } else if (!get_one_copy_desc(p->payload_span(), &desc) || desc.len == 0 ||
             desc.len > kOneCopyMaxLen) {
    why = "malformed one-copy descriptor";
  } else if ((src = oc->resolve(desc)) == nullptr) {
    why = "one-copy descriptor names no memory its peer shared (token, id or range)";
  }
  if (why != nullptr) {
    dc.add(Ctr::kDropOneCopy);
    RNIC_PKT_LOG("drop", why, Ctr::kDropOneCopy, d.src, p->bth().dest_qp(), p->opcode,
                 p->bth().psn());
    return false;
  }
  dc.add(Ctr::kOneCopyRx);
  p->payload = src;
  p->payload_len = desc.len;
  return true;
}

namespace {

// BTH fields of a packet that may not have parsed (for a drop line); zero when too short.
struct RawBth {
  uint32_t qpn = 0;
  uint8_t opcode = 0;
  uint32_t psn = 0;
};
RawBth raw_bth(std::span<const uint8_t> roce) {
  RawBth r;
  if (roce.size() < wire::kBthBytes) return r;
  wire::ConstBth b(roce.data());
  r.qpn = b.dest_qp();
  r.opcode = b.opcode();
  r.psn = b.psn();
  return r;
}

// XRC: requests go to the target (XRC_RECV), responses to the initiator (XRC_SEND).
bool type_matches(QpType t, uint8_t opcode, bool is_req) {
  switch (t) {
    case QpType::kRc: return wire::is_rc(opcode);
    case QpType::kUc: return wire::is_uc(opcode);
    case QpType::kUd: return wire::is_ud(opcode);
    case QpType::kXrcSend: return wire::is_xrc(opcode) && !is_req;
    case QpType::kXrcRecv: return wire::is_xrc(opcode) && is_req;
  }
  return false;
}

// P_Key match (IBA 10.9.3): base keys equal and at least one full member. The only table
// entry is the full-member default 0xFFFF.
bool pkey_ok(uint16_t pkey) { return (pkey & 0x7fff) == 0x7fff; }

enum class AddrCheck : uint8_t { kOk, kOkUnlatched, kBadIp, kBadPort };

// RC/UC address binding (rxe check_addr): the packet came from the QP's peer to us. With the
// opt-in strict source check (DeviceConfig::strict_src) the UDP source port must also match:
// a fixed port, or the port latched per QP. kOkUnlatched: latching mode and no port latched
// yet — the packet goes on to the transport checks and latch_src() latches its port only if
// it passed all of them (issue 10 item 4: junk from another port must not win the latch).
// REQUIRES: one of the QP's locks (av()).
AddrCheck addr_ok(Engine& e, Qp& qp, const wire::RxDesc& d) {
  if (qp.type() == QpType::kUd) return AddrCheck::kOk;
  const Av& av = qp.av();
  // From the DGID's address, to the SGID's (IPv4 or IPv6).
  if (av.ipv4 ? (d.src.ipv6 || d.src.v4_host() != av.dest_ipv4)
              : (!d.src.ipv6 || std::memcmp(d.src.addr, av.dgid, 16) != 0))
    return AddrCheck::kBadIp;
  const std::vector<GidEntry>& gids = e.device().gids();
  const bool dst_known = d.dst.ipv6 || d.dst.v4_host() != 0;
  if (dst_known && (av.sgid_index >= gids.size() || !d.dst.same_ip(gids[av.sgid_index].addr)))
    return AddrCheck::kBadIp;
  const uint32_t mode = e.device().strict_src_mode();
  if (mode == 0) return AddrCheck::kOk;
  const uint32_t port = d.src.port;
  if (mode & Device::kStrictFixed)
    return port == (mode & 0xffffu) ? AddrCheck::kOk : AddrCheck::kBadPort;
  const uint32_t cur = qp.comp_.src_latch.load(std::memory_order_relaxed);
  if (cur == 0) return AddrCheck::kOkUnlatched;
  return cur == (0x10000u | port) ? AddrCheck::kOk : AddrCheck::kBadPort;
}

// Latches d's UDP source port on qp after a packet from it passed every transport check.
// Requests (receive lock) and responses (send lock) may race: the first accepted one wins.
void latch_src(Qp& qp, const wire::RxDesc& d) {
  uint32_t cur = 0;
  (void)qp.comp_.src_latch.compare_exchange_strong(cur, 0x10000u | d.src.port,
                                                   std::memory_order_relaxed);
}

// Counts and logs a failed address check (IP mismatch or strict source port).
void count_addr_drop(AddrCheck a, Counters& qc, Counters& dc, const wire::RxDesc& d,
                     const wire::PacketView& p) {
  const auto bth = p.bth();
  if (a == AddrCheck::kBadPort) {
    bump(qc, dc, Ctr::kDropSrcPort);
    RNIC_PKT_LOG("drop", "strict source check refused the UDP source port", Ctr::kDropSrcPort,
                 d.src, bth.dest_qp(), p.opcode, bth.psn());
  } else {
    bump(qc, dc, Ctr::kDropAddr);
    RNIC_PKT_LOG("drop", "source/destination IP is not the QP's peer", Ctr::kDropAddr, d.src,
                 bth.dest_qp(), p.opcode, bth.psn());
  }
}

// Step 1: ICRC first: a corrupted packet must never touch QP state (docs/checks.md §2.1 item 7).
// IP-ID policy (docs/wire.md §3): the socket hides the IPv4 ID the ICRC covers. Try ID 0
// (Linux with DF on an unconnected socket, most hardware), then the ID this segment of a GRO
// buffer left with (base + k: a GSO sender), then solve for the one ID that matches (hardware
// peers choosing incrementing or random IDs, a cut GSO batch). One CRC pass.
bool icrc_ok(Counters& dc, const wire::RxDesc& d, std::span<const uint8_t> roce,
             uint32_t seg_index) {
  if (roce.size() < wire::kBthBytes + wire::kIcrcBytes) {
    dc.add(Ctr::kDropMalformed);
    RNIC_PKT_LOG("drop", "datagram shorter than BTH + ICRC", Ctr::kDropMalformed, d.src,
                 raw_bth(roce).qpn, raw_bth(roce).opcode, raw_bth(roce).psn);
    return false;
  }
  const wire::IpUdpMeta meta = wire::meta_between(d.src, d.dst);
  const wire::IcrcVerdict iv = wire::icrc_verify_rx(
      meta, roce, static_cast<uint16_t>(d.ip_id + seg_index));
  switch (iv.match) {
    case wire::IcrcMatch::kIdZero: dc.add(Ctr::kIcrcIdZero); return true;
    case wire::IcrcMatch::kIdHint: dc.add(Ctr::kIcrcIdGro); return true;
    case wire::IcrcMatch::kIdSolved: dc.add(Ctr::kIcrcIdSolved); return true;
    case wire::IcrcMatch::kNone: break;
  }
  dc.add(Ctr::kIcrcErr);
  RNIC_PKT_LOG("drop", "bad ICRC", Ctr::kIcrcErr, d.src, raw_bth(roce).qpn,
               raw_bth(roce).opcode, raw_bth(roce).psn);
  return false;
}

// Step 2: parse (lengths, TVer, opcode) and keep requests, responses and CNPs (on_cnp).
// False: dropped.
bool parse_ok(Engine& e, const wire::RxDesc& d, std::span<const uint8_t> roce,
              wire::PacketView* p) {
  Counters& dc = e.counters();
  if (wire::ParseError pe = wire::parse_roce(roce, p, e.one_copy() != nullptr);
      pe != wire::ParseError::kOk) {
    dc.add(Ctr::kDropMalformed);
    RNIC_PKT_LOG_D("drop", "malformed:", wire::parse_error_name(pe), Ctr::kDropMalformed,
                   d.src, raw_bth(roce).qpn, raw_bth(roce).opcode, raw_bth(roce).psn);
    return false;
  }
  if (p->bth().tver() == wire::kTverOneCopy && !resolve_one_copy(e, d, p)) return false;
  if (wire::is_cnp(p->opcode)) return true;
  if (!p->has(wire::kReqMask) && !p->has(wire::kAckMask)) {
    dc.add(Ctr::kDropBadState);
    RNIC_PKT_LOG("drop", "neither a request nor a response (CNP?)", Ctr::kDropBadState, d.src,
                 p->bth().dest_qp(), p->opcode, p->bth().psn());
    return false;
  }
  return true;
}

// Step 3: the destination QP (0 and the multicast QPN are not served). nullptr: dropped.
std::shared_ptr<Qp> find_dest_qp(Engine& e, const wire::RxDesc& d, const wire::PacketView& p) {
  Counters& dc = e.counters();
  const auto bth = p.bth();
  const uint32_t qpn = bth.dest_qp();
  if (qpn == 0 || qpn == wire::kPsnMask) {
    dc.add(Ctr::kDropUnknownQpn);
    RNIC_PKT_LOG("drop", "QP0 / multicast QPN not served", Ctr::kDropUnknownQpn, d.src, qpn,
                 p.opcode, bth.psn());
    return nullptr;
  }
  std::shared_ptr<Qp> qp = e.rx_find_qp(qpn);
  if (!qp) {
    dc.add(Ctr::kDropUnknownQpn);
    RNIC_PKT_LOG("drop", "unknown QPN", Ctr::kDropUnknownQpn, d.src, qpn, p.opcode, bth.psn());
  }
  return qp;
}

// QP1 (emu/transport/gsi.h): UD SEND_ONLY, default P_Key, GSI Q_Key, then the handler.
void deliver_gsi(Engine& e, const wire::RxDesc& d, const wire::PacketView& p) {
  Counters& dc = e.counters();
  const auto bth = p.bth();
  GsiHandler* h = e.gsi_handler();
  if (h == nullptr) {
    dc.add(Ctr::kDropUnknownQpn);
    RNIC_PKT_LOG("drop", "QP1 (GSI) has no CM agent", Ctr::kDropUnknownQpn, d.src, kGsiQpn,
                 p.opcode, bth.psn());
    return;
  }
  if (p.opcode != wire::op::kUdSendOnly) {
    dc.add(Ctr::kDropBadState);
    RNIC_PKT_LOG("drop", "QP1 takes only UD SEND_ONLY", Ctr::kDropBadState, d.src, kGsiQpn,
                 p.opcode, bth.psn());
    return;
  }
  if (!pkey_ok(bth.pkey())) {
    dc.add(Ctr::kBadPkeyCntr);
    e.device().count_bad_pkey();
    RNIC_PKT_LOG("drop", "bad P_Key", Ctr::kBadPkeyCntr, d.src, kGsiQpn, p.opcode, bth.psn());
    return;
  }
  if (p.deth().qkey() != kGsiQkey) {
    dc.add(Ctr::kQkeyViolCntr);
    e.device().count_qkey_viol();
    RNIC_PKT_LOG("drop", "Q_Key is not the GSI key", Ctr::kQkeyViolCntr, d.src, kGsiQpn,
                 p.opcode, bth.psn());
    return;
  }
  dc.add(Ctr::kRcvdPkts);
  GsiPacket g;
  g.src = d.src;
  g.dst = d.dst;
  g.src_qpn = p.deth().src_qp();
  g.pkey = bth.pkey();
  g.tos = d.tos;
  g.payload = p.payload_span();
  h->on_gsi_packet(g);
}

// Steps 4 and 5: QP type vs opcode class, QP state (requests: responder in RTR or later;
// responses: requester in RTS/SQD), P_Key.
bool qp_accepts(Engine& e, Qp& qp, const wire::RxDesc& d, const wire::PacketView& p,
                bool is_req) {
  Counters& dc = e.counters();
  Counters& qc = qp.comp_.ctr;
  const auto bth = p.bth();
  const uint32_t qpn = bth.dest_qp();
  const QpState st = qp.state();
  const bool state_ok = is_req ? (st == QpState::kRtr || st == QpState::kRts ||
                                  st == QpState::kSqd || st == QpState::kSqe)
                               : (st == QpState::kRts || st == QpState::kSqd);
  if (!type_matches(qp.type(), p.opcode, is_req)) {
    bump(qc, dc, Ctr::kDropBadState);
    RNIC_PKT_LOG_D("drop", "opcode is not for a QP of type", qp_type_name(qp.type()),
                   Ctr::kDropBadState, d.src, qpn, p.opcode, bth.psn());
    return false;
  }
  if (!state_ok) {
    bump(qc, dc, Ctr::kDropBadState);
    RNIC_PKT_LOG_D("drop", is_req ? "request refused in QP state" : "response refused in QP state",
                   qp_state_name(st), Ctr::kDropBadState, d.src, qpn, p.opcode, bth.psn());
    return false;
  }
  if (!pkey_ok(bth.pkey())) {
    bump(qc, dc, Ctr::kBadPkeyCntr);
    e.device().count_bad_pkey();
    RNIC_PKT_LOG("drop", "bad P_Key", Ctr::kBadPkeyCntr, d.src, qpn, p.opcode, bth.psn());
    return false;
  }
  return true;
}

// Step 6 for a request, under the QP's receive lock: address binding (RC/UC) and Q_Key (UD),
// then the responder. A fatal outcome moves the QP to ERR after the receive lock is released
// (lock order is send -> receive).
void deliver_request(Engine& e, Qp& qp, const wire::RxDesc& d, const wire::PacketView& p) {
  Counters& dc = e.counters();
  Counters& qc = qp.comp_.ctr;
  const auto bth = p.bth();
  const uint32_t qpn = bth.dest_qp();
  RespOutcome out;
  RespState::TmRndv rndv;
  {
    std::lock_guard lk(qp.recv_mutex());
    if (qp.comp_.dead) {
      RNIC_PKT_LOG_NC("drop", "QP is being destroyed", d.src, qpn, p.opcode, bth.psn());
      return;
    }
    const AddrCheck a = addr_ok(e, qp, d);
    if (a != AddrCheck::kOk && a != AddrCheck::kOkUnlatched) {
      count_addr_drop(a, qc, dc, d, p);
      return;
    }
    if (qp.type() == QpType::kUd && p.deth().qkey() != qp.attr().qkey) {
      bump(qc, dc, Ctr::kQkeyViolCntr);
      e.device().count_qkey_viol();
      RNIC_PKT_LOG("drop", "Q_Key mismatch", Ctr::kQkeyViolCntr, d.src, qpn, p.opcode,
                   bth.psn());
      return;
    }
    bump(qc, dc, Ctr::kRcvdPkts);
    RNIC_TRACE("rx: %s from %s to qpn 0x%x psn %u len %zu -> responder",
               opcode_log_name(p.opcode), EndpointText(d.src).c_str(), qpn, bth.psn(),
               p.payload_len);
    out = resp_on_packet(e, qp, p, d);
    // What a linger_rx, and the hand-back after a drained send queue, wait for: a new request
    // executed. A duplicate (the peer's probe of a request already answered), an RNR NAK or a
    // NAK is not the answer: taking one for it dropped the hand-back, and an application
    // waiting on memory for the real answer waited for the polls' lease (ib_write_lat's rare
    // ~2 ms iterations).
    if (out == RespOutcome::kAccepted) e.answer_came(qp, (p.info->mask & wire::kEndMask) != 0);
    // Only a packet that passed every transport check may take the strict-source latch.
    if (a == AddrCheck::kOkUnlatched && out == RespOutcome::kAccepted) latch_src(qp, d);
    if (qp.resp_.tm_pend.valid) {
      rndv = qp.resp_.tm_pend;
      qp.resp_.tm_pend.valid = false;
    }
  }
  if (rndv.valid && out != RespOutcome::kFatal) {
    // Tag matching RNDV: the READ + FIN go on the send queue (send lock; not under receive).
    std::lock_guard lk(qp.send_mutex());
    if (!qp.comp_.dead) qp.tm_rndv_start_locked(rndv);
  }
  if (out == RespOutcome::kFatal) {
    // Class A/C/G/J: the responder's QP goes to ERR.
    std::scoped_lock lk(qp.send_mutex(), qp.recv_mutex());
    if (!qp.comp_.dead && qp.state() != QpState::kErr) qp.enter_error_locked(false);
  }
}

// A RoCEv2 CNP (congestion notification, opcode 0x81) for qp: counted; from the QP's peer, an
// RC requester halves its sending window (docs/congestion.md). It never touches other state.
void on_cnp(Engine& e, Qp& qp, const wire::RxDesc& d, const wire::PacketView& p) {
  Counters& dc = e.counters();
  Counters& qc = qp.comp_.ctr;
  qc.add(Ctr::kCnpRcvd);  // (the device counter: recv_packet)
  RNIC_TRACE("rx: CNP from %s for qpn 0x%x", EndpointText(d.src).c_str(), p.bth().dest_qp());
  std::lock_guard lk(qp.send_mutex());
  if (qp.comp_.dead || !is_reliable(qp.type()) || qp.type() == QpType::kXrcRecv) return;
  const AddrCheck a = addr_ok(e, qp, d);
  if (a != AddrCheck::kOk && a != AddrCheck::kOkUnlatched) {
    count_addr_drop(a, qc, dc, d, p);
    return;
  }
  comp_on_cnp(e, qp);
}

// Step 6 for a response, under the QP's send lock: address binding, then the completer.
void deliver_response(Engine& e, Qp& qp, const wire::RxDesc& d, const wire::PacketView& p) {
  Counters& dc = e.counters();
  Counters& qc = qp.comp_.ctr;
  const auto bth = p.bth();
  const uint32_t qpn = bth.dest_qp();
  std::lock_guard lk(qp.send_mutex());
  if (qp.comp_.dead) {
    RNIC_PKT_LOG_NC("drop", "QP is being destroyed", d.src, qpn, p.opcode, bth.psn());
    return;
  }
  const AddrCheck a = addr_ok(e, qp, d);
  if (a != AddrCheck::kOk && a != AddrCheck::kOkUnlatched) {
    count_addr_drop(a, qc, dc, d, p);
    return;
  }
  bump(qc, dc, Ctr::kRcvdPkts);
  RNIC_TRACE("rx: %s from %s to qpn 0x%x psn %u len %zu -> completer",
             opcode_log_name(p.opcode), EndpointText(d.src).c_str(), qpn, bth.psn(),
             p.payload_len);
  // A response passed every completer check when it acknowledged something: the oldest
  // unacknowledged PSN moved (comp.cc); only then may it latch the strict source port.
  const uint32_t acked_before = qp.comp_.psn;
  comp_on_packet(e, qp, p);
  if (qp.comp_.psn != acked_before) {
    if (a == AddrCheck::kOkUnlatched) latch_src(qp, d);
    // The ACK of a ping-pong's last message: the peer's answer follows it in one sendmmsg.
    // Only when something the peer's application sees went since the queue last drained
    // (CompState::answerable: a SEND, WRITE, ATOMIC_WRITE or FLUSH), which it may answer
    // while this one waits on memory. A READ or CMP_SWAP / FETCH_ADD alone is never seen
    // there, so nothing answers it, and the application posts or polls again (ib_read_lat:
    // handing receive back before each READ cost two epoll_ctl a round trip). One that waits
    // on memory for something else all the same has it handled when the polls' lease runs
    // out (busy_poll_ns).
    if (qp.sq().empty()) {
      if (qp.comp_.answerable) {
        e.sq_drained(qp);
        if (qp.req_.answers) e.linger_rx(qp);
      }
      qp.comp_.answerable = false;
    }
  }
}

// A datagram to the multicast QPN (IBA 10.5.2): one copy to every UD QP of this device
// attached to the group it was sent to (the MGID of its IP destination), each with that
// QP's own type, state, P_Key and Q_Key checks. Only a multicast IP destination counts.
void deliver_mcast(Engine& e, const wire::RxDesc& d, const wire::PacketView& p) {
  Counters& dc = e.counters();
  const auto bth = p.bth();
  if (!d.dst.multicast() || !p.has(wire::kReqMask)) {
    dc.add(Ctr::kDropUnknownQpn);
    RNIC_PKT_LOG("drop", "multicast QPN on a unicast datagram", Ctr::kDropUnknownQpn, d.src,
                 bth.dest_qp(), p.opcode, bth.psn());
    return;
  }
  uint8_t mgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (d.dst.ipv6) {
    std::memcpy(mgid, d.dst.addr, 16);
  } else {
    std::memcpy(mgid + 12, d.dst.addr, 4);
  }
  uint32_t qpns[kMaxMcastQpAttach];
  const size_t n = e.device().mcast_members(mgid, qpns, kMaxMcastQpAttach);
  if (n == 0) {
    dc.add(Ctr::kDropUnknownQpn);
    RNIC_PKT_LOG("drop", "no QP attached to the multicast group", Ctr::kDropUnknownQpn, d.src,
                 bth.dest_qp(), p.opcode, bth.psn());
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    std::shared_ptr<Qp> qp = e.device().find_qp(qpns[i]);
    if (!qp || qp->type() != QpType::kUd) continue;
    if (!qp_accepts(e, *qp, d, p, true)) continue;
    deliver_request(e, *qp, d, p);
  }
}

}  // namespace

// Ingress in the order of docs/checks.md §2.1; each step counts and logs what it drops.
void recv_packet(Engine& e, const wire::RxDesc& d, std::span<const uint8_t> roce,
                 uint32_t seg_index) {
  Counters& dc = e.counters();
  if (!icrc_ok(dc, d, roce, seg_index)) return;
  // ECN CE marks (IP TOS low bits 11) are counted; the packet is processed as usual.
  if ((d.tos & 3u) == 3u) dc.add(Ctr::kEcnCeRcvd);
  wire::PacketView p;
  if (!parse_ok(e, d, roce, &p)) return;
  if (wire::is_cnp(p.opcode)) {
    dc.add(Ctr::kCnpRcvd);  // counted whatever QP it names
    if (p.bth().dest_qp() == kGsiQpn) return;
    if (std::shared_ptr<Qp> cq = find_dest_qp(e, d, p)) on_cnp(e, *cq, d, p);
    return;
  }
  if (p.bth().dest_qp() == kGsiQpn) {
    deliver_gsi(e, d, p);
    return;
  }
  if (p.bth().dest_qp() == wire::kPsnMask) {
    deliver_mcast(e, d, p);
    return;
  }
  std::shared_ptr<Qp> qp = find_dest_qp(e, d, p);
  if (!qp) return;
  const bool is_req = p.has(wire::kReqMask);
  if (!qp_accepts(e, *qp, d, p, is_req)) return;
  if (is_req) {
    deliver_request(e, *qp, d, p);
  } else {
    deliver_response(e, *qp, d, p);
  }
}

}  // namespace rnic::emu
