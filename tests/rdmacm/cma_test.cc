// librdmacm.so.1 over softrnic, in one process (its own device on SOFTRNIC_IP): event
// channel fd semantics, bind / resolve_addr / resolve_route, rdma_getaddrinfo,
// rdma_create_qp + rdma_init_qp_attr, private-data limits, destroy waiting for acks,
// migrate, the unsupported calls' errnos — and, through the device's CM agent, a connect to
// a port nobody listens on (REJECTED, reason 8).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

// poll() as the library sees it: a thread that set g_stall_poll sleeps 300 ms before the real
// poll, to hold it in the window between rdma_get_cm_event dropping its lock and entering
// poll() (Cma.DestroyChannelWhileAThreadIsAboutToPoll). Every other call passes straight on.
namespace {
thread_local bool g_stall_poll = false;
}
extern "C" int poll(struct pollfd* fds, nfds_t n, int timeout) {
  using PollFn = int (*)(struct pollfd*, nfds_t, int);
  static PollFn real = reinterpret_cast<PollFn>(dlsym(RTLD_NEXT, "poll"));
  if (g_stall_poll) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return real(fds, n, timeout);
}

namespace {

// Without SOFTRNIC_IP the test takes a random free 127.64-127.127 address (before any device
// is opened), so runs from other checkouts at the same time do not collide.
const bool kIpChosen = [] {
  if (std::getenv("SOFTRNIC_IP") != nullptr) return true;
  std::srand(static_cast<unsigned>(getpid()) ^ static_cast<unsigned>(time(nullptr)));
  for (int i = 0; i < 200; ++i) {
    char ip[32];
    std::snprintf(ip, sizeof ip, "127.%d.%d.%d", 64 + std::rand() % 64, std::rand() % 256, 2 + std::rand() % 250);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(4791);
    inet_pton(AF_INET, ip, &sa.sin_addr);
    bool ok = bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    close(s);
    if (ok) {
      setenv("SOFTRNIC_IP", ip, 1);
      return true;
    }
  }
  return false;
}();

std::string my_ip() {
  const char* ip = std::getenv("SOFTRNIC_IP");
  return ip ? ip : "";
}

sockaddr_in addr4(const std::string& ip, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  return sa;
}

sockaddr* sa(sockaddr_in& s) { return reinterpret_cast<sockaddr*>(&s); }

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

// Waits (bounded: 10 s) for the next event on `ch`.
rdma_cm_event* next_event(rdma_event_channel* ch) {
  if (!readable(ch->fd, 10000)) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

// True when the device has a CM agent: rdma_listen does not fail with ENOSYS. Without one
// the tests that connect are counted skips.
bool has_cm_agent() {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) != 0) return false;
  sockaddr_in s = addr4(my_ip(), 7598);
  bool ok = rdma_bind_addr(id, sa(s)) == 0 && (rdma_listen(id, 1) == 0 || errno != ENOSYS);
  rdma_destroy_id(id);
  return ok;
}
#define REQUIRE_CM_AGENT() \
  if (!has_cm_agent()) GTEST_SKIP() << "the device has no CM agent (rdma_listen: ENOSYS)"

class Cma : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(my_ip().empty()) << "the test needs SOFTRNIC_IP";
    ch_ = rdma_create_event_channel();
    ASSERT_NE(ch_, nullptr) << strerror(errno);
  }
  void TearDown() override {
    if (ch_) rdma_destroy_event_channel(ch_);
  }
  // An id with its address and route resolved towards `dst` (default: ourselves).
  rdma_cm_id* resolved(rdma_port_space ps, const std::string& dst, uint16_t port) {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch_, &id, this, ps) != 0) return nullptr;
    sockaddr_in d = addr4(dst, port);
    if (rdma_resolve_addr(id, nullptr, sa(d), 2000) != 0) return nullptr;
    rdma_cm_event* ev = next_event(ch_);
    if (ev == nullptr || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) return nullptr;
    rdma_ack_cm_event(ev);
    if (rdma_resolve_route(id, 2000) != 0) return nullptr;
    ev = next_event(ch_);
    if (ev == nullptr || ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) return nullptr;
    rdma_ack_cm_event(ev);
    return id;
  }
  rdma_event_channel* ch_ = nullptr;
};

