// emu/objects/device.h: the soft-RNIC device: configuration, device/port attributes, GID table,
// object tables, the async event queue, transport hooks, and every control-path verb
// (create/destroy of PD, MR, MW, AH, CQ, SRQ, QP; modify/query).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "emu/objects/async_event.h"
#include "emu/objects/cq.h"
#include "emu/objects/hooks.h"
#include "emu/objects/memory.h"
#include "emu/objects/mr.h"
#include "emu/objects/mw.h"
#include "emu/objects/param.h"
#include "emu/objects/pd.h"
#include "emu/objects/pool.h"
#include "emu/objects/qp.h"
#include "emu/objects/srq.h"
#include "emu/objects/status.h"
#include "emu/objects/types.h"
#include "wire/port.h"

namespace rnic::emu {

class Engine;  // emu/transport/engine.h (transports): sockets, progress thread

// What a device is opened with. Parsing SOFTRNIC_* environment variables is the shim's job.
struct DeviceConfig {
  std::string name = kDefaultDeviceName;  // ibv_get_device_name
  std::string ip;  // device address, e.g. "127.0.0.2", "fd00::1", "fe80::1%eth0" (required)
  // Interface MTU override in bytes (0 = look the interface carrying `ip` up).
  uint32_t netdev_mtu = 0;
  // Active path MTU override (0 = derive from the interface MTU).
  uint32_t active_mtu = 0;
  bool secure_keys = false;     // full random 32-bit keys, no visible index (pool.h)
  uint64_t key_seed = 0;        // 0 = random; else deterministic keys/QPNs (tests, S18)
  // Node GUID (host order); 0 = derived per process (Device::open). EUI-64 bits are forced.
  uint64_t node_guid = 0;
  ErrorsMode errors = ErrorsMode::kSpec;  // local-error statuses (mr.h)
  // How registered pages are held (pin.h; SOFTRNIC_PIN): kShadow gives the device its own view
  // of them, so memory mapped later at a registered address is never served.
  PinMode pin = PinMode::kShadow;
  // Limits override (0 = param.h default); tests use small values to hit ENOMEM.
  uint32_t max_mr = 0;
  uint32_t max_qp = 0;
  // Opt-in strict source check (docs/checks.md §2.5; off by default, like rxe). RC/UC
  // packets must come from the connected peer's IP AND an expected UDP source port, else they
  // are dropped and counted (drop_src_port). strict_src_port == 0: the port of the first
  // packet that passes the IP check after the QP left RESET is latched per QP (real NICs use a
  // per-QP source port we cannot know at RTR; the first-seen packet wins, so a forger that
  // speaks before the peer takes the latch). strict_src_port != 0 (e.g. 4791, the port every
  // softrnic peer sends from): that exact port, no latching.
  bool strict_src = false;
  uint16_t strict_src_port = 0;
  // Daemon hosting (daemon/): this client's slot on a device shared by several processes,
  // 1..255; 0 = embedded (the whole number space is this device's). A slot owns the QPNs
  // slot << 16 | [0x0011, 0xFFFE] and the memory keys whose top byte is the slot, so the
  // daemon steers a packet to its process by the destination QPN's top byte, and a key
  // issued in one process never resolves in another's table (docs/daemon.md).
  uint8_t slot = 0;
};

// ibv_device_attr, field for field (fw_ver as a string).
struct DeviceAttr {
  std::string fw_ver;
  uint64_t node_guid = 0;       // host byte order; the shim stores htobe64
  uint64_t sys_image_guid = 0;  // host byte order
  uint64_t max_mr_size = 0;
  uint64_t page_size_cap = 0;
  uint32_t vendor_id = 0;
  uint32_t vendor_part_id = 0;
  uint32_t hw_ver = 0;
  int max_qp = 0;
  int max_qp_wr = 0;
  uint32_t device_cap_flags = 0;
  int max_sge = 0;
  int max_sge_rd = 0;
  int max_cq = 0;
  int max_cqe = 0;
  int max_mr = 0;
  int max_pd = 0;
  int max_qp_rd_atom = 0;
  int max_ee_rd_atom = 0;
  int max_res_rd_atom = 0;
  int max_qp_init_rd_atom = 0;
  int max_ee_init_rd_atom = 0;
  AtomicCap atomic_cap = AtomicCap::kHca;
  int max_ee = 0;
  int max_rdd = 0;
  int max_mw = 0;
  int max_raw_ipv6_qp = 0;
  int max_raw_ethy_qp = 0;
  int max_mcast_grp = 0;
  int max_mcast_qp_attach = 0;
  int max_total_mcast_qp_attach = 0;
  int max_ah = 0;
  int max_fmr = 0;
  int max_map_per_fmr = 0;
  int max_srq = 0;
  int max_srq_wr = 0;
  int max_srq_sge = 0;
  uint16_t max_pkeys = 0;
  uint8_t local_ca_ack_delay = 0;
  uint8_t phys_port_cnt = 0;
  // Not in ibv_device_attr but needed by the shim / create_qp:
  uint32_t max_inline_data = 0;
  uint32_t num_comp_vectors = 0;
};

// ibv_port_attr, field for field.
struct PortAttr {
  PortState state = PortState::kActive;
  Mtu max_mtu = Mtu::k4096;
  Mtu active_mtu = Mtu::k1024;
  int gid_tbl_len = 0;
  uint32_t port_cap_flags = 0;
  uint32_t max_msg_sz = 0;
  uint32_t bad_pkey_cntr = 0;
  uint32_t qkey_viol_cntr = 0;
  uint16_t pkey_tbl_len = 0;
  uint16_t lid = 0;
  uint16_t sm_lid = 0;
  uint8_t lmc = 0;
  uint8_t max_vl_num = 0;
  uint8_t sm_sl = 0;
  uint8_t subnet_timeout = 0;
  uint8_t init_type_reply = 0;
  uint8_t active_width = 0;
  uint8_t active_speed = 0;
  uint8_t phys_state = 0;
  uint8_t link_layer = 0;
  uint8_t flags = 0;
  uint16_t port_cap_flags2 = 0;
};

struct GidEntry {
  std::array<uint8_t, 16> raw{};
  GidType type = GidType::kRoceV2;
  wire::Endpoint addr;  // the address it names (IPv4 or IPv6; link-local: with scope_id)
  std::string netdev;   // the interface carrying it (sysfs gid_attrs/ndevs), "" if unknown
};

// The interface carrying an address, and every IPv4/IPv6 address on it.
struct NetIf {
  std::string name;
  unsigned index = 0;
  bool loopback = false;
  std::vector<wire::Endpoint> addrs;
};
// The interface that carries `ip` (IPv4 or IPv6, "fe80::1%eth0" allowed): the exact address,
// else (IPv4) the interface whose subnet contains it, e.g. lo for 127.0.0.2. ENODEV if none.
Result<NetIf> interface_of(const std::string& ip);
// True when `ip` lives on a loopback interface (IFF_LOOPBACK: its own address, else the
// subnet of one of its addresses, as 127.0.0.2 on lo's 127.0.0.1/8). Only there is a UDP GSO
// batch never cut into datagrams (docs/wire.md §4).
bool ip_on_loopback(const std::string& ip);
// The device's GID table (all RoCE v2): index 0 is `primary` (IPv4-mapped ::ffff:a.b.c.d for
// IPv4); then, unless the interface is a loopback one (whose addresses every device on the
// host shares), the interface's IPv6 addresses: global, then link-local, each group in the
// kernel's order; at most kGidTableLen entries. Other IPv4 addresses of the interface are not
// listed: each may be the SOFTRNIC_IP of another device on the host.
std::vector<GidEntry> gid_table_for(const wire::Endpoint& primary, const NetIf* nif);

// Largest IB MTU whose payload plus kRoceHeaderOverhead fits in netdev_mtu
// (1500 -> k1024, 9000 -> k4096, 65536 -> k4096; below 336 -> k256).
Mtu active_mtu_for_netdev(uint32_t netdev_mtu);
// The MTU of the interface that carries `ip` (interface_of). ENODEV if none.
Result<uint32_t> interface_mtu_for(const std::string& ip);

// The device. Created by open(); the shim keeps the shared_ptr for the context's lifetime.
// CONTRACT: the Device outlives every object created from it (the shim destroys them, or
// calls close(), before dropping the device).
// Thread-safety: every member is thread-safe unless its comment says otherwise.
class Device : public std::enable_shared_from_this<Device> {
 public:
  // Validate cfg (EINVAL: bad/missing IPv4, empty name; ENODEV: interface MTU not found
  // and no netdev_mtu override), fill attributes, GID table, tables. Opens no sockets.
  static Result<std::shared_ptr<Device>> open(const DeviceConfig& cfg);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::string& name() const { return cfg_.name; }
  const DeviceConfig& config() const { return cfg_; }
  uint32_t ipv4() const { return ipv4_; }  // host byte order; 0 if the device's IP is IPv6
  // The GID table (index = GID index); never empty.
  const std::vector<GidEntry>& gids() const { return gids_; }
  // Keeps only the first n GIDs (n >= 1): the engine, at start and before any query, when it
  // cannot bind the others (another device on the host holds them, DAD not finished).
  void truncate_gids(size_t n);

