// emu/objects/device.cc: Device — configuration, attributes, port and GID table, and the
// control-path verbs creating and destroying every object.
#include "emu/objects/device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "base/hash.h"

namespace rnic::emu {

namespace {

uint64_t seed_or_random(uint64_t seed, uint64_t salt) {
  if (seed != 0) return seed ^ salt;
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// Limits: the configured ones, else param.h's; a daemon client's slot (DeviceConfig::slot)
// holds fewer QPNs and keys than a whole device.
uint32_t max_qp_of(const DeviceConfig& cfg) {
  uint32_t m = cfg.max_qp != 0 ? cfg.max_qp : kMaxQp;
  return cfg.slot != 0 ? std::min<uint32_t>(m, 0xF000) : m;
}
uint32_t max_mr_of(const DeviceConfig& cfg) {
  uint32_t m = cfg.max_mr != 0 ? cfg.max_mr : kMaxMr;
  return cfg.slot != 0 ? std::min<uint32_t>(m, KeyTable::kPrefixMaxMr) : m;
}
uint32_t max_mw_of(const DeviceConfig& cfg) {
  return cfg.slot != 0 ? std::min<uint32_t>(kMaxMw, KeyTable::kPrefixMaxMw) : kMaxMw;
}

KeyTable::Options key_options(const DeviceConfig& cfg) {
  KeyTable::Options o;
  o.secure = cfg.secure_keys;
  o.max_mr = max_mr_of(cfg);
  o.max_mw = max_mw_of(cfg);
  o.seed = cfg.key_seed;
  o.prefix = cfg.slot;
  return o;
}

}  // namespace

Mtu active_mtu_for_netdev(uint32_t netdev_mtu) {
  uint32_t room = netdev_mtu > kRoceHeaderOverhead ? netdev_mtu - kRoceHeaderOverhead : 0;
  if (room >= 4096) return Mtu::k4096;
  if (room >= 2048) return Mtu::k2048;
  if (room >= 1024) return Mtu::k1024;
  if (room >= 512) return Mtu::k512;
  return Mtu::k256;
}

namespace {

bool v4_of(const sockaddr* sa, uint32_t* out) {
  if (sa == nullptr || sa->sa_family != AF_INET) return false;
  *out = reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr;
  return true;
}

// Interface address order in the GID table after index 0: IPv6 global, then IPv6 link-local;
// other IPv4 addresses are not listed (-1: each may be another device's SOFTRNIC_IP).
int gid_rank(const wire::Endpoint& e) { return !e.ipv6 ? -1 : e.link_local() ? 1 : 0; }

}  // namespace

bool ip_on_loopback(const std::string& ip) {
  if (ip.rfind("127.", 0) == 0) return true;
  Result<NetIf> nif = interface_of(ip);
  return nif && nif->loopback;
}

Result<NetIf> interface_of(const std::string& ip) {
  std::optional<wire::Endpoint> want = wire::Endpoint::parse(ip, 0);
  if (!want) return Errc::kInval;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Errc::kNoDev;
  std::string exact, subnet;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    wire::Endpoint e;
    if (!e.from_sockaddr(i->ifa_addr, i->ifa_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                                          : sizeof(sockaddr_in)))
      continue;
    if (e.same_ip(*want) && (!e.link_local() || want->scope_id == 0 || e.scope_id == want->scope_id) &&
        exact.empty())
      exact = i->ifa_name;
    uint32_t a = 0, m = 0xFFFFFFFFu;
    if (!want->ipv6 && v4_of(i->ifa_addr, &a)) {
      (void)v4_of(i->ifa_netmask, &m);
      const uint32_t w = htonl(want->v4_host());
      if ((a & m) == (w & m) && subnet.empty()) subnet = i->ifa_name;
    }
  }
  NetIf out;
  out.name = !exact.empty() ? exact : subnet;
  if (out.name.empty()) {
    freeifaddrs(list);
    return Errc::kNoDev;
  }
  out.index = if_nametoindex(out.name.c_str());
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || out.name != i->ifa_name) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) != 0) out.loopback = true;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    wire::Endpoint e;
    if (e.from_sockaddr(i->ifa_addr, fam == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in)))
      out.addrs.push_back(e);
  }
  freeifaddrs(list);
  return out;
}

Result<uint32_t> interface_mtu_for(const std::string& ip) {
  Result<NetIf> nif = interface_of(ip);
  if (!nif) return nif.error();
  const std::string& ifname = nif->name;
  // sysfs first (no socket needed); else the SIOCGIFMTU ioctl on a throwaway socket.
  std::ifstream f("/sys/class/net/" + ifname + "/mtu");
  uint32_t mtu = 0;
  if (f >> mtu && mtu != 0) return mtu;
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return Errc::kNoDev;
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname.c_str());
  int rc = ::ioctl(s, SIOCGIFMTU, &ifr);
  ::close(s);
  if (rc != 0 || ifr.ifr_mtu <= 0) return Errc::kNoDev;
  return static_cast<uint32_t>(ifr.ifr_mtu);
}

std::vector<GidEntry> gid_table_for(const wire::Endpoint& primary, const NetIf* nif) {
  size_t t_size = 0;
  auto entry = [&](const wire::Endpoint& e) {
    GidEntry g;
    if (e.ipv6) {
      std::memcpy(g.raw.data(), e.addr, 16);
    } else {  // IPv4-mapped ::ffff:a.b.c.d
      g.raw[10] = g.raw[11] = 0xFF;
      std::memcpy(&g.raw[12], e.addr, 4);
    }
    g.type = GidType::kRoceV2;
    g.addr = e;
    g.addr.src_index = static_cast<uint8_t>(t_size);
    g.addr.port = 0;
    if (g.addr.link_local() && g.addr.scope_id == 0 && nif != nullptr) g.addr.scope_id = nif->index;
    if (nif != nullptr) g.netdev = nif->name;
    return g;
  };
  std::vector<GidEntry> t{entry(primary)};
  // A loopback interface's addresses (::1, 127.0.0.1) belong to every device on the host, so
  // only the device's own address is listed there.
  if (nif == nullptr || nif->loopback) return t;
  for (int rank = 0; rank < 2; ++rank) {
    for (const wire::Endpoint& e : nif->addrs) {
      if (gid_rank(e) != rank || e.same_ip(primary) || t.size() >= kGidTableLen) continue;
      t_size = t.size();
      t.push_back(entry(e));
    }
  }
  return t;
}

