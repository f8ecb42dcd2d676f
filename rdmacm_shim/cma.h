// Internal objects of the librdmacm shim (rdma-core 44 ABI over softrnic's CM agent).
// Each public struct (rdma_event_channel, rdma_cm_id, rdma_cm_event) is the FIRST member of
// a shim object, so the application's pointer converts back with a cast.
// Contract: nothing here is exported; only RDMACM_EXPORT functions listed in exports.map
// leave the library, and no C++ exception crosses the ABI (guard_* below).
//
// Threads: the application's threads, and one worker thread (cm.cc) that turns the CM
// agent's messages (queued by the device's callback) into QP modifies, replies and events.
// One process-wide mutex (g().mu) guards every id, listener and connection map; nothing
// blocks while holding it except the QP modifies and agent sends the worker issues.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <infiniband/ib.h>
#include <rdma/rdma_verbs.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <utility>
#include <vector>

#include "verbs_shim/cm_bridge.h"

#define RDMACM_EXPORT extern "C" __attribute__((visibility("default")))

namespace rnic::rdmacm {

// Wire facts rdma_cm adds on top of the IB CM (cm-notes §0, §2.3, §3.6).
inline constexpr int kCmaHdrSize = 36;
inline constexpr int kReqPdata = 92, kRepPdata = 196, kRejPdata = 148;
inline constexpr int kSidrReqPdata = 216, kSidrRepPdata = 136;
inline constexpr uint8_t kDefaultAckTimeout = 19;  // cm_ack_timeout at packet lifetime 18
inline constexpr uint8_t kPacketLifetime = 18;
inline constexpr uint16_t kRejConsumer = 28, kRejVendorOption = 35;
inline constexpr uint32_t kSidrRejected = 2;

// One softrnic device, opened once by init and kept open until unload (rdma_get_devices
// hands these contexts out; they must equal id->verbs).
struct Device {
  ibv_context* verbs = nullptr;
  const softrnic_cm_ops* ops = nullptr;
  softrnic_cm_device_info info{};
  ibv_device_attr attr{};
  ibv_pd* pd = nullptr;  // the default PD of ids on this device (id->pd)
};

struct Id;

struct Event {
  rdma_cm_event pub;
  Id* owner = nullptr;  // the id whose event this is (event->id)
  uint8_t pdata[256];
};
inline Event* to_event(rdma_cm_event* e) { return reinterpret_cast<Event*>(e); }

// The channel fd is an eventfd in semaphore mode: one count per queued event, so it polls
// readable (level-triggered) while events wait, and a read blocks unless O_NONBLOCK is set.
// A purged event (its id destroyed before it was reported) leaves a spare count behind;
// rdma_get_cm_event then finds the queue empty and reads again.
struct Channel {
  rdma_event_channel pub;
  std::deque<Event*> q;  // guarded by g().mu
  // rdma_destroy_event_channel while threads wait in rdma_get_cm_event (rping's CM thread
  // does), or just before one calls it: as with the kernel's rdma_cm file, those calls stay
  // blocked for good (rping then exits from main). The destroy marks the channel closed and
  // closes its fd; a channel with waiters is never freed, one without is freed only after 64
  // later destroys (channel.cc). Guarded by g().mu. The fd's count equals q's size
  // (channel.cc queue_push).
  int waiters = 0;
  bool closed = false;
  bool nonblock_at_close = false;  // the fd was O_NONBLOCK: a call after the destroy fails
};
inline Channel* to_channel(rdma_event_channel* c) { return reinterpret_cast<Channel*>(c); }

enum class State {
  kIdle,
  kAddrBound,
  kAddrResolved,
  kRouteResolved,
  kListen,
  kConnect,     // active: REQ / SIDR_REQ sent
  kRepRcvd,     // active, no QP: CONNECT_RESPONSE given, waiting for rdma_establish
  kReqRcvd,     // passive: CONNECT_REQUEST given, not accepted yet
  kRepSent,     // passive: accepted, waiting for the RTU
  kEstablished,
  kDisconnect,  // DREQ sent or received
  kDone,        // rejected, unreachable, or connection over
};

struct Id {
  rdma_cm_id pub;
  State state = State::kIdle;
  Device* dev = nullptr;
  int sgid_index = 0;  // the device's GID this id's address is (its QPs' AV sgid_index)
  Channel* own_channel = nullptr;  // sync mode: the private channel
  bool sync = false;
  int reported = 0, acked = 0;  // events returned by get_cm_event / acked (g().mu)
  sockaddr_storage bound{};     // what bind_addr got (wildcard or a device address)
  bool bound_set = false;
  uint16_t port = 0;            // rdma_cm port (host order)
  std::vector<std::pair<Device*, uint64_t>> listens;  // agent listen handles
  uint64_t conn = 0;            // agent connection (0 none)
  Device* conn_dev = nullptr;
  ibv_sa_path_rec path{};
  // Connection parameters (host order), see cma.cc's qp_attr for their use.
  uint32_t my_psn = 0, peer_qpn = 0, peer_psn = 0, peer_qkey = 0;
  uint8_t rr = 0, ini = 0;       // my max_dest_rd_atomic / max_rd_atomic
  uint8_t retry = 7, rnr = 7;    // QP retry_cnt / rnr_retry
  uint8_t mtu = IBV_MTU_1024;
  uint8_t peer_ini = 0, peer_rr = 0;  // what the REQ asked (passive defaults)
  bool dreq_rcvd = false, conn_error = false, peer_known = false;
  uint8_t tos = 0, ack_timeout = kDefaultAckTimeout;
  bool ack_timeout_set = false;
  int afonly = 0, reuseaddr = 0;
  bool afonly_set = false;  // RDMA_OPTION_ID_AFONLY given (else bind decides, as the kernel)
  // rdma_create_ep (passive): what rdma_get_request creates each QP with.
  ibv_qp_init_attr* ep_attr = nullptr;
  ibv_pd* ep_pd = nullptr;
  ibv_ece local_ece{}, remote_ece{};
  Id* listen_parent = nullptr;
  // Multicast groups joined (rdma_join_multicast*), by MGID; `attached`: the id's QP is
  // attached to it (not for a send-only join, nor when the id had no QP at join time).
  struct Mcast {
    uint8_t mgid[16];
    void* context;
    bool attached;
  };
  std::vector<Mcast> mcasts;
};
inline Id* to_id(rdma_cm_id* i) { return reinterpret_cast<Id*>(i); }

struct Global {
  std::mutex mu;
  std::condition_variable acked_cv;  // an event was acked
  bool init_done = false;
  int init_err = 0;
  std::vector<Device*> devs;
  std::map<std::pair<Device*, uint64_t>, Id*> listens, conns;
  std::set<std::pair<int, uint16_t>> ports;  // (port space, port) bound in this process
  std::set<Id*> ids;                         // every live id
};
Global& g();

// ---- cma.cc / device.cc ----
// Opens the devices once (ENODEV: none, or the libibverbs in the process is not ours).
// Returns 0 or an errno. Takes g().mu itself.
int ucma_init();
// The calling thread is in the CM, off the data path: each device sends the ACKs it held for
// this process's next post now (softrnic_cm_ops::left_data_path). Called first by the calls
// that set up or take down a connection and by rdma_get_cm_event. Takes g().mu itself.
void left_data_path() noexcept;
// rdma_get_cm_event without left_data_path: rsockets' non-blocking look at its CM channel,
// which runs on every rrecv / rpoll and must not send the ACKs its own posts would carry.
int get_cm_event_on_data_path(rdma_event_channel* channel, rdma_cm_event** event);
Device* device_for_ctx(ibv_context* c);  // REQUIRES g().mu
// Addresses as GIDs (cm-notes §3.4): an AF_INET address is the GID ::ffff:a.b.c.d, an
// AF_INET6 one its 16 bytes (so a v4-mapped AF_INET6 address is the IPv4 GID).
bool gid_is_v4(const uint8_t gid[16]);
// The GID form of an AF_INET / AF_INET6 sockaddr and its scope id (link-local IPv6: the
// interface index, 0 = unspecified); false for other families.
bool sa_gid(const sockaddr* sa, uint8_t gid[16], uint32_t* scope);
// The index of `gid` in d's GID table; a link-local GID must be on interface `scope` unless
// scope is 0. -1 if d has no such GID.
int gid_index(const Device* d, const uint8_t gid[16], uint32_t scope);
// The device (and GID index) whose GID table has `gid`. REQUIRES g().mu; nullptr if none.
Device* device_for_gid(const uint8_t gid[16], uint32_t scope, int* index);
// The first GID of d of the family of `like` (v4-mapped or IPv6; for a link-local `like`
// a link-local GID on interface `scope`, else a non-link-local one), or -1.
int gid_index_like(const Device* d, const uint8_t like[16], uint32_t scope);
// The sockaddr naming GID `index` of d with `port` (host order): AF_INET for an IPv4 GID
// unless as_v6 (then ::ffff:a.b.c.d), AF_INET6 with the scope id for an IPv6 one.
void sa_of_gid(const Device* d, int index, uint16_t port, bool as_v6, sockaddr_storage* out);
// The sockaddr of an arbitrary GID (no device), as above.
void sa_of_raw_gid(const uint8_t gid[16], uint32_t scope, uint16_t port, bool as_v6, sockaddr_storage* out);

// ---- channel.cc ----
Channel* channel_new();  // nullptr + errno
void channel_free(Channel* c);
// Queues an event for `id` on its channel. REQUIRES g().mu.
// `on` overrides the channel (CONNECT_REQUEST of a sync listener goes to the listener's).
Event* queue_event(Id* id, rdma_cm_event_type type, int status, Channel* on = nullptr);
void queue_push(Channel* ch, Event* ev);  // REQUIRES g().mu
// Removes the id's unreported events from its channel (destroy) or moves them to `to`.
void purge_events(Id* id, Channel* to);  // REQUIRES g().mu
// Sync mode: acks id->event, waits for the next event, leaves it in id->event; returns 0
// or -1 with errno (ECONNREFUSED for REJECTED, -status for negative status).
int ucma_complete(Id* id);

// ---- id.cc ----
Id* id_for_request(Id* listen, Device* d);  // REQUIRES g().mu
int create_id_qpt(rdma_event_channel* ch, rdma_cm_id** out, void* ctx, rdma_port_space ps, ibv_qp_type qpt);

// ---- cm.cc: the agent's messages ----
void cm_handler(void* user, uint64_t conn, uint64_t listen, const softrnic_cm_msg* m);

// ---- qp.cc ----
// The attributes the CM gives a QP in `state` (rdma_init_qp_attr). REQUIRES g().mu.
int qp_attr_for(Id* id, ibv_qp_attr* attr, int* mask);
// Brings id->qp to RTS from the CM's attributes (INIT->INIT, RTR, RTS). REQUIRES g().mu.
int qp_connect(Id* id);
void qp_to_err(Id* id);

// ---- helpers ----
inline int fail(int e) {
  errno = e;
  return -1;
}
template <class F>
int guard(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(ENOMEM);
  } catch (...) {
    return fail(EIO);
  }
}
uint16_t sa_port(const sockaddr* sa);  // host order; 0 for unknown families
void sa_set_port(sockaddr* sa, uint16_t port);
socklen_t sa_len(const sockaddr* sa);
// IPv4 address of an AF_INET or v4-mapped AF_INET6 sockaddr; false otherwise.
bool sa_ipv4(const sockaddr* sa, in_addr* out);
// The wildcard of either family (0.0.0.0, ::, ::ffff:0.0.0.0).
bool sa_any(const sockaddr* sa);
// The loopback of either family (127/8, ::1, ::ffff:127/8).
bool sa_loopback(const sockaddr* sa);
uint32_t random24();

}  // namespace rnic::rdmacm

namespace rnic::rdmacm {
// ---- cm.cc: rdma_cm's additions to the IB CM messages ----
inline uint64_t service_id(int ps, uint16_t port) {
  return (static_cast<uint64_t>(ps & 0xFFFF) << 16) | port;  // TCP 7471: 0x01061D2F
}
// The 36-byte IP CM header (cm-notes §3.6) for a connection src -> dst: IP version 4 with
// 12 zero bytes + the address when the source is IPv4 (AF_INET or v4-mapped), else IP
// version 6 with the 16-byte addresses. False if either is not AF_INET / AF_INET6.
bool cma_hdr_build(const sockaddr* src, const sockaddr* dst, uint8_t out[kCmaHdrSize]);
// Parses it into AF_INET (version 4) or AF_INET6 (version 6, scope id 0) sockaddrs with
// src's port = the header's source port; false unless version 0 and IP version 4 or 6.
bool cma_hdr_parse(const uint8_t* in, sockaddr_storage* src, sockaddr_storage* dst);
// True when the id's messages carry the header (every address family except AF_IB).
bool uses_cma_hdr(const Id* id);
// Sends on the id's connection. REQUIRES g().mu.
int cm_send(Id* id, const softrnic_cm_msg& m);
}  // namespace rnic::rdmacm