  // ---- attributes ----
  const DeviceAttr& attr() const { return attr_; }
  Result<PortAttr> query_port(uint8_t port_num) const;  // EINVAL unless port_num == 1
  // EINVAL out of range or for an empty slot (index >= gids().size(), < gid_tbl_len).
  Result<GidEntry> query_gid(uint8_t port_num, int index) const;
  Result<uint16_t> query_pkey(uint8_t port_num, int index) const;
  // Port state changes (transports/tests). Setting kActive queues PORT_ACTIVE, leaving
  // it queues PORT_ERR.
  void set_port_state(PortState s);
  // Port counters bumped by ingress (bad P_Key, Q_Key violation).
  void count_bad_pkey() { bad_pkey_cntr_.fetch_add(1, std::memory_order_relaxed); }
  void count_qkey_viol() { qkey_viol_cntr_.fetch_add(1, std::memory_order_relaxed); }
  // Strict source check (see DeviceConfig::strict_src). Mode word read per packet by recv:
  // 0 = off, kStrictLatch = latch the first-seen port, kStrictFixed | port = that port.
  static constexpr uint32_t kStrictLatch = 1u << 16;
  static constexpr uint32_t kStrictFixed = 1u << 17;
  void set_strict_src(bool on, uint16_t port = 0);
  // RC responder: keep requests arriving after a gap and execute them once it fills
  // (SOFTRNIC_RC_STASH; docs/congestion.md §2). Off: in order only, later packets discarded.
  void set_rc_stash(bool on) { rc_stash_.store(on, std::memory_order_relaxed); }
  bool rc_stash() const { return rc_stash_.load(std::memory_order_relaxed); }
  // Notification point: the least time between two CNPs one QP sends for CE-marked requests
  // (docs/congestion.md §3; ConnectX's min_time_between_cnps). Default 50 µs.
  void set_cnp_min_gap_ns(uint64_t ns) { cnp_gap_ns_.store(ns, std::memory_order_relaxed); }
  uint64_t cnp_min_gap_ns() const { return cnp_gap_ns_.load(std::memory_order_relaxed); }
  uint32_t strict_src_mode() const { return strict_src_.load(std::memory_order_relaxed); }
  // Switch the key table to secure keys (DeviceConfig::secure_keys) after open(); only before
  // any MR/MW key was issued (EBUSY after). Used when the mode comes from the environment.
  Status set_secure_keys(bool on);