uint64_t Device::now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// ---------------------------------------------------------------- open / close

Device::Device(const DeviceConfig& cfg)
    : cfg_(cfg),
      mem_(std::make_shared<SafeMemAccess>()),
      keys_(key_options(cfg)),
      pds_(1, 0xFFFFFF, kMaxPd, seed_or_random(cfg.key_seed, 1)),
      ahs_(1, 0xFFFFFF, kMaxAh, seed_or_random(cfg.key_seed, 2)),
      cqs_(1, 0xFFFFFF, kMaxCq, seed_or_random(cfg.key_seed, 3)),
      srqs_(1, 0xFFFFFF, kMaxSrq, seed_or_random(cfg.key_seed, 4)),
      xrcds_(1, 0xFFFFFF, kMaxXrcd, seed_or_random(cfg.key_seed, 8)),
      qps_(uint32_t{cfg.slot} << 16 | 0x11, cfg.slot != 0 ? uint32_t{cfg.slot} << 16 | 0xFFFE : 0xFFFFFE,
           max_qp_of(cfg),
           seed_or_random(cfg.key_seed, 5)),
      mws_(1, 0xFFFFFF, kMaxMw, seed_or_random(cfg.key_seed, 6)),
      mrs_(1, 0xFFFFFF, max_mr_of(cfg),
           seed_or_random(cfg.key_seed, 7)) {
  set_strict_src(cfg.strict_src, cfg.strict_src_port);
}

void Device::set_strict_src(bool on, uint16_t port) {
  uint32_t m = !on ? 0u : port != 0 ? (kStrictFixed | port) : kStrictLatch;
  strict_src_.store(m, std::memory_order_relaxed);
}

Status Device::set_secure_keys(bool on) {
  if (keys_.secure() == on) return Status::ok();
  if (!keys_.set_secure(on)) return Errc::kBusy;
  cfg_.secure_keys = on;
  return Status::ok();
}

Result<std::shared_ptr<Device>> Device::open(const DeviceConfig& cfg) {
  if (cfg.name.empty() || cfg.name.size() >= 64) return Errc::kInval;
  std::optional<wire::Endpoint> ip = wire::Endpoint::parse(cfg.ip, 0);
  if (!ip) return Errc::kInval;
  uint32_t netdev_mtu = cfg.netdev_mtu;
  if (netdev_mtu == 0) {
    Result<uint32_t> m = interface_mtu_for(cfg.ip);
    if (!m) return m.error();
    netdev_mtu = *m;
  }
  Result<NetIf> nif = interface_of(cfg.ip);
  Mtu active = active_mtu_for_netdev(netdev_mtu);
  if (cfg.active_mtu != 0) {
    switch (cfg.active_mtu) {
      case 256: active = Mtu::k256; break;
      case 512: active = Mtu::k512; break;
      case 1024: active = Mtu::k1024; break;
      case 2048: active = Mtu::k2048; break;
      case 4096: active = Mtu::k4096; break;
      default: return Errc::kInval;
    }
  }
  std::shared_ptr<Device> d(new Device(cfg));
  d->ipv4_ = ip->ipv6 ? 0 : ip->v4_host();
  d->gids_ = gid_table_for(*ip, nif ? &*nif : nullptr);

  // Node GUID (the CA GUID of the CM: Linux peers detect duplicate and stale connections by
  // it, so every device of every process needs its own, cm-notes §3.7/§6.6): cfg.node_guid,
  // else a hash of (name, IP, pid, a per-process random salt) — stable for a (name, IP) pair
  // within one process, different in every other process (and after fork). EUI-64 shaped
  // with the locally administered bit set and the group bit clear, so it can never equal a
  // real NIC's burned-in GUID.
  uint64_t guid = cfg.node_guid;
  if (guid == 0) {
    static const uint64_t salt = [] {
      std::random_device rd;
      return (uint64_t{rd()} << 32) ^ rd();
    }();
    const uint32_t pid = static_cast<uint32_t>(getpid());
    uint64_t h = base::fnv1a64(cfg.name);
    if (ip->ipv6) {
      h = base::fnv1a64(ip->addr, 16, h);
    } else {
      h = base::fnv1a64(&d->ipv4_, sizeof(d->ipv4_), h);
    }
    h = base::fnv1a64(&pid, sizeof pid, h);
    h = base::fnv1a64(&salt, sizeof salt, h);
    guid = h;
  }
  guid = (guid & ~(uint64_t{0xFF} << 56)) |
         (uint64_t((((guid >> 56) & 0xFF) | 0x02) & ~0x01u) << 56);

  DeviceAttr& at = d->attr_;
  at.fw_ver = kFwVer;
  at.node_guid = guid;
  at.sys_image_guid = guid;
  at.max_mr_size = kMaxMrSize;
  at.page_size_cap = kPageSizeCap;
  at.vendor_id = kVendorId;
  at.vendor_part_id = kVendorPartId;
  at.hw_ver = kHwVer;
  at.max_qp = static_cast<int>(max_qp_of(cfg));
  at.max_qp_wr = kMaxQpWr;
  at.device_cap_flags = kDevCapBadPkeyCntr | kDevCapBadQkeyCntr | kDevCapAutoPathMig |
                        kDevCapChangePhyPort | kDevCapUdAvPortEnforce |
                        kDevCapPortActiveEvent | kDevCapSysImageGuid | kDevCapRcRnrNakGen |
                        kDevCapSrqResize | kDevCapMemWindow | kDevCapMemWindowType2B |
                        kDevCapXrc;
  at.max_sge = kMaxSge;
  at.max_sge_rd = kMaxSgeRd;
  at.max_cq = kMaxCq;
  at.max_cqe = kMaxCqe;
  at.max_mr = static_cast<int>(max_mr_of(cfg));
  at.max_pd = kMaxPd;
  at.max_qp_rd_atom = kMaxQpRdAtom;
  at.max_res_rd_atom = kMaxResRdAtom;
  at.max_qp_init_rd_atom = kMaxQpInitRdAtom;
  at.atomic_cap = AtomicCap::kHca;
  at.max_mw = static_cast<int>(max_mw_of(cfg));
  at.max_mcast_grp = kMaxMcastGrp;
  at.max_mcast_qp_attach = kMaxMcastQpAttach;
  at.max_total_mcast_qp_attach = kMaxTotalMcastQpAttach;
  at.max_ah = kMaxAh;
  at.max_srq = kMaxSrq;
  at.max_srq_wr = kMaxSrqWr;
  at.max_srq_sge = kMaxSrqSge;
  at.max_pkeys = kMaxPkeys;
  at.local_ca_ack_delay = kLocalCaAckDelay;
  at.phys_port_cnt = kNumPorts;
  at.max_inline_data = kMaxInlineData;
  at.num_comp_vectors = kMaxCompVectors;

  PortAttr& p = d->port_;
  p.state = PortState::kActive;
  p.max_mtu = Mtu::k4096;
  p.active_mtu = active;
  p.gid_tbl_len = kGidTableSlots;  // the populated ones are gids_ (gids())
  p.port_cap_flags = kPortCapFlags;
  p.max_msg_sz = kPortMaxMsgSz;
  p.pkey_tbl_len = kPkeyTableLen;
  p.max_vl_num = 1;
  p.active_width = 1;   // 1X
  p.active_speed = 32;  // EDR (25 Gb/s per lane): the order of loopback UDP throughput
  p.phys_state = 5;     // LinkUp
  p.link_layer = kLinkLayerEthernet;
  return d;
}