TEST_F(Cma, ChannelFdIsPollableAndHonoursNonBlocking) {
  EXPECT_FALSE(readable(ch_->fd, 0)) << "a fresh channel has no event";
  int fl = fcntl(ch_->fd, F_GETFL);
  ASSERT_EQ(fcntl(ch_->fd, F_SETFL, fl | O_NONBLOCK), 0);
  rdma_cm_event* ev = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(ch_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in d = addr4(my_ip(), 7471);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(d), 2000), 0);
  // Level-triggered: readable until the event is taken, and stays so across polls.
  EXPECT_TRUE(readable(ch_->fd, 1000));
  EXPECT_TRUE(readable(ch_->fd, 0));
  ASSERT_EQ(rdma_get_cm_event(ch_, &ev), 0);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(ev->id, id);
  EXPECT_EQ(ev->status, 0);
  EXPECT_FALSE(readable(ch_->fd, 0));
  EXPECT_EQ(rdma_get_cm_event(ch_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// rping destroys its channel while its CM thread still waits in rdma_get_cm_event, then
// exits from main: the waiters stay blocked, as in a read of the kernel's closed rdma_cm
// file (rping's thread exits 255 if its get_cm_event fails), and the channel is not freed
// under them (ASan saw a use-after-free in get_event when it was).
TEST_F(Cma, DestroyChannelWhileThreadsWaitInGetEvent) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  // Static: the detached waiters outlive this test.
  static std::atomic<int> done{0}, ebadf{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([ch] {
      rdma_cm_event* ev = nullptr;
      int rc = rdma_get_cm_event(ch, &ev);
      if (rc == -1 && errno == EBADF) ++ebadf;
      ++done;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let them block in read()
  EXPECT_EQ(done.load(), 0) << "get_cm_event returned with no event";
  rdma_destroy_event_channel(ch);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(done.load(), 0) << "a waiter returned after the destroy";
  EXPECT_EQ(ebadf.load(), 0);
  for (auto& t : waiters) t.detach();  // blocked until the process exits, as with rping
}

// The same, with the waiter caught between taking its place and entering poll() (the CI run
// that failed: rping's CM thread polled the closed fd, got POLLNVAL, and exited 255 on the
// EBADF). Whatever its poll returns on the fd the destroy closed, it blocks like the others.
TEST_F(Cma, DestroyChannelWhileAThreadIsAboutToPoll) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  static std::atomic<int> done{0}, ebadf{0};
  std::thread waiter([ch] {
    g_stall_poll = true;
    rdma_cm_event* ev = nullptr;
    int rc = rdma_get_cm_event(ch, &ev);
    if (rc == -1 && errno == EBADF) ++ebadf;
    ++done;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // inside the stalled poll()
  rdma_destroy_event_channel(ch);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the real poll has begun
  EXPECT_EQ(done.load(), 0) << "the waiter returned after the destroy";
  EXPECT_EQ(ebadf.load(), 0);
  waiter.detach();  // blocked until the process exits, as with rping
}

// rping's other window (net_rdmacm_ipv6, 2026-12-05: the server exited 255 with
// "rdma_get_cm_event: Bad file descriptor" after its 50 pings): its CM thread acknowledges the
// DISCONNECTED event, main wakes in rdma_destroy_id and destroys the channel, and only then
// does the CM thread call rdma_get_cm_event again. It must block as the others (against the
// kernel it would most often have been in its read already), not fail or read freed memory.
TEST_F(Cma, GetEventJustAfterTheDestroyBlocks) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_destroy_event_channel(ch);
  static std::atomic<int> started{0}, done{0}, ebadf{0};
  std::thread late([ch] {
    rdma_cm_event* ev = nullptr;
    ++started;
    int rc = rdma_get_cm_event(ch, &ev);
    if (rc == -1 && errno == EBADF) ++ebadf;
    ++done;
  });
  while (started.load() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(done.load(), 0) << "rdma_get_cm_event returned on a destroyed channel";
  EXPECT_EQ(ebadf.load(), 0);
  late.detach();  // blocked until the process exits, as with rping
}

// ... but a channel the application made non-blocking never blocks: a call after its destroy
// fails with EBADF, as a read of the closed fd (an event loop must not freeze in it).
TEST_F(Cma, GetEventAfterTheDestroyOfANonBlockingChannelFails) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
  rdma_destroy_event_channel(ch);
  rdma_cm_event* ev = nullptr;
  EXPECT_EQ(rdma_get_cm_event(ch, &ev), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(Cma, ResolveAddrAndRouteFillTheIdAsTheKernel) {
  rdma_cm_id* id = resolved(RDMA_PS_TCP, my_ip(), 7471);
  ASSERT_NE(id, nullptr) << strerror(errno);
  // Bound to our device: verbs is one of rdma_get_devices' contexts, pd and port set.
  int n = 0;
  ibv_context** devs = rdma_get_devices(&n);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(id->verbs, devs[0]);
  rdma_free_devices(devs);
  EXPECT_NE(id->pd, nullptr);
  EXPECT_EQ(id->port_num, 1);
  auto* src = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(id));
  char b[INET_ADDRSTRLEN];
  EXPECT_EQ(std::string(inet_ntop(AF_INET, &src->sin_addr, b, sizeof b)), my_ip());
  EXPECT_NE(rdma_get_src_port(id), 0) << "an ephemeral port";
  EXPECT_EQ(ntohs(rdma_get_dst_port(id)), 7471);
  // The GIDs are ::ffff:ip and the one path the route synthesizes uses them.
  ibv_gid gid0;
  ASSERT_EQ(ibv_query_gid(id->verbs, 1, 0, &gid0), 0);
  EXPECT_EQ(std::memcmp(id->route.addr.addr.ibaddr.sgid.raw, gid0.raw, 16), 0);
  ASSERT_EQ(id->route.num_paths, 1);
  EXPECT_EQ(std::memcmp(id->route.path_rec->sgid.raw, gid0.raw, 16), 0);
  EXPECT_EQ(std::memcmp(id->route.path_rec->dgid.raw, gid0.raw, 16), 0) << "routed to ourselves";
  EXPECT_EQ(id->route.path_rec->hop_limit, 64);
  EXPECT_EQ(ntohs(id->route.path_rec->pkey), 0xFFFF);
  ibv_port_attr pa;
  ASSERT_EQ(ibv_query_port(id->verbs, 1, &pa), 0);
  EXPECT_EQ(id->route.path_rec->mtu, pa.active_mtu);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Cma, BindErrorsAsTheRealLibrary) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in off_host = addr4("192.0.2.1", 7471);  // TEST-NET-1: no host has it
  EXPECT_EQ(rdma_bind_addr(id, sa(off_host)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  // A local address without a softrnic device on it.
  sockaddr_in lo = addr4(my_ip() == "127.0.0.1" ? "127.0.0.254" : "127.0.0.1", 7471);
  EXPECT_EQ(rdma_bind_addr(id, sa(lo)), -1);
  EXPECT_EQ(errno, ENODEV);
  // The wildcard binds without a device; our IP binds to the device.
  sockaddr_in any = addr4("0.0.0.0", 0);
  EXPECT_EQ(rdma_bind_addr(id, sa(any)), 0);
  EXPECT_EQ(id->verbs, nullptr);
  EXPECT_NE(rdma_get_src_port(id), 0);
  rdma_cm_id* id2 = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id2, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in mine = addr4(my_ip(), ntohs(rdma_get_src_port(id)));
  EXPECT_EQ(rdma_bind_addr(id2, sa(mine)), -1) << "same port space and port";
  EXPECT_EQ(errno, EADDRINUSE);
  sockaddr_in mine2 = addr4(my_ip(), 0);
  EXPECT_EQ(rdma_bind_addr(id2, sa(mine2)), 0);
  EXPECT_NE(id2->verbs, nullptr);
  EXPECT_EQ(rdma_bind_addr(id2, sa(mine2)), -1) << "bound twice";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id2), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // Route before address; unknown port space.
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(rdma_resolve_route(id, 100), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_connect(id, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(rdma_create_id(ch_, &id, nullptr, static_cast<rdma_port_space>(0x0999)), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Cma, GetaddrinfoPassiveActiveAndUdp) {
  rdma_addrinfo hints{}, *res = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  ASSERT_EQ(rdma_getaddrinfo(my_ip().c_str(), "7471", &hints, &res), 0);
  ASSERT_NE(res->ai_src_addr, nullptr);
  EXPECT_EQ(res->ai_dst_addr, nullptr);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(res->ai_family, AF_INET);
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(res->ai_src_addr)->sin_port), 7471);
  rdma_freeaddrinfo(res);
  res = nullptr;
  hints = {};
  hints.ai_port_space = RDMA_PS_UDP;
  ASSERT_EQ(rdma_getaddrinfo(my_ip().c_str(), "7174", &hints, &res), 0);
  EXPECT_EQ(res->ai_src_addr, nullptr);
  ASSERT_NE(res->ai_dst_addr, nullptr);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_UD);
  rdma_freeaddrinfo(res);
  res = nullptr;
  hints = {};
  hints.ai_flags = RAI_NUMERICHOST;
  EXPECT_NE(rdma_getaddrinfo("no-such-host.invalid", "1", &hints, &res), 0);
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res), EAI_NONAME);
  // No node, no service: the hints' addresses come back as given (libfabric's verbs provider
  // connects to an endpoint name that way).
  sockaddr_in dst = addr4("192.0.2.7", 4711), src = addr4(my_ip().c_str(), 0);
  hints = {};
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = IBV_QPT_RC;
  hints.ai_dst_addr = sa(dst);
  hints.ai_dst_len = sizeof dst;
  hints.ai_src_addr = sa(src);
  hints.ai_src_len = sizeof src;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, nullptr, &hints, &res), 0);
  ASSERT_NE(res->ai_dst_addr, nullptr);
  ASSERT_NE(res->ai_src_addr, nullptr);
  EXPECT_EQ(std::memcmp(res->ai_dst_addr, &dst, sizeof dst), 0);
  EXPECT_EQ(std::memcmp(res->ai_src_addr, &src, sizeof src), 0);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  rdma_freeaddrinfo(res);
  res = nullptr;
}

TEST_F(Cma, CreateQpInitAndQpAttrBeforeAndAfterTheRoute) {
  rdma_cm_id* id = resolved(RDMA_PS_TCP, my_ip(), 7471);
  ASSERT_NE(id, nullptr);
  ibv_qp_init_attr qa{};
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &qa), 0) << strerror(errno);
  ASSERT_NE(id->qp, nullptr);
  EXPECT_EQ(id->qp->pd, id->pd) << "NULL pd means the id's default PD";
  EXPECT_NE(id->send_cq, nullptr);
  EXPECT_NE(id->recv_cq_channel, nullptr);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_INIT);
  // INIT -> INIT (what librdmacm re-applies before RTR) is accepted by our verbs.
  attr = {};
  attr.qp_state = IBV_QPS_INIT;
  int mask = 0;
  ASSERT_EQ(rdma_init_qp_attr(id, &attr, &mask), 0);
  EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(ibv_modify_qp(id->qp, &attr, mask), 0);
  // No peer yet: RTR and RTS cannot be computed.
  attr = {};
  attr.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(rdma_init_qp_attr(id, &attr, &mask), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_create_qp(id, nullptr, &qa), -1) << "one QP per id";
  EXPECT_EQ(errno, EINVAL);
  // The rdma_verbs.h helpers work on the id's PD and CQs.
  char buf[64];
  ibv_mr* mr = rdma_reg_msgs(id, buf, sizeof buf);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(rdma_post_recv(id, nullptr, buf, sizeof buf, mr), 0);
  EXPECT_EQ(rdma_dereg_mr(mr), 0);
  rdma_destroy_qp(id);
  EXPECT_EQ(id->qp, nullptr);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Cma, UdQpIsReadyAtCreate) {
  rdma_cm_id* id = resolved(RDMA_PS_UDP, my_ip(), 7174);
  ASSERT_NE(id, nullptr);
  EXPECT_EQ(id->qp_type, IBV_QPT_UD);
  ibv_qp_init_attr qa{};
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_UD;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &qa), 0) << strerror(errno);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(id->qp, &attr, IBV_QP_STATE | IBV_QP_QKEY, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(attr.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// rdma_join_multicast(_ex) / rdma_leave_multicast on a UDP id with a QP: the JOIN event's
// ud param as the kernel's (AH to the MGID, QPN 0xFFFFFF, RDMA_UDP_QKEY), the QP attached
// (a second attach is then a no-op, a detach succeeds), and the errors.
TEST_F(Cma, JoinAndLeaveMulticast) {
  // The kernel joins only in ADDR_BOUND / ADDR_RESOLVED (mckey resolves no route).
  auto addr_resolved = [&](rdma_port_space ps, uint16_t port) -> rdma_cm_id* {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch_, &id, this, ps) != 0) return nullptr;
    sockaddr_in d = addr4(my_ip(), port);
    if (rdma_resolve_addr(id, nullptr, sa(d), 2000) != 0) return nullptr;
    rdma_cm_event* ev = next_event(ch_);
    if (ev == nullptr || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) return nullptr;
    rdma_ack_cm_event(ev);
    return id;
  };
  rdma_cm_id* id = addr_resolved(RDMA_PS_UDP, 7175);
  ASSERT_NE(id, nullptr);
  ibv_qp_init_attr qa{};
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_UD;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &qa), 0) << strerror(errno);
  sockaddr_in mc = addr4("239.194.0." + std::to_string(1 + getpid() % 250), 0);
  int ctx_tag = 0;
  ASSERT_EQ(rdma_join_multicast(id, sa(mc), &ctx_tag), 0) << strerror(errno);
  rdma_cm_event* ev = next_event(ch_);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_JOIN);
  EXPECT_EQ(ev->status, 0);
  EXPECT_EQ(ev->param.ud.private_data, &ctx_tag);
  EXPECT_EQ(ev->param.ud.qp_num, 0xFFFFFFu);
  EXPECT_EQ(ev->param.ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  const ibv_ah_attr& ah = ev->param.ud.ah_attr;
  EXPECT_EQ(ah.is_global, 1);
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 194, 0,
                            static_cast<uint8_t>(1 + getpid() % 250)};
  EXPECT_EQ(std::memcmp(ah.grh.dgid.raw, want, 16), 0);
  ibv_ah* a = ibv_create_ah(id->pd, const_cast<ibv_ah_attr*>(&ah));
  EXPECT_NE(a, nullptr) << strerror(errno);  // a sender's AH to the group
  if (a != nullptr) {
    EXPECT_EQ(ibv_destroy_ah(a), 0);
  }
  rdma_ack_cm_event(ev);
  ibv_gid g;
  std::memcpy(g.raw, want, 16);
  EXPECT_EQ(ibv_attach_mcast(id->qp, &g, 0), 0);  // attached already: no change
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(id, sa(mc), nullptr), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  sockaddr_in uni = addr4(my_ip(), 0);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(id, sa(uni), nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_join_mc_attr_ex ex{};
  ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  ex.addr = sa(mc);
  ex.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(id, &ex, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_leave_multicast(id, sa(mc)), 0);
  EXPECT_EQ(ibv_detach_mcast(id->qp, &g, 0), EINVAL);  // the leave detached it
  errno = 0;
  EXPECT_EQ(rdma_leave_multicast(id, sa(mc)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  // Send-only full member: the event, no attach.
  ex.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
  ASSERT_EQ(rdma_join_multicast_ex(id, &ex, nullptr), 0) << strerror(errno);
  ev = next_event(ch_);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_JOIN);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(ibv_detach_mcast(id->qp, &g, 0), EINVAL);
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);  // leaves what is still joined
  // After the route is resolved: EINVAL, as the kernel.
  rdma_cm_id* routed = resolved(RDMA_PS_UDP, my_ip(), 7177);
  ASSERT_NE(routed, nullptr);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(routed, sa(mc), nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(routed), 0);
  // A TCP id cannot join.
  rdma_cm_id* tcp = addr_resolved(RDMA_PS_TCP, 7176);
  ASSERT_NE(tcp, nullptr);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(tcp, sa(mc), nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(tcp), 0);
}