  // ---- PD ----
  Result<std::shared_ptr<Pd>> alloc_pd();
  Status dealloc_pd(const std::shared_ptr<Pd>& pd);  // EBUSY while objects use it

  // ---- XRC domain ----
  // ibv_open_xrcd's device half: a new domain (sharing by file is the shim's). ENOMEM past
  // kMaxXrcd.
  Result<std::shared_ptr<Xrcd>> alloc_xrcd();
  Status dealloc_xrcd(const std::shared_ptr<Xrcd>& xrcd);  // EBUSY while SRQs/target QPs use it

  // ---- MR ----
  // ibv_reg_mr / ibv_reg_mr_iova: addr = process address, iova = the address remote peers
  // and SGEs use (pass iova == addr for ibv_reg_mr). EINVAL: length 0, addr+length or
  // iova+length overflow, bad access (check_mr_access); ENOMEM: too many MRs. lkey == rkey.
  // ON_DEMAND (ODP): not pinned and not checked against the mappings (a page unmapped when
  // the device touches it is an access error, never a signal); addr 0 with length
  // UINT64_MAX is implicit ODP, the whole address space (iova must be 0).
  Result<std::shared_ptr<Mr>> reg_mr(const std::shared_ptr<Pd>& pd, uint64_t addr,
                                     uint64_t length, uint64_t iova, uint32_t access);
  // ibv_rereg_mr: flags ⊆ kReregFlagsSupported else EINVAL; 0 flags -> EINVAL. EBUSY
  // while a MW is bound. CHANGE_TRANSLATION: new addr/length (iova = addr);
  // CHANGE_PD: new pd; CHANGE_ACCESS: new access. Translation or PD change issues a new
  // key (old one refused afterwards). Check everything, then commit.
  Status rereg_mr(const std::shared_ptr<Mr>& mr, uint32_t flags,
                  const std::shared_ptr<Pd>& pd, uint64_t addr, uint64_t length,
                  uint32_t access);
  Status dereg_mr(const std::shared_ptr<Mr>& mr);  // EBUSY while a MW is bound
  // ibv_reg_dm_mr: an MR over device memory at [addr, addr+length) (engine memory the shim
  // allocated: not pinned, not checked against the mappings), iova 0 (zero-based). Length 0
  // is allowed (the kernel accepts an empty DM MR: a key that names no byte). EINVAL as
  // reg_mr for a foreign PD, a wrapping range or bad access.
  Result<std::shared_ptr<Mr>> reg_dm_mr(const std::shared_ptr<Pd>& pd, uint64_t addr,
                                        uint64_t length, uint32_t access);
  // ibv_advise_mr for one SGE (PREFETCH, PREFETCH_WRITE: write = true, PREFETCH_NO_FAULT:
  // fault_in = false). EFAULT (ibv_advise_mr(3)) unless the lkey names a live ODP MR of `pd`,
  // with LOCAL_WRITE for a write advice, and [addr, addr+length) lies inside it. fault_in:
  // the pages are populated (MADV_POPULATE_READ/WRITE) under the MR's gate; a range that
  // cannot be (unmapped, PROT_NONE, read-only for write) is EFAULT when `sync`
  // (IBV_ADVISE_MR_FLAG_FLUSH) and ignored otherwise (a hint, like mlx5's async prefetch).
  Status advise_mr(const Pd* pd, const Sge& sge, bool write, bool fault_in, bool sync);