Device::~Device() { close(); }

void Device::fatal() {
  if (fatal_.exchange(true, std::memory_order_acq_rel)) return;
  for (const std::shared_ptr<Qp>& qp : qps_.snapshot()) {
    std::lock_guard s(qp->send_mutex());
    std::lock_guard r(qp->recv_mutex());
    if (qp->state() != QpState::kReset && qp->state() != QpState::kErr) qp->enter_error_locked(false);
  }
  AsyncEvent ev;
  ev.type = EventType::kDeviceFatal;
  events_.push(std::move(ev));
}

void Device::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& qp : qps_.snapshot()) (void)destroy_qp(qp);
  for (auto& cq : cqs_.snapshot())
    if (cq->channel_) cq->channel_->forget(cq.get());
  srqs_.clear();
  xrcds_.clear();
  cqs_.clear();
  // No access through any window or region is running or can start once close returns.
  for (auto& mw : mws_.snapshot()) mw->gate_.close_and_drain();
  for (auto& mr : mrs_.snapshot()) {
    {
      std::unique_lock lk(mr->mu_);
      mr->state_ = MrState::kInvalid;
      mr->publish_view_locked();
    }
    mr->gate_.close_and_drain();
    release_pin(*mr);
  }
  mws_.clear();
  keys_.clear();
  mrs_.clear();
  ahs_.clear();
  pds_.clear();
  {
    std::lock_guard lk(chan_mu_);
    channels_.clear();
  }
  AsyncEvent ev;
  while (events_.try_get(&ev)) {
  }
  engine_.reset();
}

// ---------------------------------------------------------------- attributes

Result<PortAttr> Device::query_port(uint8_t port_num) const {
  if (port_num != 1) return Errc::kInval;
  PortAttr p = port_;
  p.state = port_state_.load();
  p.phys_state = p.state == PortState::kActive ? 5 : 3;  // LinkUp / Disabled
  p.bad_pkey_cntr = bad_pkey_cntr_.load(std::memory_order_relaxed);
  p.qkey_viol_cntr = qkey_viol_cntr_.load(std::memory_order_relaxed);
  return p;
}

Result<GidEntry> Device::query_gid(uint8_t port_num, int index) const {
  if (port_num != 1 || index < 0 || index >= static_cast<int>(gids_.size())) return Errc::kInval;
  return gids_[static_cast<size_t>(index)];
}

void Device::truncate_gids(size_t n) {
  if (n >= 1 && n < gids_.size()) {
    gids_.resize(n);
  }
}

Result<uint16_t> Device::query_pkey(uint8_t port_num, int index) const {
  if (port_num != 1 || index < 0 || index >= kPkeyTableLen) return Errc::kInval;
  return kDefaultPkey;
}

void Device::set_port_state(PortState s) {
  PortState old = port_state_.exchange(s);
  if (old == s) return;
  AsyncEvent ev;
  ev.port_num = 1;
  if (s == PortState::kActive) {
    ev.type = EventType::kPortActive;
    events_.push(std::move(ev));
  } else if (old == PortState::kActive) {
    ev.type = EventType::kPortErr;
    events_.push(std::move(ev));
  }
}

// ---------------------------------------------------------------- PD

Result<std::shared_ptr<Pd>> Device::alloc_pd() {
  if (is_fatal()) return Errc::kIo;  // a lost device makes nothing new (as rdma-core: EIO)
  auto pd = std::make_shared<Pd>(*this, 0);
  Result<uint32_t> h = pds_.insert_next(pd);
  if (!h) return h.error();
  pd->handle_ = *h;
  return pd;
}

Status Device::dealloc_pd(const std::shared_ptr<Pd>& pd) {
  if (!pd || &pd->device() != this) return Errc::kInval;
  if (pd->users() != 0) return Errc::kBusy;
  if (!pds_.erase(pd->handle())) return Errc::kInval;
  return Status::ok();
}