TEST_F(Cma, OversizedPrivateDataIsEinval) {
  uint8_t big[256] = {};
  rdma_cm_id* id = resolved(RDMA_PS_TCP, my_ip(), 7471);
  ASSERT_NE(id, nullptr);
  rdma_conn_param p{};
  p.private_data = big;
  p.private_data_len = 57;  // 92 - the 36-byte CMA header = 56
  EXPECT_EQ(rdma_connect(id, &p), -1);
  EXPECT_EQ(errno, EINVAL);
  p.responder_resources = 200;  // above the device's max_qp_rd_atom
  p.private_data_len = 0;
  EXPECT_EQ(rdma_connect(id, &p), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  id = resolved(RDMA_PS_UDP, my_ip(), 7174);
  ASSERT_NE(id, nullptr);
  p = {};
  p.private_data = big;
  p.private_data_len = 181;  // 216 - 36 = 180
  EXPECT_EQ(rdma_connect(id, &p), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Cma, DestroyIdWaitsForItsEventsToBeAcked) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in d = addr4(my_ip(), 7471);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(d), 2000), 0);
  rdma_cm_event* ev = next_event(ch_);
  ASSERT_NE(ev, nullptr);
  std::atomic<bool> done{false};
  std::thread t([&] {
    rdma_destroy_id(id);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load()) << "rdma_destroy_id returned with an unacked event";
  rdma_ack_cm_event(ev);
  t.join();
  EXPECT_TRUE(done.load());
}

