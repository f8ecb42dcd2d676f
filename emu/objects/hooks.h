// emu/objects/hooks.h: the interface through which the object model drives the transports
// (requester/responder/completer, written separately). A Device holds at most one
// TransportHooks*; with none (unit tests) WQEs simply stay queued.
#pragma once

#include <cstdint>

#include "emu/objects/types.h"

namespace rnic::emu {

class Qp;
class Cq;
class Srq;

class TransportHooks {
 public:
  virtual ~TransportHooks() = default;
  // New WQEs were appended to qp's send queue. Called with qp's SEND lock held, in the
  // posting thread (run the requester inline here).
  virtual void on_post_send(Qp& qp) = 0;
  // New WQEs were appended to qp's own receive queue (not an SRQ). Called with qp's
  // RECEIVE lock held (e.g. resume a responder waiting in RNR).
  virtual void on_post_recv(Qp& qp) = 0;
  // New WQEs were appended to srq. Called with the SRQ's lock NOT held and no QP lock held.
  virtual void on_post_srq_recv(Srq& srq) { (void)srq; }
  // modify_qp committed a transition from -> to (attributes already updated). Called with
  // BOTH of qp's locks held (send, then receive), before emu flushes queues on ERR.
  // Must not call modify_qp. Also called for same-state modifies (RTS -> RTS).
  virtual void on_modify(Qp& qp, QpState from, QpState to) = 0;
  // destroy_qp(qp) is about to take qp's locks. No emu lock held. The transport finishes
  // what it owes the wire for packets already received (e.g. a coalesced ACK for a message
  // the application has already polled, so that the peer's WQE completes as on hardware).
  virtual void on_before_destroy(Qp& qp) { (void)qp; }
  // qp is being destroyed (already unreachable by QPN lookup). Both locks held. After
  // return the transports must hold no reference to qp's queues or timers.
  virtual void on_destroy(Qp& qp) = 0;
  // destroy_qp(qp) has released qp's locks; qp is out of the QPN table. No emu lock held. The
  // transport lets go of what it kept of qp (Engine: its receive lookups' cache).
  virtual void on_after_destroy(Qp& qp) { (void)qp; }
  // An application thread posted to a send or receive queue (post_send, post_recv, an SRQ's
  // post_recv), whatever the result. Called with no emu lock held, after the queue's own
  // hook: a busy-polling application is in the library here, not away (Engine::on_app_post).
  // `recv_wr`: the post was of receive WQEs (a QP's or an SRQ's post_recv).
  virtual void on_app_post(bool recv_wr = false) { (void)recv_wr; }
  // An application thread enters post_send, which may run long (the requester runs inline,
  // or waits for the QP's send lock): the gap since its last call ends here, and on_app_post
  // marks the end of the call (Engine::on_app_enter). No emu lock held.
  virtual void on_app_enter() {}
  // Cq::poll found cq empty: drive receive inline (try-lock, drain socket, run
  // responder/completer), then return; poll looks again once. No emu lock held.
  virtual void on_poll_empty(Cq& cq) = 0;
  // Cq::poll returns completions of cq. No emu lock held.
  virtual void on_poll_hit(Cq& cq) { (void)cq; }
  // cq's event moderation started a period that ends at deadline_ns (CLOCK_MONOTONIC): call
  // cq.moderation_tick(now) once it has passed. Called from Cq::push with no Cq lock held
  // (QP locks may be). Without an implementation the period cannot be timed and Cq raises
  // the event at once instead (see Cq::set_moderation).
  // The device's first attach of a QP to multicast group `mgid` (join = true), or its last
  // detach (join = false): the transport joins / leaves the IP group it maps to. Called with
  // the device's multicast lock held and no QP lock. Returns 0 or a positive errno (the
  // attach then fails with it). Without an implementation the table alone changes.
  virtual int on_mcast_group(const uint8_t (&mgid)[16], uint8_t sgid_index, bool join) {
    (void)mgid;
    (void)sgid_index;
    (void)join;
    return 0;
  }
  virtual bool on_cq_deadline(Cq& cq, uint64_t deadline_ns) {
    (void)cq;
    (void)deadline_ns;
    return false;
  }
};

}  // namespace rnic::emu
