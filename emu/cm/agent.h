// emu/cm/agent.h: the InfiniBand Communication Manager of one softrnic device, on the wire
// over QP1 (GSI) as RoCEv2 MADs (IBA Vol 1 ch. 12 and 13.4; /work/shared/reference/cm-notes.md
// §3). One Agent per device; it owns the device's QP1 endpoint in the transport.
//
// CHANGES (keep this list: the API is used by librdmacm, rdmacm/; changes are additive)
//   v1 (12:25 UTC, issue 12) first version (header only).
//   v2 (13:30 UTC) implemented (emu/cm/agent.cc); additive: AgentCounters::dropped_overflow.
//   v3 (IPv6 rdma_cm) no API change: an active connection's MADs leave from the device GID
//      equal to Path::local_gid (its socket: an IPv6 GID's own), replies from the GID the
//      MAD arrived on; a passive SIDR's Path::local_gid is that arrival GID.
//   v4 (issue 16) additive: AgentOptions::comm_id_prefix and claim_service (daemon hosting).
//   v5 additive: AgentCounters::reqs_held (a REQ held for a service re-listened soon).
//
// WHAT IT DOES
//   Active side:   send_req -> (kRepReceived -> send_rtu) | kRejReceived | kMraReceived
//                  (timer extended) | kTimeout after 1 + max_cm_retries REQs.
//   Passive side:  listen(service_id) -> kReqReceived (a NEW comm_id, delivered to the
//                  listener's sink) -> send_rep -> kRtuReceived | kTimeout | kRejReceived;
//                  or send_rej / send_mra. A REQ for a service nobody listens on is answered
//                  by the agent itself with REJ reason 8 (kRejInvalidServiceId), LocalCommID 0,
//                  MsgREJed = REQ; the active side gets kRejReceived. Except just after a
//                  listen on that service ID ended (cancel_listen, within kRelistenWindowMs):
//                  a program that listens again on the same port (perftest -R: one connection
//                  to exchange parameters, then the test's own) may not be listening yet when
//                  its peer's next REQ arrives, so the agent holds that REQ (or SIDR_REQ) for
//                  up to kRelistenWindowMs, delivers it if the listen comes, and answers as
//                  above if not. At most kMaxHeld are held; counted in reqs_held.
//   Teardown:      send_dreq -> kDrepReceived (or kTimeout with msg = kDreq) -> timewait;
//                  peer: kDreqReceived -> send_drep -> timewait. Timewait ends with
//                  kTimewaitExit; the comm_id is then released (destroy() is still allowed and
//                  is a no-op). A DREQ for an unknown comm ID draws a stateless DREP, a
//                  duplicate DREQ in timewait a DREP again.
//   Duplicates:    a REQ is identified by (remote CA GUID, remote comm ID): a retransmitted
//                  REQ never makes a second connection; while the REQ is unanswered it draws an
//                  MRA, after the REP a resent REP. A duplicate REP is answered with the RTU
//                  again (RTUs are never retransmitted otherwise). A REQ whose (remote QPN,
//                  remote CA GUID) is still in timewait gets REJ 10 (stale connection).
//   UD (SIDR):     sidr_req -> kSidrRepReceived (status 0 = ok, else the SIDR status) |
//                  kTimeout (msg = kSidrReq); passive: listen -> kSidrReqReceived ->
//                  sidr_rep. No listener -> the agent answers status 1 (kSidrUnsupported).
//   Timers follow Linux (cm-notes §3.8): REQ retry every 2*ms(PLT)+ms(remote CM response
//   timeout) where ms(t) = 2^max(t-8,0) (t is the 5-bit IBA encoding, 4.096 us * 2^t), REP every
//   ms(REQ's local CM response timeout) for 1 + max_cm_retries sends, DREQ like the REQ,
//   SIDR_REQ ms(20) x 16, MRA waits ms(service timeout) + ms(PLT), timewait ms(PLT+1)-ish.
//   AgentOptions::max_wait_ms (SOFTRNIC_CM_MAX_WAIT_MS) caps every one of these waits (tests).
//
// THREADS AND LOCKS
//   * Received MADs arrive on the transport's receive context (progress thread or a poll_cq
//     caller); the agent copies the 256 bytes into its queue and returns at once.
//   * The agent runs ONE thread of its own ("cm" thread): it parses queued MADs, runs the state
//     machines and timers under its mutex, and calls sinks AFTER releasing that mutex, one event
//     at a time, in order. So a sink is always called on the cm thread with NO agent lock and
//     NO transport lock held, and a sink MAY call any Agent method synchronously (send_rep from
//     inside the kReqReceived sink is the normal use). A sink must not block for long: it holds
//     up every other connection's events and timers of this device.
//   * Every public method is thread-safe and never blocks on the network; sends go out from the
//     calling thread.
//   * The Agent must be destroyed before the device's engine stops (~Agent unhooks QP1 and joins
//     the cm thread; no sink is called after ~Agent returns). Do not destroy the Agent from a sink.
//
// ERRORS: methods return 0 or a negative errno: -EINVAL (bad argument: private data / ARI too
// long, QPN > 24 bits, unknown message kind), -ENOENT (no such comm_id), -EPROTO (the comm_id is
// in a state where that message is not allowed, e.g. send_rtu before a REP arrived),
// -EADDRINUSE (listen on a service_id already listened on), -EHOSTUNREACH (path GID that is not
// IPv4-mapped/IPv6-routable), -ESHUTDOWN (agent stopping). send_req / sidr_req return the new
// comm_id (> 0) as int64_t, or a negative errno.
//
// HOW THE rdmacm LIBRARY GETS THE AGENT
//   The embedded host (verbs_shim/host.h) creates one Agent per device right after the engine
//   and the services, and owns it:  rnic::shim::Host::cm_ (std::unique_ptr<rnic::cm::Agent>).
//   From an ibv_context* of the shim (verbs_shim/shim.h, all inline, no exported symbol):
//       rnic::cm::Agent* a = rnic::shim::host_cm_agent(rnic::shim::to_ctx(ctx)->host_);
//   (nullptr if the device has no agent). It lives until the last close of the device.
//   Agent is an abstract class on purpose: a librdmacm.so.1 that gets the pointer across the
//   shared-object boundary calls it through its vtable, so libibverbs.so.1 exports nothing
//   new. Everything else in this header is inline or plain data. Only Agent::create (used by
//   the shim and tests, which link emu/cm) has a symbol.
//   Tests make their own: Agent::create(device, options).
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace rnic::emu {
class Device;
}