// ---------------------------------------------------------------- AH

Result<Av> resolve_ah_attr(const Device& dev, const AhAttr& a) {
  if (!a.is_global) return Errc::kInval;  // RoCE has no LIDs: a GRH is mandatory
  if (a.port_num != 1) return Errc::kInval;
  Result<GidEntry> sgid = dev.query_gid(1, a.grh.sgid_index);
  if (!sgid) return Errc::kInval;
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  const bool v4 = std::memcmp(a.grh.dgid, kMappedPrefix, 12) == 0;
  // RoCEv2 carries the GRH as an IP header of the DGID's family, from the SGID's address:
  // both must be of one family (the kernel's rdma_addr resolution refuses a mix too). An
  // unspecified IPv6 DGID names no peer; a multicast one (ff00::/8, or ::ffff:224.0.0.0/4)
  // is a UD multicast destination (the IP group).
  if (v4 == sgid->addr.ipv6) return Errc::kInval;
  static constexpr uint8_t kZero[16] = {};
  if (!v4 && std::memcmp(a.grh.dgid, kZero, 16) == 0) return Errc::kInval;
  Av av;
  std::memcpy(av.dgid, a.grh.dgid, 16);
  // Any 32-bit flow label is accepted and its low 20 bits used, as the kernel does (UCX
  // passes 0xffffffff); the IPv6 flow label field is 20 bits (IBA A17.4.5.1 / RFC 6437).
  av.flow_label = a.grh.flow_label & 0xfffffu;
  av.sgid_index = a.grh.sgid_index;
  av.hop_limit = a.grh.hop_limit;
  av.traffic_class = a.grh.traffic_class;
  av.sl = a.sl;
  av.port_num = a.port_num;
  av.ipv4 = v4;
  if (v4) {
    av.dest_ipv4 = (uint32_t{a.grh.dgid[12]} << 24) | (uint32_t{a.grh.dgid[13]} << 16) |
                   (uint32_t{a.grh.dgid[14]} << 8) | a.grh.dgid[15];
  } else if ((a.grh.dgid[0] == 0xfe && (a.grh.dgid[1] & 0xc0) == 0x80) || a.grh.dgid[0] == 0xff) {
    // A link-local peer (or a multicast group) is reached on the SGID's interface.
    av.scope_id = sgid->addr.scope_id;
  }
  return av;
}

Result<std::shared_ptr<Ah>> Device::create_ah(const std::shared_ptr<Pd>& pd,
                                              const AhAttr& attr) {
  if (!pd || &pd->device() != this) return Errc::kInval;
  Result<Av> av = resolve_ah_attr(*this, attr);
  if (!av) return av.error();
  auto ah = std::make_shared<Ah>(*this, 0, pd, attr, *av);
  Result<uint32_t> h = ahs_.insert_next(ah);
  if (!h) return h.error();
  ah->handle_ = *h;
  pd->add_user();
  return ah;
}

Status Device::destroy_ah(const std::shared_ptr<Ah>& ah) {
  if (!ah || !ahs_.erase(ah->handle())) return Errc::kInval;
  ah->pd()->drop_user();
  return Status::ok();
}

// ---------------------------------------------------------------- MR

// After the gate drained: no access uses the device view any more, and the application may
// unmap the buffer as soon as dereg returns (its private pages are given back here, pin.h).
void Device::release_pin(Mr& mr) {
  std::shared_ptr<PinnedRange> pin;
  {
    std::unique_lock lk(mr.mu_);
    pin = std::move(mr.pin_);
    mr.publish_view_locked();
  }
}

Result<std::shared_ptr<Mr>> Device::reg_mr(const std::shared_ptr<Pd>& pd, uint64_t addr,
                                           uint64_t length, uint64_t iova, uint32_t access) {
  if (!pd || &pd->device() != this) return Errc::kInval;
  if (length == 0) return Errc::kInval;
  if (addr + length < addr || iova + length < iova) return Errc::kInval;  // wraps
  if (Status st = check_mr_access(access); !st) return st;
  // ODP (IBV_ACCESS_ON_DEMAND): nothing is pinned or checked against the mappings now; the
  // device reaches the application's addresses directly through the fault-safe accessor,
  // so a page mapped later is served and one unmapped at access time is a page fault the
  // NIC cannot resolve: a remote access error / local protection error, counted mem_fault.
  // Implicit ODP: addr NULL, length SIZE_MAX (the whole address space, iova 0).
  const bool odp = (access & kAccessOnDemand) != 0;
  const bool implicit = odp && addr == 0 && length == UINT64_MAX;
  // The kernel's ib_umem_get: an end whose page alignment wraps is EINVAL.
  if (!implicit && addr + length > UINT64_MAX - 4095) return Errc::kInval;
  if (odp) {
    if (implicit && iova != 0) return Errc::kInval;
    if (!implicit && length > attr_.max_mr_size) return Errc::kInval;
  } else {
    // The kernel's pin: unmapped / PROT_NONE / read-only-for-write -> EFAULT (mr.h).
    if (Status st = check_mr_range(addr, length, access, attr_.max_mr_size); !st) return st;
  }
  mem_->prepare();  // the fault guard is in place before any rkey can be used
  return add_mr(std::make_shared<Mr>(*this, pd, addr, length, iova,
                                     access & ~kAccessOptionalRange,
                                     odp ? nullptr : pin_range(addr, length, cfg_.pin)));
}

Result<std::shared_ptr<Mr>> Device::reg_dm_mr(const std::shared_ptr<Pd>& pd, uint64_t addr,
                                              uint64_t length, uint32_t access) {
  if (!pd || &pd->device() != this) return Errc::kInval;
  if (addr + length < addr) return Errc::kInval;
  if (Status st = check_mr_access(access); !st) return st;
  mem_->prepare();
  return add_mr(std::make_shared<Mr>(*this, pd, addr, length, 0, access & ~kAccessOptionalRange,
                                     nullptr));
}