  // ---- MW ----
  Result<std::shared_ptr<Mw>> alloc_mw(const std::shared_ptr<Pd>& pd, MwType type);
  Status dealloc_mw(const std::shared_ptr<Mw>& mw);  // invalidates; unbinds from its MR

  // ---- AH ----
  Result<std::shared_ptr<Ah>> create_ah(const std::shared_ptr<Pd>& pd, const AhAttr& attr);
  Status destroy_ah(const std::shared_ptr<Ah>& ah);

  // ---- CQ ----
  Result<std::shared_ptr<CompChannel>> create_comp_channel();
  Status destroy_comp_channel(const std::shared_ptr<CompChannel>& ch);  // EBUSY if CQs
  // EINVAL: cqe < 1 or > max_cqe, comp_vector outside [0, num_comp_vectors).
  Result<std::shared_ptr<Cq>> create_cq(int cqe, std::shared_ptr<CompChannel> channel,
                                        int comp_vector);
  Status resize_cq(const std::shared_ptr<Cq>& cq, int cqe);
  Status destroy_cq(const std::shared_ptr<Cq>& cq);  // EBUSY while QPs use it

  // ---- SRQ ----
  // EINVAL: max_wr 0 or > max_srq_wr, max_sge 0 or > max_srq_sge, srq_limit > max_wr.
  // XRC SRQ (IBV_SRQT_XRC): xrcd and cq non-null and of this device (else EINVAL); its
  // receive completions go to cq. Counts as a user of pd, xrcd and cq.
  // TM SRQ (IBV_SRQT_TM, tm.enabled, no xrcd): cq non-null (its list-operation and receive
  // completions), 1 <= max_num_tags <= kTmMaxNumTags, 1 <= max_ops <= kTmMaxOps, else EINVAL.
  Result<std::shared_ptr<Srq>> create_srq(const std::shared_ptr<Pd>& pd, const SrqAttr& attr,
                                          const std::shared_ptr<Xrcd>& xrcd = nullptr,
                                          const std::shared_ptr<Cq>& cq = nullptr,
                                          const TmAttr& tm = TmAttr{});
  // The SRQ with number srqn (hot path: the XRC responder resolving an XRCETH), or null.
  std::shared_ptr<Srq> find_srq(uint32_t srqn) const { return srqs_.find(srqn); }
  Status modify_srq(const std::shared_ptr<Srq>& srq, const SrqAttr& attr, uint32_t mask);
  Status destroy_srq(const std::shared_ptr<Srq>& srq);  // EBUSY while QPs use it

