// emu/transport/comp.h: the completer (IBA ch. 9 requester side "completion"; rxe_comp.c): consumes
// ACKs, NAKs, READ responses and ATOMIC ACKs, completes send WQEs in order, drives go-back-N
// retries, the retransmit and RNR timers and their retry counters, and fails the QP on a
// fatal completion.
#pragma once

#include <cstdint>

#include "emu/objects/qp.h"
#include "wire/packet.h"

namespace rnic::emu {

class Engine;

// One response packet (kAckMask opcodes) for qp, after ingress checks. May run the
// requester (window opened, retry). REQUIRES: qp's send lock held.
void comp_on_packet(Engine& e, Qp& qp, const wire::PacketView& p);

// Fires qp's retransmit / RNR timers that are due at now_ns. REQUIRES: send lock.
void comp_on_timer(Engine& e, Qp& qp, uint64_t now_ns);

// Pops finished WQEs from the SQ head in order (CQE if signaled or failed; IBA 10.7.3.1).
// A failed WQE moves an RC QP to ERR (a UC/UD QP to SQE) and flushes. REQUIRES: send lock;
// takes the receive lock when the QP must change state.
void comp_retire(Engine& e, Qp& qp);

// In SQD, reports SQ_DRAINED (if en_sqd_async_notify) once no WQE is in flight any more.
// REQUIRES: send lock.
void comp_check_sq_drained(Qp& qp);

// Arms the retransmit timers that are off (docs/congestion.md): the IBA local ACK timer
// (timeout_ns << backoff; its expiry spends a retry_cnt) and, when it would fire earlier, the
// RTT-based probe timer (resends the oldest unacknowledged packet, spends nothing).
// comp_.retrans_deadline_ns is the earlier of the two. REQUIRES: send lock.
void comp_arm_retrans(Engine& e, Qp& qp, uint64_t now_ns);
// Both retransmit timers off.
void comp_disarm_retrans(CompState& c);

// A RoCEv2 CNP (opcode 0x81) addressed to qp: an RC requester halves its sending window (at
// most once per window of data). REQUIRES: send lock.
void comp_on_cnp(Engine& e, Qp& qp);

// IBA RNR NAK timer field (Table 45) in nanoseconds: 0 -> 655.36 ms, 1 -> 10 us ... 31 ->
// 491.52 ms.
uint64_t rnr_timer_ns(uint8_t code);
// Local ACK timeout 4.096 us * 2^timeout in ns; 0 -> no timer.
uint64_t ack_timeout_ns(uint8_t timeout);

}  // namespace rnic::emu
