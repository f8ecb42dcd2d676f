// emu/transport_state.h: per-QP state of the transports (requester, responder, completer),
// embedded in Qp as req_/resp_/comp_. Owned by the transports helper from here on: emu's
// object model only constructs them (value-initialised) and never reads them.
#pragma once

namespace rnic::emu {

// Requester state (req.cc). Guarded by the QP send lock.
struct ReqState {};
// Responder state (resp.cc). Guarded by the QP receive lock.
struct RespState {};
// Completer state (comp.cc). Guarded by the QP send lock.
struct CompState {};

}  // namespace rnic::emu