  // ---- QP ----
  // Validates like rdma-core/rxe: send_cq/recv_cq present and from this device; caps <=
  // device limits (max_send_wr/max_recv_wr <= max_qp_wr, sges <= max_sge, inline <=
  // max_inline_data) else EINVAL; with an SRQ the recv caps are ignored (reported 0);
  // max_send_wr 0 is raised to 1. Returned caps are in qp->cap(). QPNs are random 24-bit
  // numbers in [0x11, 0xFFFFFE] (never 0, 1, or the multicast QPN).
  // XRC_SEND: pd and send_cq required, recv_cq/srq ignored, no receive caps. XRC_RECV: pd
  // ignored (may be null), init.xrcd required and of this device, no CQs, no SQ/RQ (caps
  // reported 0); the QP counts as a user of its xrcd.
  Result<std::shared_ptr<Qp>> create_qp(const std::shared_ptr<Pd>& pd, const QpInitAttr& init);
  // ibv_modify_qp (see qp_transition()): check everything, then commit; any failure ->
  // EINVAL and the QP is exactly as before. Takes both QP locks.
  Status modify_qp(const std::shared_ptr<Qp>& qp, const QpAttr& attr, uint32_t mask);
  // ibv_query_qp: current attributes (cur_qp_state = qp_state) and the init attributes.
  Status query_qp(const std::shared_ptr<Qp>& qp, QpAttr* attr, QpInitAttr* init) const;
  // Removes qp from the QPN table, calls hooks->on_destroy, detaches from CQs/SRQ/PD.
  Status destroy_qp(const std::shared_ptr<Qp>& qp);

  // ---- UD multicast (ibv_attach_mcast / ibv_detach_mcast) ----
  // A multicast GID: IPv6 ff00::/8, or IPv4-mapped ::ffff:224.0.0.0/4 (RoCEv2).
  static bool is_mcast_gid(const uint8_t (&gid)[16]);
  // As rdma-core over rxe: EINVAL for a QP that is not UD (or not of this device) or a GID
  // that is not multicast; ENOMEM past max_mcast_grp groups or max_mcast_qp_attach QPs in
  // one group; attaching an attached QP again succeeds and changes nothing. The first attach
  // to a group joins the IP group (TransportHooks::on_mcast_group, its errno returned).
  Status attach_mcast(const std::shared_ptr<Qp>& qp, const uint8_t (&gid)[16]);
  // EINVAL as attach, and for a QP not attached to gid. The last detach leaves the IP group.
  Status detach_mcast(const std::shared_ptr<Qp>& qp, const uint8_t (&gid)[16]);
  // The QPNs attached to gid into out (at most n), their count (ingress of a multicast
  // datagram; one short lock).
  size_t mcast_members(const uint8_t (&gid)[16], uint32_t* out, size_t n) const;
  // Groups with at least one QP (tests, counters).
  size_t mcast_groups() const;

