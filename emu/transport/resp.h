// emu/transport/resp.h: the responder (IBA ch. 9 responder role; rxe_resp.c): PSN / opcode-sequence /
// access / resource / length / rkey checks in that order, execution of SEND, WRITE, READ and
// ATOMIC requests, receive completions, ACK/NAK/RNR NAK generation, duplicate handling from
// the responder resources (READ replayed from memory, ATOMIC from the saved value), UC drop
// rules and UD delivery with the 40-byte GRH area.
#pragma once

#include <cstdint>

#include "emu/objects/qp.h"
#include "wire/packet.h"
#include "wire/port.h"

namespace rnic::emu {

class Engine;
class TxBatch;

enum class RespOutcome : uint8_t {
  kOk,        // handled without executing (dropped, NAKed, RNR, answered as a duplicate; UD)
  kAccepted,  // RC/UC request in sequence that passed every check and was executed
  kFatal,     // the responder hit a Class A/C/G/J error: the caller must move the QP to ERR
};

// One request packet (kReqMask opcodes) for qp, after the ingress checks. Runs in the
// engine's receive context (its replies go to e.rx_batch()). REQUIRES: qp's receive lock.
// Hot path: no allocation.
RespOutcome resp_on_packet(Engine& e, Qp& qp, const wire::PacketView& p, const wire::RxDesc& d);

// Sends the ACK the responder deferred for qp (ACK coalescing), if any. Called by the engine
// at the end of each receive batch with now_ns, or 0 where this batch holds no ACK. True if
// the ACK is held instead (RespState::ack_hold): the engine lists qp and calls
// resp_release_ack when the hold ends. REQUIRES: receive lock; receive context.
bool resp_flush_ack(Engine& e, Qp& qp, uint64_t now_ns);

// A held ACK's time is up: sends it if no requester run took it, and stops holding qp's ACKs.
// REQUIRES: receive lock; receive context.
void resp_release_ack(Engine& e, Qp& qp);

// The held ACK (RespState::ack_held, its receive batch ended), taken by a requester run of
// qp (Engine::take_ack, at its first packet) into that thread's batch `tx`, ahead of the
// requests it sends: one sendmmsg for both, and in a ping-pong the reply carries the ACK of the
// message it answers instead of the receive context sending it alone. The ACK still precedes
// the reply (an ib_send_lat -e requester needs its send CQE before the reply; drain_locked's
// CqEventHold). An ACK still listed in a receive batch is left to that batch. A post that
// finds an ACK owed, or comes less than hold_ns after one went alone, turns holding on for
// qp. True if an ACK is now in tx. REQUIRES: receive lock (any context).
// *answering (if given): this run answers a message of the peer (an ACK was owed, or went
// less than hold_ns ago), as ReqState::answers wants it.
bool resp_take_ack(Engine& e, Qp& qp, TxBatch& tx, uint64_t now_ns, uint64_t hold_ns,
                   bool* answering = nullptr);

// The ACK owed by qp in the receive batch this thread is running, into that batch now (the
// caller flushes it before its requests). True if one was owed. REQUIRES: receive lock;
// receive context.
bool resp_send_owed_ack(Engine& e, Qp& qp);

enum class ReplayResult : uint8_t {
  kDone,   // no replay in progress any more: qp leaves the engine's replay list
  kMore,   // more slices to send
  kFatal,  // a response failed its rkey re-check: NAK sent, the caller moves the QP to ERR
};

// Sends the next slice (at most kReplaySlice packets, resp.cc) of the duplicate READ replay
// qp has in progress. Called by the engine once per receive round for each listed QP.
// REQUIRES: receive lock; receive context.
ReplayResult resp_replay_slice(Engine& e, Qp& qp);

// Completes a receive WQE the responder holds (a message in progress) with WR_FLUSH_ERR
// and resets the message state. Called on the transition to ERR, before emu flushes the
// rest of the RQ. REQUIRES: receive lock.
void resp_flush_held(Qp& qp);

// Empties qp's out-of-sequence stash (its slots back to the engine's pool). Any QP state
// change, error, flush or destroy; REQUIRES: the receive lock (or the QP unreachable).
void resp_stash_clear(Engine& e, Qp& qp);

}  // namespace rnic::emu