TEST_F(Cma, DestroyDropsUnreportedEventsAndMigrateMovesThem) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in d = addr4(my_ip(), 7471);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(d), 2000), 0);
  rdma_event_channel* ch2 = rdma_create_event_channel();
  ASSERT_NE(ch2, nullptr);
  ASSERT_TRUE(readable(ch_->fd, 1000));
  ASSERT_EQ(rdma_migrate_id(id, ch2), 0);
  EXPECT_EQ(id->channel, ch2);
  // The fd counts what is queued: the moved event leaves nothing readable behind.
  EXPECT_FALSE(readable(ch_->fd, 0)) << "the old channel still polls readable";
  rdma_cm_event* ev = next_event(ch2);
  ASSERT_NE(ev, nullptr) << "the queued ADDR_RESOLVED moved with the id";
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_TRUE(readable(ch2->fd, 1000));
  EXPECT_EQ(rdma_destroy_id(id), 0) << "an unreported event does not hold destroy";
  EXPECT_FALSE(readable(ch2->fd, 0)) << "a dropped event left the fd readable";
  int fl = fcntl(ch2->fd, F_GETFL);
  fcntl(ch2->fd, F_SETFL, fl | O_NONBLOCK);
  EXPECT_EQ(rdma_get_cm_event(ch2, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  rdma_destroy_event_channel(ch2);
}

TEST_F(Cma, SyncEndpointResolvesInline) {
  rdma_addrinfo hints{}, *res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo(my_ip().c_str(), "7471", &hints, &res), 0);
  rdma_cm_id* id = nullptr;
  ibv_qp_init_attr qa{};
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.sq_sig_all = 1;
  ASSERT_EQ(rdma_create_ep(&id, res, nullptr, &qa), 0) << strerror(errno);
  rdma_freeaddrinfo(res);
  EXPECT_NE(id->qp, nullptr);
  EXPECT_NE(id->channel, nullptr);
  ASSERT_NE(id->event, nullptr) << "sync mode keeps the last event in id->event";
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_destroy_ep(id);
}