namespace rnic::cm {

// ---- wire constants (IBA 13.4, cm-notes §3.1/3.2) ----
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000u;
inline constexpr uint16_t kGsiPkey = 0xFFFF;
inline constexpr size_t kMadBytes = 256;
// A REQ for a service whose listen ended this recently is held that long (see Passive above).
inline constexpr uint64_t kRelistenWindowMs = 1000;
inline constexpr size_t kMaxHeld = 64;

// Private-data capacities (bytes) of each message: the most a caller may pass; events always
// report exactly this many bytes, zero-padded (what the kernel does, apps rely on it).
inline constexpr size_t kReqPrivateBytes = 92;
inline constexpr size_t kMraPrivateBytes = 222;
inline constexpr size_t kRejPrivateBytes = 148;
inline constexpr size_t kRejAriBytes = 72;
inline constexpr size_t kRepPrivateBytes = 196;
inline constexpr size_t kRtuPrivateBytes = 224;
inline constexpr size_t kDreqPrivateBytes = 220;
inline constexpr size_t kDrepPrivateBytes = 224;
inline constexpr size_t kSidrReqPrivateBytes = 216;
inline constexpr size_t kSidrRepPrivateBytes = 136;
inline constexpr size_t kSidrRepInfoBytes = 72;

// REJ reasons (IBA Table 109; cm-notes §3.9).
enum RejReason : uint16_t {
  kRejNoQp = 1,
  kRejNoEec = 2,
  kRejNoResources = 3,
  kRejTimeout = 4,
  kRejUnsupportedReq = 5,
  kRejInvalidCommId = 6,
  kRejInvalidCommInstance = 7,
  kRejInvalidServiceId = 8,
  kRejInvalidTransportType = 9,
  kRejStaleConn = 10,
  kRejRdcNotExist = 11,
  kRejInvalidGid = 12,
  kRejInvalidMtu = 26,
  kRejInsufficientRespResources = 27,
  kRejConsumerDefined = 28,
  kRejInvalidRnrRetry = 29,
  kRejDuplicateLocalCommId = 30,
  kRejInvalidClassVersion = 31,
  kRejVendorOptionNotSupported = 35,
};

// SIDR_REP status (IBA Table 120).
enum SidrStatus : uint8_t {
  kSidrOk = 0,
  kSidrUnsupported = 1,  // no listener for the service ID
  kSidrReject = 2,       // rdma_reject
  kSidrNoQp = 3,
  kSidrRedirect = 4,
  kSidrClassVersion = 5,
};

// Which message an MRA/REJ refers to, or which request timed out (kTimeout).
enum class Msg : uint8_t { kReq = 0, kRep = 1, kOther = 2, kDreq = 3, kSidrReq = 4 };

// Transport service type of the REQ (IBA 12.6.5: 0 RC, 1 UC, 3 XRC).
enum class QpKind : uint8_t { kRc = 0, kUc = 1, kXrc = 3 };

// The path of a connection (what rdma_resolve_route synthesizes on RoCE, cm-notes §5).
// GIDs are raw 16 bytes: ::ffff:a.b.c.d for IPv4 (RoCEv2).
struct Path {
  std::array<uint8_t, 16> local_gid{};   // this device's GID (sgid)
  std::array<uint8_t, 16> remote_gid{};  // the peer's GID (dgid): also where MADs are sent
  uint32_t flow_label = 0;               // 20 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
  uint8_t sl = 0;
  uint8_t mtu = 5;                  // IB MTU enum: 1=256 2=512 3=1024 4=2048 5=4096
  uint8_t packet_lifetime = 18;     // PLT (IBA encoding); Linux cma on RoCE: 18
  uint8_t local_ack_timeout = 19;   // REQ "Local ACK Timeout" (cm_ack_timeout at PLT 18)
  uint16_t pkey = 0xFFFF;
  uint16_t udp_port = 4791;         // destination UDP port of MADs (4791; tests may differ)
};

// send_req. The REQ sender's starting PSN is the PSN IT expects to receive (its rq_psn).
struct ReqParams {
  uint64_t service_id = 0;         // rdma_cm: (port space << 16) | port (cm-notes §3.6)
  uint32_t local_qpn = 0;          // 24 bits
  QpKind qp_type = QpKind::kRc;
  uint32_t starting_psn = 0;       // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 7;         // 3 bits (clamped to 7, like cma)
  uint8_t rnr_retry_count = 7;     // 3 bits (clamped)
  bool flow_control = true;
  bool srq = false;
  uint8_t local_cm_response_timeout = 20;   // 5 bits
  uint8_t remote_cm_response_timeout = 20;  // 5 bits
  uint8_t max_cm_retries = 15;              // 4 bits
  Path path;
  std::span<const uint8_t> private_data;    // <= kReqPrivateBytes (the caller's 36-B CMA
                                            // header included), copied during the call
};

// send_rep (passive side, after kReqReceived).
struct RepParams {
  uint32_t local_qpn = 0;          // 24 bits
  uint32_t starting_psn = 0;       // the PSN the REP sender expects to receive (24 bits)
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 15;   // 5 bits (device local_ca_ack_delay)
  bool flow_control = true;
  uint8_t rnr_retry_count = 7;     // 3 bits
  bool srq = false;
  std::span<const uint8_t> private_data;  // <= kRepPrivateBytes
};

struct RejParams {
  uint16_t reason = kRejConsumerDefined;
  std::span<const uint8_t> ari;           // <= kRejAriBytes
  std::span<const uint8_t> private_data;  // <= kRejPrivateBytes
};

struct MraParams {
  uint8_t service_timeout = 24;           // 5 bits: the peer waits ms(this) + ms(PLT)
  std::span<const uint8_t> private_data;  // <= kMraPrivateBytes
};

// sidr_req: resolve a UD service (rdma_cm PS_UDP).
struct SidrReqParams {
  uint64_t service_id = 0;
  Path path;                              // remote_gid/udp_port: where to send; pkey
  uint8_t timeout = 20;                   // per try: ms(timeout) (5-bit encoding)
  uint8_t max_retries = 15;               // 1 + max_retries sends before kTimeout
  std::span<const uint8_t> private_data;  // <= kSidrReqPrivateBytes
};

struct SidrRepParams {
  uint8_t status = kSidrOk;
  uint32_t qpn = 0;                       // 24 bits
  uint32_t qkey = 0;                      // rdma_cm: 0x01234567
  std::span<const uint8_t> info;          // <= kSidrRepInfoBytes (AdditionalInfo)
  std::span<const uint8_t> private_data;  // <= kSidrRepPrivateBytes
};

enum class EventType : uint8_t {
  kReqReceived,      // passive: new comm_id; remote_* fields, path, private_data (92)
  kRepReceived,      // active: remote_qpn, starting_psn, rr/id, ..., private_data (196)
  kRtuReceived,      // passive: connection established; private_data (224)
  kRejReceived,      // reject_reason, ari, private_data (148); the comm_id is released
  kMraReceived,      // service_timeout; the agent already extended its timer
  kDreqReceived,     // private_data (220); answer with send_drep
  kDrepReceived,     // private_data (224); timewait follows
  kTimeout,          // msg: which request ran out of retries (kReq, kRep, kDreq, kSidrReq);
                     // status = -ETIMEDOUT. After kReq/kRep/kSidrReq the comm_id is released;
                     // after kDreq the id enters timewait.
  kTimewaitExit,     // the comm_id is released
  kSidrReqReceived,  // passive UD: comm_id = a request handle for sidr_rep; private_data (216)
  kSidrRepReceived,  // active UD: sidr_status, qpn, qkey, info, private_data (136); released
};
// "kReqReceived", ... (inline: usable from another shared object without a symbol).
inline const char* event_type_name(EventType t) {
  static constexpr const char* kNames[] = {
      "kReqReceived",  "kRepReceived",  "kRtuReceived", "kRejReceived",
      "kMraReceived",  "kDreqReceived", "kDrepReceived", "kTimeout",
      "kTimewaitExit", "kSidrReqReceived", "kSidrRepReceived"};
  const auto i = static_cast<size_t>(t);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "unknown";
}

struct Event {
  EventType type = EventType::kReqReceived;
  uint32_t comm_id = 0;          // local comm ID (the handle every method takes)
  uint32_t remote_comm_id = 0;
  int status = 0;                // 0, or -ETIMEDOUT for kTimeout
  Msg msg = Msg::kReq;           // kTimeout: what timed out; kMraReceived/kRejReceived: what
                                 // the peer MRA'd / rejected
  uint64_t service_id = 0;       // kReqReceived, kSidrReqReceived (the listened service)
  uint64_t remote_ca_guid = 0;   // REQ / REP Local CA GUID
  // From the REQ (kReqReceived) or the REP (kRepReceived):
  uint32_t remote_qpn = 0;
  uint32_t starting_psn = 0;     // the peer's starting PSN (= our sq_psn)
  uint8_t responder_resources = 0;  // AS SENT by the peer (rdma_cm swaps them for the app)
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 0;          // REQ only
  uint8_t rnr_retry_count = 0;
  bool flow_control = false;
  bool srq = false;
  QpKind qp_type = QpKind::kRc;     // REQ only
  uint8_t local_cm_response_timeout = 0;   // REQ only
  uint8_t remote_cm_response_timeout = 0;  // REQ only
  uint8_t max_cm_retries = 0;              // REQ only
  uint8_t target_ack_delay = 0;            // REP only
  // kReqReceived / kSidrReqReceived: the path seen from THIS side (local_gid = our GID =
  // the REQ's remote GID, remote_gid = the sender's GID; mtu, flow label, tc, hop limit, sl,
  // local ACK timeout from the REQ; udp_port = 4791). kRepReceived: the path of send_req.
  Path path;
  // Where the MAD came from (IPv4 in the low 4 bytes of a ::ffff: GID, or IPv6) and its UDP
  // source port.
  std::array<uint8_t, 16> src_addr{};
  uint16_t src_port = 0;
  // kRejReceived
  uint16_t reject_reason = 0;
  std::vector<uint8_t> ari;       // Reject Info Length bytes (<= 72)
  // kMraReceived
  uint8_t service_timeout = 0;
  // kSidrRepReceived
  uint8_t sidr_status = 0;
  uint32_t qpn = 0;
  uint32_t qkey = 0;
  std::vector<uint8_t> info;      // AdditionalInfo (length byte, <= 72)
  // kSidrReqReceived: the P_Key of the request
  uint16_t pkey = 0;
  // Every event that carries private data: exactly the message's capacity, zero-padded.
  std::vector<uint8_t> private_data;
};

using Sink = std::function<void(const Event&)>;

struct AgentOptions {
  // Cap (ms) on every CM wait (REQ/REP/DREQ/SIDR retries, MRA extension, timewait); 0 = the
  // IBA/Linux values. From SOFTRNIC_CM_MAX_WAIT_MS (base/config.h) in the shim.
  uint32_t max_wait_ms = 0;
  // 0 = random initial comm ID (the default, required for Linux peers); else comm IDs
  // start here (deterministic tests).
  uint32_t first_comm_id = 0;
  // Daemon hosting (docs/daemon.md): several processes' agents share one device and its QP1.
  // Non-zero: every comm ID (and SIDR request ID) this agent issues has this top byte (the
  // process's slot), which is how softrnicd routes a reply to the right process; and
  // claim_service(service_id, true/false) claims / releases a listened-on Service ID
  // device-wide (0, or a positive errno — EADDRINUSE when another process holds it).
  uint8_t comm_id_prefix = 0;
  std::function<int(uint64_t service_id, bool listen)> claim_service;
};

// Per-agent counters (monotonic).
struct AgentCounters {
  uint64_t mads_sent = 0;          // every MAD handed to the transport, retries included
  uint64_t mads_received = 0;      // well-formed CM MADs accepted for processing
  uint64_t mads_retried = 0;       // retransmissions (REQ, REP, DREQ, SIDR_REQ)
  uint64_t dropped_malformed = 0;  // wrong size/class/version/method/attribute, bad field
  uint64_t dropped_unsupported = 0;  // well-formed but not served: LAP, APR, ClassPortInfo,
                                     // other methods (Get/Set)
  uint64_t dropped_duplicate = 0;  // duplicates absorbed (answered by resend/MRA or ignored)
  uint64_t dropped_unmatched = 0;  // a REP/RTU/REJ/MRA/DREP for no known connection or
                                   // in a state that does not take it
  uint64_t dropped_overflow = 0;   // MADs dropped because the agent's queue was full (4096)
  uint64_t timeouts = 0;           // kTimeout events
  uint64_t rej_sent = 0;
  uint64_t connections = 0;        // currently allocated comm IDs (gauge)
  uint64_t reqs_held = 0;          // REQs/SIDR_REQs held for a service re-listened soon
};

class Agent {
 public:
  // Creates the agent and hooks it onto the device's QP1 (dev.engine() must be running).
  // nullptr + *err (a negative errno) if QP1 is already served or the engine is missing.
  static std::unique_ptr<Agent> create(const std::shared_ptr<emu::Device>& dev,
                                       const AgentOptions& opt, int* err);
  virtual ~Agent() = default;
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Node GUID used as Local CA GUID (the device's, host byte order) and its GID 0.
  virtual uint64_t ca_guid() const = 0;
  virtual std::array<uint8_t, 16> local_gid() const = 0;

  // ---- passive ----
  // REQs and SIDR_REQs for service_id go to sink (as kReqReceived / kSidrReqReceived), and so
  // do all later events of the connections they create unless set_sink() changes it.
  virtual int listen(uint64_t service_id, Sink sink) = 0;
  virtual int cancel_listen(uint64_t service_id) = 0;
  // Route the later events of comm_id to another sink.
  virtual int set_sink(uint32_t comm_id, Sink sink) = 0;

  // ---- connection ----
  virtual int64_t send_req(const ReqParams& p, Sink sink) = 0;
  virtual int send_rep(uint32_t comm_id, const RepParams& p) = 0;
  virtual int send_rtu(uint32_t comm_id, std::span<const uint8_t> private_data) = 0;
  // Rejects a received REQ (MsgREJed = REQ), a received REP (= REP), or otherwise (= other);
  // the comm_id is released.
  virtual int send_rej(uint32_t comm_id, const RejParams& p) = 0;
  // MRA for the REQ (passive, before send_rep) or the REP (active, before send_rtu).
  virtual int send_mra(uint32_t comm_id, const MraParams& p) = 0;
  virtual int send_dreq(uint32_t comm_id, std::span<const uint8_t> private_data) = 0;
  virtual int send_drep(uint32_t comm_id, std::span<const uint8_t> private_data) = 0;
  // Established on the passive side without an RTU (rdma_notify / COMM_EST). 0 or -EPROTO.
  virtual int establish(uint32_t comm_id) = 0;

  // ---- UD service resolution ----
  virtual int64_t sidr_req(const SidrReqParams& p, Sink sink) = 0;
  virtual int sidr_rep(uint32_t request_id, const SidrRepParams& p) = 0;

  // Forget comm_id now: what the kernel does on ib_destroy_cm_id. In REQ_SENT it sends REJ 4
  // (timeout), in REQ_RCVD / REP_RCVD REJ 28, when established a DREQ (not retried), then the
  // id is gone without timewait events. No sink is called for it after destroy() returns
  // (except a call already running on the cm thread). Unknown ids: 0.
  virtual int destroy(uint32_t comm_id) = 0;

  virtual AgentCounters counters() const = 0;
  // Test hook: hands raw bytes to the agent's MAD parser as if they came from QP1 of
  // `from_ip` (IPv4, host order). Malformed input is counted and dropped.
  virtual void inject_mad(std::span<const uint8_t> mad, uint32_t from_ip) = 0;

 protected:
  Agent() = default;
};

}  // namespace rnic::cm