  // ---- lookups (hot path, any thread) ----
  std::shared_ptr<Qp> find_qp(uint32_t qpn) const { return qps_.find(qpn); }
  // ObjectTable::generation of the QP table (a destroyed QP changes it).
  uint64_t qp_table_generation() const { return qps_.generation(); }
  KeyTable& keys() { return keys_; }
  const KeyTable& keys() const { return keys_; }

  // ---- plumbing ----
  AsyncEventQueue& async_events() { return events_; }
  // Transport hooks (nullable). Set once before creating QPs; not changed while in use.
  void set_hooks(TransportHooks* h) { hooks_.store(h, std::memory_order_release); }
  TransportHooks* hooks() const { return hooks_.load(std::memory_order_acquire); }
  // Memory access used for all data movement (SafeMemAccess by default: faults are errors).
  MemAccess& mem() { return *mem_; }
  void set_mem(std::shared_ptr<MemAccess> m) { mem_ = std::move(m); }
  // The transports' engine (sockets, progress thread); owned here once set.
  void set_engine(std::shared_ptr<Engine> e) { engine_ = std::move(e); }
  Engine* engine() const { return engine_.get(); }

  // Destroy every remaining object (like the kernel reclaiming on close): QPs, SRQs, CQs,
  // MWs, MRs, AHs, PDs. Idempotent. Also run by the destructor.
  void close();
  // The device is lost (daemon hosting: softrnicd died): every QP not in RESET or ERR enters
  // ERR (its WQEs flush with WR_FLUSH_ERR) and one DEVICE_FATAL event is queued, as a driver
  // does when its hardware fails; from then on alloc_pd, create_cq and create_qp fail with
  // EIO. Idempotent; thread-safe.
  void fatal();
  bool is_fatal() const { return fatal_.load(std::memory_order_acquire); }

  // Monotonic clock used for CQE timestamps (ns).
  static uint64_t now_ns();

 private:
  Result<std::shared_ptr<Qp>> create_xrc_tgt(const QpInitAttr& in);
  Result<std::shared_ptr<Mr>> add_mr(std::shared_ptr<Mr> mr);  // reg_mr, reg_dm_mr: tables
  static void release_pin(Mr& mr);  // dereg_mr, close: drop the MR's pin (pin.h)
  explicit Device(const DeviceConfig& cfg);
  friend class Cq;
  friend class Qp;
  friend class Srq;
  friend class Mr;
  friend class Mw;

  DeviceConfig cfg_;
  uint32_t ipv4_ = 0;
  DeviceAttr attr_;
  PortAttr port_;
  std::atomic<PortState> port_state_{PortState::kActive};
  std::atomic<uint32_t> bad_pkey_cntr_{0}, qkey_viol_cntr_{0};
  std::atomic<uint32_t> strict_src_{0};
  std::atomic<bool> rc_stash_{true};
  std::atomic<uint64_t> cnp_gap_ns_{50'000};
  std::vector<GidEntry> gids_;
  AsyncEventQueue events_;
  std::atomic<bool> fatal_{false};
  std::atomic<TransportHooks*> hooks_{nullptr};
  std::shared_ptr<MemAccess> mem_;
  KeyTable keys_;
  ObjectTable<Pd> pds_;
  ObjectTable<Ah> ahs_;
  ObjectTable<Cq> cqs_;
  ObjectTable<Srq> srqs_;
  ObjectTable<Xrcd> xrcds_;
  ObjectTable<Qp> qps_;
  ObjectTable<Mw> mws_;  // by rkey-independent handle, for close()
  ObjectTable<Mr> mrs_;  // likewise
  std::mutex chan_mu_;
  std::vector<std::shared_ptr<CompChannel>> channels_;
  std::shared_ptr<Engine> engine_;
  // Multicast groups: MGID -> attached QPNs (each list at most kMaxMcastQpAttach).
  struct McastGroup {
    std::array<uint8_t, 16> mgid{};
    std::vector<uint32_t> qpns;
  };
  mutable std::mutex mcast_mu_;
  std::vector<McastGroup> mcast_;
  void detach_all_mcast(uint32_t qpn);  // destroy_qp
  bool closed_ = false;
};

}  // namespace rnic::emu