TEST_F(Cma, ConnectToAPortWithoutListenerIsRejected) {
  REQUIRE_CM_AGENT();
  rdma_cm_id* id = resolved(RDMA_PS_TCP, my_ip(), 7999);
  ASSERT_NE(id, nullptr);
  ibv_qp_init_attr qa{};
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &qa), 0);
  rdma_conn_param p{};
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  ASSERT_EQ(rdma_connect(id, &p), 0) << strerror(errno);
  rdma_cm_event* ev = next_event(ch_);
  ASSERT_NE(ev, nullptr) << "no event within 10 s";
  EXPECT_STREQ(rdma_event_str(ev->event), "RDMA_CM_EVENT_REJECTED");
  EXPECT_EQ(ev->status, 8) << "REJ reason 8: invalid service ID";
  EXPECT_EQ(ev->param.conn.private_data_len, 148);
  rdma_ack_cm_event(ev);
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Cma, ListenTwiceOnOnePortIsInUse) {
  REQUIRE_CM_AGENT();
  rdma_cm_id *a = nullptr, *b = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &a, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_create_id(ch_, &b, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in s = addr4(my_ip(), 7490);
  ASSERT_EQ(rdma_bind_addr(a, sa(s)), 0);
  EXPECT_EQ(rdma_listen(a, 8), 0) << strerror(errno);
  EXPECT_EQ(rdma_bind_addr(b, sa(s)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  EXPECT_EQ(rdma_destroy_id(a), 0);
  EXPECT_EQ(rdma_bind_addr(b, sa(s)), 0) << "the port is free again";
  EXPECT_EQ(rdma_destroy_id(b), 0);
}

sockaddr_in6 addr6(const std::string& ip, uint16_t port) {
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(port);
  inet_pton(AF_INET6, ip.c_str(), &sa.sin6_addr);
  return sa;
}
sockaddr* sa(sockaddr_in6& s) { return reinterpret_cast<sockaddr*>(&s); }

// Can this host bind `ip` (IPv6 enabled, the address present)?
bool host_has6(const std::string& ip) {
  int s = socket(AF_INET6, SOCK_DGRAM, 0);
  if (s < 0) return false;
  sockaddr_in6 a = addr6(ip, 0);
  bool ok = bind(s, sa(a), sizeof a) == 0;
  close(s);
  return ok;
}

// IPv6 input to a process whose only device is IPv4 on loopback (its GID table is ::ffff:ip
// alone: a loopback interface lists no IPv6 GIDs), with the errnos and events the kernel's
// rdma_cm gives (cma.c: cma_acquire_dev_by_src_ip -> -ENODEV, rdma_translate_ip ->
// -EADDRNOTAVAIL, resolve_prepare_src family check -> -EINVAL).
TEST_F(Cma, Ipv6WithoutAnIpv6DeviceFailsAsTheKernel) {
  if (!host_has6("::1")) GTEST_SKIP() << "no IPv6 on this host (cannot bind ::1)";
  // Async: rdma_resolve_addr succeeds, then ADDR_ERROR with status -ENODEV (no RDMA device
  // owns the route's source address ::1).
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in6 loop6 = addr6("::1", 7471);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(loop6), 2000), 0) << strerror(errno);
  rdma_cm_event* ev = next_event(ch_);
  ASSERT_NE(ev, nullptr);
  EXPECT_STREQ(rdma_event_str(ev->event), "RDMA_CM_EVENT_ADDR_ERROR");
  EXPECT_EQ(ev->status, -ENODEV);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(id->verbs, nullptr) << "no device was attached";
  EXPECT_EQ(rdma_get_local_addr(id)->sa_family, AF_INET6) << "bound to the IPv6 wildcard";
  EXPECT_EQ(rdma_resolve_route(id, 100), -1) << "no address, no route";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // Sync: the same failure as -1 with errno ENODEV.
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(loop6), 2000), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // UDP port space alike (udaddy's path).
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP), 0);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(loop6), 2000), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // Bind: an IPv6 address no interface has -> EADDRNOTAVAIL; one the host has but no device
  // -> ENODEV; a link-local address without a scope is no host address -> EADDRNOTAVAIL.
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in6 off_host = addr6("2001:db8::1", 7471);  // documentation prefix
  EXPECT_EQ(rdma_bind_addr(id, sa(off_host)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(rdma_bind_addr(id, sa(loop6)), -1);
  EXPECT_EQ(errno, ENODEV);
  sockaddr_in6 ll = addr6("fe80::1", 7471);
  EXPECT_EQ(rdma_bind_addr(id, sa(ll)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  // The IPv6 wildcard binds (no device); from it an IPv4 destination is the wrong family.
  sockaddr_in6 any6 = addr6("::", 0);
  ASSERT_EQ(rdma_bind_addr(id, sa(any6)), 0) << strerror(errno);
  EXPECT_EQ(id->verbs, nullptr);
  EXPECT_EQ(rdma_get_local_addr(id)->sa_family, AF_INET6);
  EXPECT_NE(rdma_get_src_port(id), 0);
  sockaddr_in me = addr4(my_ip(), 7471);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(me), 2000), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // An id bound to our IPv4 address cannot resolve an IPv6 destination, nor can an IPv4
  // source be given for one.
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in mine = addr4(my_ip(), 0);
  ASSERT_EQ(rdma_bind_addr(id, sa(mine)), 0);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(loop6), 2000), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(rdma_resolve_addr(id, sa(mine), sa(loop6), 2000), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// rdma_getaddrinfo with IPv6 literals: "::1", the bracketed "[::1]" (an extension of ours),
// a passive wildcard, and malformed brackets (EAI_NONAME, as an unparsable name).
TEST_F(Cma, GetaddrinfoIpv6Literals) {
  if (!host_has6("::1")) GTEST_SKIP() << "no IPv6 on this host (cannot bind ::1)";
  for (const char* node : {"::1", "[::1]"}) {
    rdma_addrinfo hints{}, *res = nullptr;
    hints.ai_flags = RAI_NUMERICHOST;
    ASSERT_EQ(rdma_getaddrinfo(node, "7471", &hints, &res), 0) << node;
    EXPECT_EQ(res->ai_family, AF_INET6) << node;
    ASSERT_NE(res->ai_dst_addr, nullptr);
    EXPECT_EQ(res->ai_dst_len, sizeof(sockaddr_in6));
    auto* d = reinterpret_cast<sockaddr_in6*>(res->ai_dst_addr);
    EXPECT_EQ(d->sin6_family, AF_INET6);
    EXPECT_TRUE(IN6_IS_ADDR_LOOPBACK(&d->sin6_addr)) << node;
    EXPECT_EQ(ntohs(d->sin6_port), 7471);
    EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
    rdma_freeaddrinfo(res);
  }
  rdma_addrinfo hints{}, *res = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_family = AF_INET6;
  hints.ai_port_space = RDMA_PS_UDP;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, "7174", &hints, &res), 0);
  ASSERT_NE(res->ai_src_addr, nullptr);
  EXPECT_EQ(res->ai_dst_addr, nullptr);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(res->ai_src_addr);
  EXPECT_EQ(s6->sin6_family, AF_INET6);
  EXPECT_TRUE(IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr));
  EXPECT_EQ(ntohs(s6->sin6_port), 7174);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_UD);
  rdma_freeaddrinfo(res);
  for (const char* node : {"[::1", "[]", "[::1]x"}) {
    res = nullptr;
    hints = {};
    EXPECT_EQ(rdma_getaddrinfo(node, "7471", &hints, &res), EAI_NONAME) << node;
  }
}