Result<std::shared_ptr<Mr>> Device::add_mr(std::shared_ptr<Mr> mr) {
  const std::shared_ptr<Pd>& pd = mr->pd_;
  Result<uint32_t> h = mrs_.insert_next(mr);
  if (!h) return h.error();
  mr->handle_ = *h;
  Result<uint32_t> key = keys_.add_mr(mr);
  if (!key) {
    mrs_.erase(*h);
    return key.error();
  }
  {
    std::unique_lock lk(mr->mu_);
    mr->key_.store(*key, std::memory_order_release);
    mr->publish_view_locked();
  }
  pd->add_user();
  return mr;
}

Status Device::advise_mr(const Pd* pd, const Sge& sge, bool write, bool fault_in, bool sync) {
  std::shared_ptr<Mr> mr = keys_.find_mr(sge.lkey);
  if (!mr) return Errc::kFault;
  AccessGuard g;  // dereg waits for the prefetch; a closed gate (dereg, rereg) is EFAULT
  if (!g.acquire(mr->gate(), mr)) return Errc::kFault;
  MrView v = mr->view();
  if (v.state != MrState::kValid || v.key != sge.lkey || v.pd != pd) return Errc::kFault;
  if (!(v.access & kAccessOnDemand)) return Errc::kFault;
  if (write && !(v.access & kAccessLocalWrite)) return Errc::kFault;
  if (!v.in_range(sge.addr, sge.length)) return Errc::kFault;
  if (!fault_in || sge.length == 0) return Status::ok();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t lo = v.translate(sge.addr) & ~(page - 1);
  const uint64_t hi = v.translate(sge.addr) + sge.length;  // no overflow: in_range
  const int rc = ::madvise(reinterpret_cast<void*>(lo), hi - lo,
                           write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
  if (rc != 0 && sync) return Errc::kFault;
  return Status::ok();
}

Status Device::rereg_mr(const std::shared_ptr<Mr>& mr, uint32_t flags,
                        const std::shared_ptr<Pd>& pd, uint64_t addr, uint64_t length,
                        uint32_t access) {
  if (!mr || mr->dev_ != this) return Errc::kInval;
  if (flags == 0 || (flags & ~kReregFlagsSupported)) return Errc::kInval;
  if ((flags & kReregChangePd) && (!pd || &pd->device() != this)) return Errc::kInval;
  if (flags & kReregChangeTranslation) {
    if (length == 0 || addr + length < addr) return Errc::kInval;
  }
  if (flags & kReregChangeAccess) {
    if (Status st = check_mr_access(access); !st) return st;
  }
  if (mr->bound_mws() != 0) return Errc::kBusy;
  if (flags & (kReregChangeTranslation | kReregChangeAccess)) {
    // A new range, or new rights over the old one, is pinned again (EFAULT as reg_mr).
    MrView v = mr->view();
    const uint64_t a = (flags & kReregChangeTranslation) ? addr : v.host_addr;
    const uint64_t n = (flags & kReregChangeTranslation) ? length : v.length;
    const uint32_t acc = (flags & kReregChangeAccess) ? access : v.access;
    // ODP-ness cannot change (mlx5: EOPNOTSUPP); an ODP range is not checked or pinned.
    if ((acc ^ v.access) & kAccessOnDemand) return Errc::kOpNotSupp;
    if (acc & kAccessOnDemand) {
      if (n > attr_.max_mr_size) return Errc::kInval;
    } else if (Status st = check_mr_range(a, n, acc, attr_.max_mr_size); !st) {
      return st;
    }
  }
  std::shared_ptr<Pd> old_pd;
  // A new range is pinned before the switch; the old pin is released after it (declared
  // before `closed`: released once the gate has reopened and no access uses the old view).
  std::shared_ptr<PinnedRange> pin;
  if ((flags & kReregChangeTranslation) && !(mr->access() & kAccessOnDemand))
    pin = pin_range(addr, length, cfg_.pin);
  // Accesses in flight through the old translation/rights finish first (issue 10 item 3);
  // accesses arriving meanwhile are refused (the MR is in transition).
  GateClosed closed{mr->gate_};
  {
    std::unique_lock lk(mr->mu_);
    if (mr->state_ != MrState::kValid) return Errc::kInval;
    if (flags & kReregChangeTranslation) {
      std::swap(mr->pin_, pin);
      mr->host_addr_ = addr;
      mr->iova_ = addr;
      mr->length_ = length;
    }
    if (flags & kReregChangeAccess) mr->access_ = access & ~kAccessOptionalRange;
    if ((flags & kReregChangePd) && pd != mr->pd_) {
      old_pd = mr->pd_;
      pd->add_user();
      mr->pd_ = pd;
    }
    if (flags & (kReregChangeTranslation | kReregChangePd)) {
      // New key: in-flight users of the old translation/PD must not match any more.
      Result<uint32_t> nk = keys_.rekey_mr(mr->key_.load());
      if (nk) mr->key_.store(*nk, std::memory_order_release);
    }
    mr->publish_view_locked();
  }
  if (old_pd) old_pd->drop_user();
  return Status::ok();
}

Status Device::dereg_mr(const std::shared_ptr<Mr>& mr) {
  if (!mr || mr->dev_ != this) return Errc::kInval;
  if (mr->bound_mws() != 0) return Errc::kBusy;  // ibv_dereg_mr while a MW is bound (S17)
  {
    std::unique_lock lk(mr->mu_);
    if (mr->state_ != MrState::kValid) return Errc::kInval;
    mr->state_ = MrState::kInvalid;
    mr->publish_view_locked();
  }
  // Wait for the accesses in flight; the gate stays closed, so none starts afterwards and
  // the application may unmap the buffer as soon as we return (issue 10 item 3).
  mr->gate_.close_and_drain();
  release_pin(*mr);
  (void)keys_.remove(mr->lkey());
  mrs_.erase(mr->handle());
  mr->pd()->drop_user();
  return Status::ok();
}

// ---------------------------------------------------------------- MW

Result<std::shared_ptr<Mw>> Device::alloc_mw(const std::shared_ptr<Pd>& pd, MwType type) {
  if (!pd || &pd->device() != this) return Errc::kInval;
  if (type != MwType::kType1 && type != MwType::kType2) return Errc::kInval;
  auto mw = std::make_shared<Mw>(*this, pd, type);
  Result<uint32_t> h = mws_.insert_next(mw);
  if (!h) return h.error();
  mw->handle_ = *h;
  Result<uint32_t> key = keys_.add_mw(mw);
  if (!key) {
    mws_.erase(*h);
    return key.error();
  }
  {
    std::lock_guard lk(mw->mu_);
    mw->rkey_ = *key;
  }
  pd->add_user();
  return mw;
}

Status Device::dealloc_mw(const std::shared_ptr<Mw>& mw) {
  if (!mw || mw->dev_ != this) return Errc::kInval;
  uint32_t key;
  {
    std::lock_guard lk(mw->mu_);
    if (mw->state_ == MwState::kInvalid) return Errc::kInval;
  }
  // Accesses through the window finish before it dies; the gate stays closed.
  mw->gate_.close_and_drain();
  {
    std::lock_guard lk(mw->mu_);
    if (mw->state_ == MwState::kInvalid) return Errc::kInval;  // raced with another dealloc
    MwOps::unbind_locked(*mw);  // deallocating invalidates (S14)
    mw->state_ = MwState::kInvalid;
    key = mw->rkey_;
  }
  (void)keys_.remove(key);
  mws_.erase(mw->handle());
  mw->pd()->drop_user();
  return Status::ok();
}

// ---------------------------------------------------------------- CQ

Result<std::shared_ptr<CompChannel>> Device::create_comp_channel() {
  auto ch = std::make_shared<CompChannel>();
  if (ch->fd() < 0) return Errc::kMFile;
  std::lock_guard lk(chan_mu_);
  channels_.push_back(ch);
  return ch;
}

Status Device::destroy_comp_channel(const std::shared_ptr<CompChannel>& ch) {
  if (!ch) return Errc::kInval;
  if (ch->attached() != 0) return Errc::kBusy;
  std::lock_guard lk(chan_mu_);
  for (auto it = channels_.begin(); it != channels_.end(); ++it) {
    if (*it == ch) {
      channels_.erase(it);
      return Status::ok();
    }
  }
  return Errc::kInval;
}

Result<std::shared_ptr<Cq>> Device::create_cq(int cqe, std::shared_ptr<CompChannel> channel,
                                              int comp_vector) {
  if (is_fatal()) return Errc::kIo;
  if (cqe < 1 || cqe > attr_.max_cqe) return Errc::kInval;
  if (comp_vector < 0 || comp_vector >= static_cast<int>(attr_.num_comp_vectors))
    return Errc::kInval;
  auto cq = std::make_shared<Cq>(*this, 0, static_cast<uint32_t>(cqe), channel, comp_vector);
  Result<uint32_t> h = cqs_.insert_next(cq);
  if (!h) return h.error();
  cq->handle_ = *h;
  if (channel) channel->attached_.fetch_add(1);
  return cq;
}

Status Device::resize_cq(const std::shared_ptr<Cq>& cq, int cqe) {
  if (!cq || cqe < 1) return Errc::kInval;
  return cq->resize(static_cast<uint32_t>(cqe));
}

Status Device::destroy_cq(const std::shared_ptr<Cq>& cq) {
  if (!cq || cq->dev_ != this) return Errc::kInval;
  if (cq->users() != 0) return Errc::kBusy;
  if (!cqs_.erase(cq->handle())) return Errc::kInval;
  if (cq->channel_) {
    cq->channel_->forget(cq.get());
    cq->channel_->attached_.fetch_sub(1);
  }
  return Status::ok();
}

// ---------------------------------------------------------------- XRC domain

Result<std::shared_ptr<Xrcd>> Device::alloc_xrcd() {
  auto x = std::make_shared<Xrcd>(*this, 0);
  Result<uint32_t> h = xrcds_.insert_next(x);
  if (!h) return h.error();
  x->handle_ = *h;
  return x;
}

Status Device::dealloc_xrcd(const std::shared_ptr<Xrcd>& xrcd) {
  if (!xrcd || xrcd->dev_ != this) return Errc::kInval;
  if (xrcd->users() != 0) return Errc::kBusy;  // ib_dealloc_xrcd_user: -EBUSY while in use
  if (!xrcds_.erase(xrcd->handle())) return Errc::kInval;
  return Status::ok();
}

// ---------------------------------------------------------------- SRQ

Result<std::shared_ptr<Srq>> Device::create_srq(const std::shared_ptr<Pd>& pd,
                                                const SrqAttr& attr,
                                                const std::shared_ptr<Xrcd>& xrcd,
                                                const std::shared_ptr<Cq>& cq,
                                                const TmAttr& tm) {
  if (!pd || &pd->device() != this) return Errc::kInval;
  if (tm.enabled) {
    if (xrcd || !cq || cq->dev_ != this) return Errc::kInval;
    if (tm.max_num_tags == 0 || tm.max_num_tags > kTmMaxNumTags) return Errc::kInval;
    if (tm.max_ops == 0 || tm.max_ops > kTmMaxOps) return Errc::kInval;
  } else if ((xrcd == nullptr) != (cq == nullptr)) {
    return Errc::kInval;
  }
  if (xrcd && (xrcd->dev_ != this || cq->dev_ != this)) return Errc::kInval;
  if (attr.max_wr == 0 || attr.max_wr > static_cast<uint32_t>(attr_.max_srq_wr))
    return Errc::kInval;
  if (attr.max_sge == 0 || attr.max_sge > static_cast<uint32_t>(attr_.max_srq_sge))
    return Errc::kInval;
  if (attr.srq_limit > attr.max_wr) return Errc::kInval;
  auto srq = std::make_shared<Srq>(*this, 0, pd, attr, xrcd, cq, tm);
  Result<uint32_t> h = srqs_.insert_next(srq);
  if (!h) return h.error();
  srq->handle_ = *h;
  pd->add_user();
  if (xrcd) xrcd->add_user();
  if (cq) cq->users_.fetch_add(1);
  return srq;
}

Status Device::modify_srq(const std::shared_ptr<Srq>& srq, const SrqAttr& attr,
                          uint32_t mask) {
  if (!srq) return Errc::kInval;
  return srq->modify(attr, mask);
}

Status Device::destroy_srq(const std::shared_ptr<Srq>& srq) {
  if (!srq || srq->dev_ != this) return Errc::kInval;
  if (srq->users() != 0) return Errc::kBusy;
  if (!srqs_.erase(srq->handle())) return Errc::kInval;
  srq->alive_.store(false, std::memory_order_release);
  srq->pd()->drop_user();
  if (srq->xrcd_) srq->xrcd_->drop_user();
  if (srq->cq_) srq->cq_->users_.fetch_sub(1);
  return Status::ok();
}

// ---------------------------------------------------------------- QP

Result<std::shared_ptr<Qp>> Device::create_qp(const std::shared_ptr<Pd>& pd,
                                              const QpInitAttr& in) {
  if (is_fatal()) return Errc::kIo;
  if (in.qp_type == QpType::kXrcRecv) return create_xrc_tgt(in);
  if (!pd || &pd->device() != this) return Errc::kInval;
  if (in.qp_type != QpType::kRc && in.qp_type != QpType::kUc && in.qp_type != QpType::kUd &&
      in.qp_type != QpType::kXrcSend)
    return Errc::kInval;
  QpInitAttr init = in;
  if (in.qp_type == QpType::kXrcSend) {
    // The initiator has no receive side (uverbs create_qp: max_recv_* = 0, no RCQ/SRQ).
    init.recv_cq = nullptr;
    init.srq = nullptr;
    init.xrcd = nullptr;
    init.cap.max_recv_wr = init.cap.max_recv_sge = 0;
    if (!init.send_cq || init.send_cq->dev_ != this) return Errc::kInval;
  } else {
    if (!in.send_cq || !in.recv_cq) return Errc::kInval;
    if (in.send_cq->dev_ != this || in.recv_cq->dev_ != this) return Errc::kInval;
    if (in.srq && in.srq->dev_ != this) return Errc::kInval;
    if (in.srq && in.srq->is_xrc()) return Errc::kInval;  // XRC SRQs take no RC/UC/UD QP
  }
  QpCap& c = init.cap;
  const auto max_wr = static_cast<uint32_t>(attr_.max_qp_wr);
  const auto max_sge = static_cast<uint32_t>(attr_.max_sge);
  if (c.max_send_wr > max_wr || c.max_send_sge > max_sge ||
      c.max_inline_data > attr_.max_inline_data)
    return Errc::kInval;
  if (!init.srq && (c.max_recv_wr > max_wr || c.max_recv_sge > max_sge)) return Errc::kInval;
  if (c.max_send_wr == 0) c.max_send_wr = 1;
  // As rxe (rxe_qp_init_req): a send WQE holds max_send_sge SGEs or the inline bytes, so the
  // inline room is at least the SGE room, 16 bytes per SGE (rdma_xclient posts 16 inline bytes
  // on a QP created with max_inline_data 0 and one SGE). Reported back in cap().
  c.max_inline_data = std::min<uint32_t>(std::max<uint32_t>(c.max_inline_data, c.max_send_sge * 16u),
                                         attr_.max_inline_data);
  auto qp = std::make_shared<Qp>(*this, pd, init);
  Result<uint32_t> qpn = qps_.insert_random(qp);
  if (!qpn) return qpn.error();
  qp->qpn_ = *qpn;
  // rxe: src_port = 0xC000 + (hash_32(qpn, 14) & 0x3fff), hash_32 = (v * GOLDEN_RATIO_32) >> 18.
  qp->udp_sport_ = static_cast<uint16_t>(0xC000 + (((*qpn * 0x61C88647u) >> 18) & 0x3FFF));
  pd->add_user();
  init.send_cq->users_.fetch_add(1);
  if (init.recv_cq) init.recv_cq->users_.fetch_add(1);
  if (init.srq) init.srq->users_.fetch_add(1);
  return qp;
}

Result<std::shared_ptr<Qp>> Device::create_xrc_tgt(const QpInitAttr& in) {
  if (!in.xrcd || in.xrcd->dev_ != this) return Errc::kInval;
  QpInitAttr init;
  init.qp_type = QpType::kXrcRecv;
  init.xrcd = in.xrcd;
  init.cap = QpCap{};  // no SQ, no RQ: receive WQEs come from the SRQ each XRCETH names
  auto qp = std::make_shared<Qp>(*this, nullptr, init);
  Result<uint32_t> qpn = qps_.insert_random(qp);
  if (!qpn) return qpn.error();
  qp->qpn_ = *qpn;
  qp->udp_sport_ = static_cast<uint16_t>(0xC000 + (((*qpn * 0x61C88647u) >> 18) & 0x3FFF));
  init.xrcd->add_user();
  return qp;
}

Status Device::modify_qp(const std::shared_ptr<Qp>& qp, const QpAttr& attr, uint32_t mask) {
  if (!qp || qp->dev_ != this) return Errc::kInval;
  std::scoped_lock lk(qp->send_mu_, qp->recv_mu_);
  if (qp->destroyed_) return Errc::kInval;
  QpState next;
  Av av;
  if (Status st = qp->check_modify(attr, mask, &next, &av); !st) return st;
  qp->commit_modify(attr, mask, next, av);
  return Status::ok();
}

Status Device::query_qp(const std::shared_ptr<Qp>& qp, QpAttr* attr, QpInitAttr* init) const {
  if (!qp || qp->dev_ != this) return Errc::kInval;
  std::scoped_lock lk(qp->send_mu_, qp->recv_mu_);
  if (attr != nullptr) {
    *attr = qp->attr_;
    attr->cur_qp_state = attr->qp_state;
    attr->cap = qp->cap_;
  }
  if (init != nullptr) {
    init->send_cq = qp->send_cq_;
    init->recv_cq = qp->recv_cq_;
    init->srq = qp->srq_;
    init->cap = qp->cap_;
    init->qp_type = qp->type_;
    init->sq_sig_all = qp->sq_sig_all_;
  }
  return Status::ok();
}

Status Device::destroy_qp(const std::shared_ptr<Qp>& qp) {
  if (!qp || qp->dev_ != this) return Errc::kInval;
  if (TransportHooks* h = hooks()) h->on_before_destroy(*qp);
  {
    std::scoped_lock lk(qp->send_mu_, qp->recv_mu_);
    if (qp->destroyed_) return Errc::kInval;
    qp->destroyed_ = true;
    qps_.erase(qp->qpn());
    if (TransportHooks* h = hooks()) h->on_destroy(*qp);
  }
  if (TransportHooks* h = hooks()) h->on_after_destroy(*qp);
  if (qp->type() == QpType::kUd) detach_all_mcast(qp->qpn());  // as rxe on destroy
  if (qp->pd_) qp->pd_->drop_user();
  if (qp->send_cq_) qp->send_cq_->users_.fetch_sub(1);
  if (qp->recv_cq_) qp->recv_cq_->users_.fetch_sub(1);
  if (qp->srq_) qp->srq_->users_.fetch_sub(1);
  if (qp->xrcd_) qp->xrcd_->drop_user();
  return Status::ok();
}

// ---------------------------------------------------------------- multicast

bool Device::is_mcast_gid(const uint8_t (&gid)[16]) {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (gid[0] == 0xFF) return true;
  return std::memcmp(gid, kMapped, 12) == 0 && (gid[12] & 0xF0) == 0xE0;
}

Status Device::attach_mcast(const std::shared_ptr<Qp>& qp, const uint8_t (&gid)[16]) {
  if (!qp || qp->dev_ != this || qp->type() != QpType::kUd || !is_mcast_gid(gid))
    return Errc::kInval;
  std::lock_guard lk(mcast_mu_);
  McastGroup* g = nullptr;
  for (McastGroup& x : mcast_) {
    if (std::memcmp(x.mgid.data(), gid, 16) == 0) g = &x;
  }
  if (g != nullptr) {
    for (uint32_t q : g->qpns) {
      if (q == qp->qpn()) return Status::ok();
    }
    if (g->qpns.size() >= kMaxMcastQpAttach) return Errc::kNoMem;
    g->qpns.push_back(qp->qpn());
    return Status::ok();
  }
  if (mcast_.size() >= kMaxMcastGrp) return Errc::kNoMem;
  if (TransportHooks* h = hooks()) {
    // The interface: the GID of the QP's family the first one listed (index 0 for IPv4).
    uint8_t sgid = 0;
    const bool v6 = gid[0] == 0xFF;
    for (size_t i = 0; i < gids_.size(); ++i) {
      if (gids_[i].addr.ipv6 == v6) {
        sgid = static_cast<uint8_t>(i);
        break;
      }
    }
    if (int e = h->on_mcast_group(gid, sgid, true); e != 0) return static_cast<Errc>(e);
  }
  McastGroup ng;
  std::memcpy(ng.mgid.data(), gid, 16);
  ng.qpns.push_back(qp->qpn());
  mcast_.push_back(std::move(ng));
  return Status::ok();
}

Status Device::detach_mcast(const std::shared_ptr<Qp>& qp, const uint8_t (&gid)[16]) {
  if (!qp || qp->dev_ != this || qp->type() != QpType::kUd || !is_mcast_gid(gid))
    return Errc::kInval;
  std::lock_guard lk(mcast_mu_);
  for (size_t i = 0; i < mcast_.size(); ++i) {
    McastGroup& g = mcast_[i];
    if (std::memcmp(g.mgid.data(), gid, 16) != 0) continue;
    auto it = std::find(g.qpns.begin(), g.qpns.end(), qp->qpn());
    if (it == g.qpns.end()) return Errc::kInval;
    g.qpns.erase(it);
    if (g.qpns.empty()) {
      if (TransportHooks* h = hooks()) (void)h->on_mcast_group(gid, 0, false);
      mcast_.erase(mcast_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return Status::ok();
  }
  return Errc::kInval;
}

void Device::detach_all_mcast(uint32_t qpn) {
  std::lock_guard lk(mcast_mu_);
  for (size_t i = 0; i < mcast_.size();) {
    McastGroup& g = mcast_[i];
    auto it = std::find(g.qpns.begin(), g.qpns.end(), qpn);
    if (it != g.qpns.end()) g.qpns.erase(it);
    if (g.qpns.empty()) {
      uint8_t mgid[16];
      std::memcpy(mgid, g.mgid.data(), 16);
      if (TransportHooks* h = hooks()) (void)h->on_mcast_group(mgid, 0, false);
      mcast_.erase(mcast_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
}

size_t Device::mcast_members(const uint8_t (&gid)[16], uint32_t* out, size_t n) const {
  std::lock_guard lk(mcast_mu_);
  for (const McastGroup& g : mcast_) {
    if (std::memcmp(g.mgid.data(), gid, 16) != 0) continue;
    const size_t k = std::min(n, g.qpns.size());
    std::copy_n(g.qpns.begin(), k, out);
    return k;
  }
  return 0;
}

size_t Device::mcast_groups() const {
  std::lock_guard lk(mcast_mu_);
  return mcast_.size();
}

}  // namespace rnic::emu
