// emu/transport/req.h: the requester (IBA ch. 9 "requester" role; rxe_req.c): turns send WQEs into
// packets — segmentation by path MTU, PSN assignment, AckReq, fences, initiator depth, the
// RC window — executes local ops (LOCAL_INV, BIND_MW) inline, and goes back N on retry.
// Also scatter_sges, the receive-side copy the responder uses.
#pragma once

#include <cstddef>
#include <cstdint>

#include "emu/objects/qp.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/port.h"

namespace rnic::emu {

class Engine;

// Most PSNs the requester runs ahead of the oldest unacknowledged one (rxe: 128; 512 keeps a
// loopback pipe full at 4 KiB MTU while fitting the 8 MiB socket buffers).
inline constexpr uint32_t kMaxUnackedPsns = 512;
// AckReq at least every this many packets of one QP (rxe RXE_MAX_PKT_PER_ACK).
inline constexpr uint32_t kMaxPktsPerAck = 64;

// Emits packets for the QP's send queue from req_.pos on, as far as the window, fences,
// initiator depth and RNR wait allow, then retires completed WQEs (comp_retire).
// REQUIRES: qp's send lock held. Hot path: no allocation.
void req_run(Engine& e, Qp& qp);

// Go back to comp_.psn (the NAK's PSN, or the oldest unacknowledged one after a timeout);
// what follows goes out again as the window (comp_.win.cwnd, window.h) allows, never the
// whole 512-PSN window per event. WQEs not yet fully acknowledged are re-armed; a partially
// acknowledged SEND/WRITE resumes at its first unacknowledged packet and a partially
// answered READ is re-issued for its remaining bytes. REQUIRES: send lock.
void req_retry(Engine& e, Qp& qp);

// Probe (docs/congestion.md): sends the packet at comp_.psn once more, with AckReq, leaving the
// requester's progress alone. If a NAK or the last ACKs were lost, its answer restarts the
// exchange; if they were only late, it costs one duplicate. REQUIRES: send lock.
void req_probe(Engine& e, Qp& qp);

// Number of packets (= PSNs) a message of `len` bytes takes at `mtu` (at least 1).
inline uint32_t num_pkts(uint64_t len, uint32_t mtu) {
  return len == 0 ? 1u : static_cast<uint32_t>((len + mtu - 1) / mtu);
}

// Packets are written with wire's one writer (wire/packet.h: write_roce_headers, the payload
// gathered in place, finish_roce) and IpUdpMeta comes from wire::meta_between (wire/port.h).

// Copies len bytes into the scatter list sges[0..n) starting at byte `offset` of the list,
// checking each piece locally (lkey, PD, LOCAL_WRITE, range). kLocLenErr if the list is too
// short; the local error status of the failed piece otherwise. (Responder receive path.)
// Each piece's MR is held (AccessGuard) while it is written; a write that faults returns
// kLocProtErr and counts Ctr::kMemFault in qp_ctr and dev_ctr when given.
// Called from a receive drain (Engine::drain_scatter_cache: one batch), a piece whose MR a
// check kept from earlier in the batch covers is written without looking its key up again.
WcStatus scatter_sges(Device& dev, const Pd* pd, const Sge* sges, uint32_t n, uint64_t offset,
                      const uint8_t* data, uint64_t len, Counters* qp_ctr = nullptr,
                      Counters* dev_ctr = nullptr);

}  // namespace rnic::emu