TEST(CmaPlain, EventStrAndUnsupported) {
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(99)), "UNKNOWN EVENT");
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP), 0);
  sockaddr_in mc = addr4("239.1.1.1", 0);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(id, sa(mc), nullptr), -1);  // no device yet (unbound)
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // rsockets exist (rsocket_test.cc); UDP rsockets are not built.
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, 0), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // rpoll passes plain descriptors through to poll.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  pollfd p{fds[0], POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 1000), 1);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace

namespace {
// Run by the rdmacm_no_device test (SOFTRNIC_NAME invalid: the shim lists no device).
TEST(CmaNoDevice, EverythingFailsWithEnodev) {
  if (std::getenv("RDMACM_TEST_NO_DEVICE") == nullptr) GTEST_SKIP() << "run by rdmacm_no_device";
  errno = 0;
  EXPECT_EQ(rdma_create_event_channel(), nullptr);
  EXPECT_EQ(errno, ENODEV);
  rdma_cm_id* id = nullptr;
  EXPECT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), -1);
  EXPECT_EQ(errno, ENODEV);
  rdma_addrinfo* res = nullptr;
  EXPECT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", nullptr, &res), -1);
  EXPECT_EQ(errno, ENODEV);
  int n = -1;
  ibv_context** l = rdma_get_devices(&n);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(n, 0);
  EXPECT_EQ(l[0], nullptr);
  rdma_free_devices(l);
}
}  // namespace

namespace {

// Both ends in this process on its one device (the REQ goes out on UDP to our own address
// and comes back to our own agent): the event sequences of cm-notes §2.2.
class CmaLoop : public Cma {
 protected:
  void SetUp() override {
    Cma::SetUp();
    REQUIRE_CM_AGENT();
  }
  // A listener on our address and port `port`, on the fixture's channel.
  rdma_cm_id* listener(rdma_port_space ps, uint16_t port) {
    rdma_cm_id* l = nullptr;
    if (rdma_create_id(ch_, &l, nullptr, ps) != 0) return nullptr;
    sockaddr_in s = addr4(my_ip(), port);
    if (rdma_bind_addr(l, sa(s)) != 0 || rdma_listen(l, 4) != 0) return nullptr;
    return l;
  }
  static ibv_qp_init_attr qp_attr(ibv_qp_type t) {
    ibv_qp_init_attr qa{};
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qa.qp_type = t;
    return qa;
  }
  // Next event, which must be of type `want` (else nullptr, and the test fails).
  rdma_cm_event* expect_event(rdma_cm_event_type want) {
    rdma_cm_event* ev = next_event(ch_);
    EXPECT_NE(ev, nullptr) << "no event, wanted " << rdma_event_str(want);
    if (ev == nullptr) return nullptr;
    EXPECT_STREQ(rdma_event_str(ev->event), rdma_event_str(want));
    return ev->event == want ? ev : nullptr;
  }
};

TEST_F(CmaLoop, RcConnectAcceptDisconnectSequence) {
  rdma_cm_id* l = listener(RDMA_PS_TCP, 7601);
  ASSERT_NE(l, nullptr) << strerror(errno);
  rdma_cm_id* c = resolved(RDMA_PS_TCP, my_ip(), 7601);
  ASSERT_NE(c, nullptr);
  ibv_qp_init_attr qa = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(c, nullptr, &qa), 0);
  const char hello[] = "hello from the active side";
  rdma_conn_param p{};
  p.private_data = hello;
  p.private_data_len = sizeof hello;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 15;  // clamped to 7
  p.rnr_retry_count = 7;
  ASSERT_EQ(rdma_connect(c, &p), 0) << strerror(errno);
  rdma_cm_event* ev = expect_event(RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->listen_id, l);
  rdma_cm_id* s = ev->id;
  EXPECT_NE(s, l) << "a new id";
  EXPECT_EQ(s->verbs, l->verbs == nullptr ? c->verbs : l->verbs);
  EXPECT_EQ(s->context, l->context);
  EXPECT_EQ(s->ps, RDMA_PS_TCP);
  EXPECT_EQ(ev->param.conn.private_data_len, 56) << "REQ: 92 - 36";
  EXPECT_EQ(std::memcmp(ev->param.conn.private_data, hello, sizeof hello), 0);
  EXPECT_EQ(static_cast<const uint8_t*>(ev->param.conn.private_data)[55], 0) << "zero-padded";
  EXPECT_EQ(ev->param.conn.retry_count, 7);
  EXPECT_EQ(ev->param.conn.qp_num, c->qp->qp_num);
  EXPECT_EQ(rdma_get_dst_port(s), rdma_get_src_port(c)) << "addresses from the CMA header";
  EXPECT_EQ(ntohs(rdma_get_src_port(s)), 7601);
  ibv_qp_init_attr sqa = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(s, nullptr, &sqa), 0);
  uint8_t big[200] = {};
  rdma_conn_param ap{};
  ap.private_data = big;
  ap.private_data_len = 197;  // REP carries 196
  EXPECT_EQ(rdma_accept(s, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  const char welcome[] = "welcome";
  ap.private_data = welcome;
  ap.private_data_len = sizeof welcome;
  ap.responder_resources = 1;
  ap.initiator_depth = 1;
  ASSERT_EQ(rdma_accept(s, &ap), 0) << strerror(errno);
  rdma_ack_cm_event(ev);
  // Both sides ESTABLISHED (the active one on the REP, the passive one on the RTU).
  int est = 0;
  for (int i = 0; i < 2; ++i) {
    ev = expect_event(RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_NE(ev, nullptr);
    if (ev->id == c) {
      EXPECT_EQ(ev->param.conn.private_data_len, 196);
      EXPECT_STREQ(static_cast<const char*>(ev->param.conn.private_data), welcome);
      EXPECT_EQ(ev->param.conn.qp_num, s->qp->qp_num);
    }
    est |= ev->id == c ? 1 : ev->id == s ? 2 : 0;
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(est, 3);
  // The QPs are in RTS, pointed at each other, PSNs crossed.
  ibv_qp_attr ca{}, sa2{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(c->qp, &ca, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN |
                                         IBV_QP_TIMEOUT | IBV_QP_ACCESS_FLAGS, &ia), 0);
  ASSERT_EQ(ibv_query_qp(s->qp, &sa2, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &ia), 0);
  EXPECT_EQ(ca.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(sa2.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(ca.dest_qp_num, s->qp->qp_num);
  EXPECT_EQ(sa2.dest_qp_num, c->qp->qp_num);
  EXPECT_EQ(ca.sq_psn, sa2.rq_psn);
  EXPECT_EQ(sa2.sq_psn, ca.rq_psn);
  EXPECT_EQ(ca.timeout, 19);
  EXPECT_TRUE(ca.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) << "INIT->INIT re-applied the access";
  EXPECT_TRUE(ca.qp_access_flags & IBV_ACCESS_REMOTE_READ);
  // Disconnect from the active side: DISCONNECTED on both, then TIMEWAIT_EXIT (ids alive).
  ASSERT_EQ(rdma_disconnect(c), 0);
  ev = expect_event(RDMA_CM_EVENT_DISCONNECTED);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, s) << "the peer hears the DREQ first";
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_disconnect(s), 0) << "answers with the DREP";
  int seen_disc = 0, seen_tw = 0;
  for (int i = 0; i < 3; ++i) {
    ev = next_event(ch_);
    ASSERT_NE(ev, nullptr) << "wanted DISCONNECTED(c) and TIMEWAIT_EXIT(c, s)";
    if (ev->event == RDMA_CM_EVENT_DISCONNECTED) seen_disc += ev->id == c;
    if (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT) seen_tw++;
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(seen_disc, 1);
  EXPECT_EQ(seen_tw, 2);
  rdma_destroy_qp(s);
  rdma_destroy_qp(c);
  EXPECT_EQ(rdma_destroy_id(s), 0);
  EXPECT_EQ(rdma_destroy_id(c), 0);
  EXPECT_EQ(rdma_destroy_id(l), 0);
}

TEST_F(CmaLoop, RejectCarriesReasonAndPrivateData) {
  rdma_cm_id* l = listener(RDMA_PS_TCP, 7602);
  ASSERT_NE(l, nullptr);
  rdma_cm_id* c = resolved(RDMA_PS_TCP, my_ip(), 7602);
  ASSERT_NE(c, nullptr);
  ibv_qp_init_attr qa = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(c, nullptr, &qa), 0);
  ASSERT_EQ(rdma_connect(c, nullptr), 0);
  rdma_cm_event* ev = expect_event(RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* s = ev->id;
  uint8_t big[150] = {};
  EXPECT_EQ(rdma_reject(s, big, 149), -1) << "REJ carries 148";
  EXPECT_EQ(errno, EINVAL);
  const char why[] = "connection rejected";
  ASSERT_EQ(rdma_reject(s, why, sizeof why), 0);
  rdma_ack_cm_event(ev);
  ev = expect_event(RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, c);
  EXPECT_EQ(ev->status, 28) << "consumer defined";
  EXPECT_EQ(ev->param.conn.private_data_len, 148);
  EXPECT_STREQ(static_cast<const char*>(ev->param.conn.private_data), why);
  rdma_ack_cm_event(ev);
  rdma_destroy_qp(c);
  EXPECT_EQ(rdma_destroy_id(s), 0);
  EXPECT_EQ(rdma_destroy_id(c), 0);
  EXPECT_EQ(rdma_destroy_id(l), 0);
}

TEST_F(CmaLoop, NoQpOnTheIdGivesConnectResponseThenEstablish) {
  rdma_cm_id* l = listener(RDMA_PS_TCP, 7603);
  ASSERT_NE(l, nullptr);
  rdma_cm_id* c = resolved(RDMA_PS_TCP, my_ip(), 7603);
  ASSERT_NE(c, nullptr);
  rdma_conn_param p{};
  p.qp_num = 0x123456;  // a QP the application drives itself
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(c, &p), 0);
  rdma_cm_event* ev = expect_event(RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* s = ev->id;
  EXPECT_EQ(ev->param.conn.qp_num, 0x123456u);
  rdma_conn_param ap{};
  ap.qp_num = 0x654321;
  ASSERT_EQ(rdma_accept(s, &ap), 0);
  rdma_ack_cm_event(ev);
  ev = expect_event(RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, c);
  EXPECT_EQ(ev->param.conn.qp_num, 0x654321u);
  rdma_ack_cm_event(ev);
  // What the application's QP gets: RTR towards the peer's QPN over a global route.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  int mask = 0;
  ASSERT_EQ(rdma_init_qp_attr(c, &a, &mask), 0);
  EXPECT_EQ(a.dest_qp_num, 0x654321u);
  EXPECT_EQ(a.ah_attr.is_global, 1);
  EXPECT_TRUE(mask & IBV_QP_AV);
  ASSERT_EQ(rdma_establish(c), 0);
  ev = expect_event(RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, s) << "only the passive side gets ESTABLISHED (on the RTU)";
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(c), 0);
  EXPECT_EQ(rdma_destroy_id(s), 0);
  EXPECT_EQ(rdma_destroy_id(l), 0);
}

TEST_F(CmaLoop, UdSidrResolvesTheServiceQp) {
  rdma_cm_id* l = listener(RDMA_PS_UDP, 7604);
  ASSERT_NE(l, nullptr);
  rdma_cm_id* c = resolved(RDMA_PS_UDP, my_ip(), 7604);
  ASSERT_NE(c, nullptr);
  ibv_qp_init_attr qa = qp_attr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(c, nullptr, &qa), 0);
  const char hi[] = "udp hello";
  rdma_conn_param p{};
  p.private_data = hi;
  p.private_data_len = sizeof hi;
  ASSERT_EQ(rdma_connect(c, &p), 0);
  rdma_cm_event* ev = expect_event(RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* s = ev->id;
  EXPECT_EQ(ev->param.ud.private_data_len, 180) << "SIDR_REQ: 216 - 36";
  EXPECT_STREQ(static_cast<const char*>(ev->param.ud.private_data), hi);
  ibv_qp_init_attr sqa = qp_attr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(s, nullptr, &sqa), 0);
  ASSERT_EQ(rdma_accept(s, nullptr), 0);
  rdma_ack_cm_event(ev);
  ev = expect_event(RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, c) << "no ESTABLISHED on the passive side";
  EXPECT_EQ(ev->param.ud.qp_num, s->qp->qp_num);
  EXPECT_EQ(ev->param.ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  EXPECT_EQ(ev->param.ud.ah_attr.is_global, 1);
  ibv_ah* ah = ibv_create_ah(c->pd, &ev->param.ud.ah_attr);
  EXPECT_NE(ah, nullptr) << "the event's ah_attr makes an address handle";
  if (ah) ibv_destroy_ah(ah);
  rdma_ack_cm_event(ev);
  rdma_destroy_qp(s);
  rdma_destroy_qp(c);
  EXPECT_EQ(rdma_destroy_id(s), 0);
  EXPECT_EQ(rdma_destroy_id(c), 0);
  EXPECT_EQ(rdma_destroy_id(l), 0);
}

TEST_F(CmaLoop, UdNoListenerIsUnreachable) {
  rdma_cm_id* c = resolved(RDMA_PS_UDP, my_ip(), 7605);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(rdma_connect(c, nullptr), 0);
  rdma_cm_event* ev = expect_event(RDMA_CM_EVENT_UNREACHABLE);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->status, 1) << "SIDR status 1: service ID not supported";
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(c), 0);
}

}  // namespace
