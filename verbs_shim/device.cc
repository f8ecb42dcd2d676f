// Device enumeration and queries: ibv_get_device_list and friends, ibv_open_device /
// ibv_close_device, device/port/GID/P_Key queries, and the sysfs helpers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>


#include "base/hash.h"
#include "verbs_shim/host.h"
#include "verbs_shim/daemon_client.h"
#include "verbs_shim/shim.h"

#undef ibv_query_port

// Prototypes rdma-core keeps in <infiniband/driver.h>, which Debian does not install.
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
SHIM_EXPORT int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num,
                                   unsigned int index, enum ibv_gid_type_sysfs* type);
SHIM_EXPORT const char* ibv_get_sysfs_path(void);
SHIM_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace rnic::shim {
namespace {

std::mutex g_dev_mu;
DeviceEntry g_dev;
bool g_dev_init = false;
bool g_dev_ok = false;

}  // namespace

uint64_t device_guid(const std::string& name) {
  // FNV-1a of (name, pid, a per-process random salt), made a locally administered EUI-64
  // (0x02 in the first byte): every process's device has its own node GUID (the CM's CA
  // GUID, cm-notes §3.7), a forked child too (its pid differs). The same value is passed to
  // the emu device at open (host.cc), so ibv_get_device_guid and ibv_query_device agree.
  static const uint64_t salt = [] {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      if (read(fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) v = 0;
      close(fd);
    }
    return v ^ static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&v));
  }();
  uint64_t h = base::fnv1a64(name);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  h = base::fnv1a64(&pid, sizeof pid, h);
  h = base::fnv1a64(&salt, sizeof salt, h);
  h = (h & 0x0000ffffffffffffull) | 0x0200000000000000ull;
  return h;
}

namespace {

// REQUIRES: g_dev_mu held.
void init_device_locked() {
  if (g_dev_init) return;
  g_dev_init = true;
  Config cfg;
  std::string err;
  if (!parse_list_config(&cfg, &err)) {
    RNIC_LOG(kError, "%s; no device is listed", err.c_str());
    g_dev_ok = false;
    return;
  }
  std::string name = cfg.name;
  uint64_t guid = 0;
  if (cfg.hosting != base::Hosting::kEmbedded) {
    // Daemon hosting: list softrnicd's device (its name and its one GUID). SOFTRNIC_IP picks
    // it by address (a bad value is the open's to report: ignored here).
    static constexpr std::string_view kIpVar[] = {"SOFTRNIC_IP"};
    Config ipcfg;
    if (base::parse_config(base::process_env(), &ipcfg, kIpVar).empty()) cfg.ip = ipcfg.ip;
    DaemonDevice dd;
    int rc = daemon_find(cfg, &dd);
    if (rc == 0) {
      name = dd.info.name;
      guid = dd.info.node_guid;
      close(dd.fd);
    } else if (rc != ENOENT || cfg.hosting == base::Hosting::kDaemon) {
      if (rc == ENOENT) {
        RNIC_LOG(kError, "SOFTRNIC_HOSTING=daemon: no softrnicd answers at %s; no device is listed",
                 dd.path.c_str());
      }
      g_dev_ok = false;
      return;
    }
  }
  std::memset(&g_dev.dev_, 0, sizeof g_dev.dev_);
  g_dev.dev_.node_type = IBV_NODE_CA;
  g_dev.dev_.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(g_dev.dev_.name, sizeof g_dev.dev_.name, "%s", name.c_str());
  std::snprintf(g_dev.dev_.dev_name, sizeof g_dev.dev_.dev_name, "uverbs0");
  std::string root = sysfs_root();
  std::snprintf(g_dev.dev_.dev_path, sizeof g_dev.dev_.dev_path,
                "%s/class/infiniband_verbs/uverbs0", root.c_str());
  std::snprintf(g_dev.dev_.ibdev_path, sizeof g_dev.dev_.ibdev_path, "%s/class/infiniband/%s",
                root.c_str(), name.c_str());
  g_dev.node_guid_be_ = htobe64(guid != 0 ? guid : device_guid(name));
  g_dev.index_ = 0;
  g_dev.cm_tail_.magic = SOFTRNIC_CM_MAGIC;
  g_dev.cm_tail_.ops = cm_bridge_ops();
  g_dev_ok = true;
}

}  // namespace

std::string sysfs_root() {
  Config cfg;  // SYSFS_PATH through base/config.h (a path: never invalid)
  static constexpr std::string_view kVars[] = {"SYSFS_PATH"};
  (void)base::parse_config(base::process_env(), &cfg, kVars);
  if (!cfg.sysfs_path.empty()) {
    std::string s = cfg.sysfs_path;
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
  }
  return "/sys";
}

DeviceEntry* device_lookup(ibv_device* dev) {
  std::lock_guard<std::mutex> lk(g_dev_mu);
  init_device_locked();
  if (g_dev_ok && dev == &g_dev.dev_) return &g_dev;
  return nullptr;
}

int device_list_snapshot(DeviceEntry** out, int max) {
  std::lock_guard<std::mutex> lk(g_dev_mu);
  init_device_locked();
  if (!g_dev_ok || max < 1) return 0;
  out[0] = &g_dev;
  return 1;
}

const void* async_object(const ibv_async_event& ev) {
  switch (ev.event_type) {
    case IBV_EVENT_CQ_ERR:
      return ev.element.cq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return ev.element.qp;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return ev.element.srq;
    default:
      return nullptr;
  }
}

uint32_t Context::retire_async(void** user_context, const void* obj) {
  {
    std::lock_guard<std::mutex> lk(host_->ctx_mu_);  // the dispatcher posts under it
    *user_context = nullptr;
  }
  std::lock_guard<std::mutex> lk(async_mu_);
  // Their eventfd counts stay: ibv_get_async_event reads past a count with no event.
  std::erase_if(async_q_, [obj](const ibv_async_event& e) { return async_object(e) == obj; });
  uint32_t n = 0;
  if (auto it = async_reported_.find(obj); it != async_reported_.end()) {
    n = it->second;
    async_reported_.erase(it);
  }
  return n;
}

void wait_async_acks(pthread_mutex_t* mu, pthread_cond_t* cond, const uint32_t* completed,
                     uint32_t reported) {
  pthread_mutex_lock(mu);
  while (*completed != reported) pthread_cond_wait(cond, mu);
  pthread_mutex_unlock(mu);
}

void Context::post_async(const ibv_async_event& ev) {
  {
    std::lock_guard<std::mutex> lk(async_mu_);
    async_q_.push_back(ev);
  }
  uint64_t one = 1;
  ssize_t r = write(vctx_.context.async_fd, &one, sizeof one);
  (void)r;
}

}  // namespace rnic::shim

using namespace rnic::shim;

// ---------------------------------------------------------------------------------------
// Enumeration.

SHIM_EXPORT struct ibv_device** ibv_get_device_list(int* num_devices) {
  DeviceEntry* devs[4];
  int n = device_list_snapshot(devs, 4);
  // Never NULL: an empty, NULL-terminated list when there are no devices.
  auto** list = static_cast<ibv_device**>(std::calloc(static_cast<size_t>(n) + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    if (num_devices) *num_devices = 0;
    return nullptr;
  }
  for (int i = 0; i < n; ++i) list[i] = &devs[i]->dev_;
  if (num_devices) *num_devices = n;
  return list;
}

SHIM_EXPORT void ibv_free_device_list(struct ibv_device** list) { std::free(list); }

SHIM_EXPORT const char* ibv_get_device_name(struct ibv_device* device) {
  if (device == nullptr) return nullptr;
  return device->name;
}

SHIM_EXPORT __be64 ibv_get_device_guid(struct ibv_device* device) {
  DeviceEntry* d = device_lookup(device);
  return d ? d->node_guid_be_ : 0;
}

SHIM_EXPORT int ibv_get_device_index(struct ibv_device* device) {
  DeviceEntry* d = device_lookup(device);
  return d ? d->index_ : -1;
}

// ---------------------------------------------------------------------------------------
// Open / close.

namespace rnic::shim {

// A new context of device `d` on the uverbs file `file` (cmd_fd `cmd_fd`, owned from here on,
// closed on failure too): ibv_open_device with a new file, ibv_import_device with a shared one.
ibv_context* context_open(DeviceEntry* d, int cmd_fd, std::shared_ptr<CmdFile> file) {
  Host* host = nullptr;
  int rc = host_acquire(d, &host);
  if (rc != 0) {
    close(cmd_fd);
    return static_cast<ibv_context*>(null_errno(rc));
  }
  auto* ctx = new (std::nothrow) Context();
  if (ctx == nullptr) {
    close(cmd_fd);
    host_release(host);
    return static_cast<ibv_context*>(null_errno(ENOMEM));
  }
  std::memset(&ctx->vctx_, 0, sizeof ctx->vctx_);
  ctx->dev_ = d;
  ctx->host_ = host;
  ctx->emu_ = host->dev_.get();
  ctx->file_ = std::move(file);
  ibv_context* ic = from_ctx(ctx);
  ic->device = &d->dev_;
  ic->cmd_fd = cmd_fd;
  ic->async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (ic->async_fd < 0) {
    int e = errno;
    close(cmd_fd);
    delete ctx;
    host_release(host);
    return static_cast<ibv_context*>(null_errno(e));
  }
  ic->num_comp_vectors = static_cast<int>(ctx->emu_->attr().num_comp_vectors);
  if (ic->num_comp_vectors < 1) ic->num_comp_vectors = 1;
  pthread_mutex_init(&ic->mutex, nullptr);
  ic->abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx->vctx_.sz = sizeof(verbs_context);
  fill_ops(ctx);
  host_add_context(host, ctx);
  return ic;
}

}  // namespace rnic::shim

SHIM_EXPORT struct ibv_context* ibv_open_device(struct ibv_device* device) {
  return guard_ptr<ibv_context>([&]() -> ibv_context* {
    DeviceEntry* d = device_lookup(device);
    if (d == nullptr) return static_cast<ibv_context*>(null_errno(ENODEV));
    // cmd_fd: the context's own uverbs file (import.cc), which ibv_import_device accepts.
    std::shared_ptr<CmdFile> file;
    int fd = -1;
    if (int e = cmd_file_create(d, &file, &fd); e != 0) return static_cast<ibv_context*>(null_errno(e));
    return context_open(d, fd, std::move(file));
  });
}

SHIM_EXPORT int ibv_close_device(struct ibv_context* context) {
  if (context == nullptr) return fail_errno(EINVAL);
  Context* ctx = to_ctx(context);
  release_imports(ctx);
  host_remove_context(ctx->host_, ctx);
  if (context->async_fd >= 0) close(context->async_fd);
  if (context->cmd_fd >= 0) close(context->cmd_fd);
  pthread_mutex_destroy(&context->mutex);
  Host* host = ctx->host_;
  delete ctx;
  host_release(host);
  return 0;
}

// ---------------------------------------------------------------------------------------
// Queries.

// Both device queries also answer on a context a forked child inherited: they read only the
// device's fixed attributes (no engine lock, no socket), as a kernel-shared context would
// (rdma-core's multi-process DM test queries max_dm_size in its children).
SHIM_EXPORT int ibv_query_device(struct ibv_context* context, struct ibv_device_attr* attr) {
  if (context == nullptr || attr == nullptr) return fail_errno(EINVAL);
  fill_device_attr(to_ctx(context), attr);
  return 0;
}

// Exported ibv_query_port receives the pre-v17 struct: write only the first 48 bytes
// (everything up to and including `flags`), as rdma-core does.
SHIM_EXPORT int ibv_query_port(struct ibv_context* context, uint8_t port_num,
                               struct _compat_ibv_port_attr* port_attr) {
  if (context == nullptr || port_attr == nullptr) return fail_errno(EINVAL);
  if (inherited(context)) return fail_errno(EIO);
  if (port_num != 1) return fail_errno(EINVAL);
  ibv_port_attr full;
  fill_port_attr(to_ctx(context), &full);
  std::memcpy(port_attr, &full, offsetof(ibv_port_attr, port_cap_flags2));
  return 0;
}

SHIM_EXPORT int ibv_query_gid(struct ibv_context* context, uint8_t port_num, int index,
                              union ibv_gid* gid) {
  if (context == nullptr || gid == nullptr || index < 0) return -1;
  if (inherited(context)) return errno = EIO, -1;
  int type = 0;
  if (query_gid(to_ctx(context), port_num, static_cast<uint32_t>(index), gid, &type)) return 0;
  // An empty slot of the table (index < gid_tbl_len): a zero GID, as rdma-core reads it from
  // the kernel's sysfs gids/N (UCX queries every index and stops at the first failure).
  if (port_num == 1 && index < emu::kGidTableSlots) {
    std::memset(gid->raw, 0, sizeof gid->raw);
    return 0;
  }
  errno = EINVAL;
  return -1;
}

SHIM_EXPORT int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num,
                                   unsigned int index, enum ibv_gid_type_sysfs* type) {
  if (context == nullptr || type == nullptr) return fail_errno(EINVAL);
  if (inherited(context)) return fail_errno(EIO);
  ibv_gid g;
  int t = 0;
  if (!query_gid(to_ctx(context), port_num, index, &g, &t)) {
    errno = EINVAL;
    return -1;
  }
  *type = (t == IBV_GID_TYPE_ROCE_V2) ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  return 0;
}

SHIM_EXPORT int _ibv_query_gid_ex(struct ibv_context* context, uint32_t port_num,
                                  uint32_t gid_index, struct ibv_gid_entry* entry, uint32_t flags,
                                  size_t entry_size) {
  if (context == nullptr || entry == nullptr) return fail_errno(EINVAL);
  if (inherited(context)) return fail_errno(EIO);
  if (flags != 0) return fail_errno(EINVAL);
  if (entry_size < sizeof(ibv_gid_entry)) return fail_errno(EINVAL);
  ibv_gid g;
  int t = 0;
  if (port_num != 1) return fail_errno(EINVAL);
  uint32_t ifindex = 1;
  // An empty slot or an index past the table: ENODATA, as the kernel's QUERY_GID_ENTRY.
  if (!query_gid(to_ctx(context), port_num, gid_index, &g, &t, &ifindex)) return fail_errno(ENODATA);
  ibv_gid_entry e{};
  e.gid = g;
  e.gid_index = gid_index;
  e.port_num = port_num;
  e.gid_type = static_cast<uint32_t>(t);
  e.ndev_ifindex = ifindex;
  std::memset(entry, 0, entry_size);
  std::memcpy(entry, &e, sizeof e);
  return 0;
}

SHIM_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context* context, struct ibv_gid_entry* entries,
                                         size_t max_entries, uint32_t flags, size_t entry_size) {
  if (context == nullptr || (entries == nullptr && max_entries != 0)) return -EINVAL;
  if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  if (inherited(context)) return -EIO;
  // Only the populated slots (gid_tbl_len counts the empty ones too).
  const size_t populated = to_ctx(context)->emu_->gids().size();
  size_t n = 0;
  for (uint32_t i = 0; i < populated; ++i) {
    ibv_gid g;
    int t = 0;
    uint32_t ifindex = 1;
    if (!query_gid(to_ctx(context), 1, i, &g, &t, &ifindex)) continue;
    bool zero = true;
    for (unsigned char b : g.raw) zero = zero && b == 0;
    if (zero) continue;
    if (n >= max_entries) return -EINVAL;
    auto* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + n * entry_size);
    std::memset(e, 0, entry_size);
    e->gid = g;
    e->gid_index = i;
    e->port_num = 1;
    e->gid_type = static_cast<uint32_t>(t);
    e->ndev_ifindex = ifindex;
    ++n;
  }
  return static_cast<ssize_t>(n);
}

SHIM_EXPORT int ibv_query_pkey(struct ibv_context* context, uint8_t port_num, int index,
                               __be16* pkey) {
  if (context == nullptr || pkey == nullptr || port_num != 1) return -1;
  if (inherited(context)) return errno = EIO, -1;
  if (index != 0) return -1;
  *pkey = htobe16(0xffff);
  return 0;
}

SHIM_EXPORT int ibv_get_pkey_index(struct ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (context == nullptr || port_num != 1) return -EINVAL;
  if (inherited(context)) return -EIO;
  if ((be16toh(pkey) & 0x7fff) == 0x7fff) return 0;
  return -ENOENT;
}

// ---------------------------------------------------------------------------------------
// sysfs. The shim answers the attribute files of its own device itself (ibv_devinfo reads
// board_id, fw_ver ...); anything else is read from the real tree under sysfs_root().

namespace {

bool virtual_sysfs(const std::string& dir, const std::string& file, std::string* out) {
  DeviceEntry* devs[4];
  int n = device_list_snapshot(devs, 4);
  for (int i = 0; i < n; ++i) {
    ibv_device& d = devs[i]->dev_;
    std::string ib = d.ibdev_path;
    std::string uv = d.dev_path;
    if (dir == ib || dir == ib + "/") {
      if (file == "board_id") *out = "SOFTRNIC_0001\n";
      else if (file == "fw_ver") *out = "0.1.0\n";
      else if (file == "hw_rev") *out = "0\n";
      else if (file == "hca_type") *out = "softrnic\n";
      else if (file == "node_type") *out = "1: CA\n";
      else if (file == "node_desc") *out = std::string(d.name) + "\n";
      else if (file == "ports/1/gid_attrs/types/0") *out = "RoCE v2\n";
      else if (file == "ports/1/state") *out = "4: ACTIVE\n";
      else if (file == "ports/1/link_layer") *out = "Ethernet\n";
      else if (file == "ports/1/phys_state") *out = "5: LinkUp\n";
      else return false;
      return true;
    }
    if (dir == uv || dir == uv + "/") {
      if (file == "ibdev") *out = std::string(d.name) + "\n";
      else if (file == "abi_version") *out = "1\n";
      else if (file == "dev") *out = "231:192\n";
      else return false;
      return true;
    }
  }
  return false;
}

}  // namespace

SHIM_EXPORT const char* ibv_get_sysfs_path(void) {
  static std::string* path = new std::string(sysfs_root());
  return path->c_str();
}

SHIM_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (dir == nullptr || file == nullptr || buf == nullptr || size == 0) {
    errno = EINVAL;
    return -1;
  }
  std::string v;
  try {
    if (virtual_sysfs(dir, file, &v)) {
      size_t len = v.size() < size - 1 ? v.size() : size - 1;
      std::memcpy(buf, v.data(), len);
      buf[len] = '\0';
      if (len > 0 && buf[len - 1] == '\n') buf[--len] = '\0';
      return static_cast<int>(len);
    }
    std::string path = std::string(dir) + "/" + file;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t len = read(fd, buf, size);
    int e = errno;
    close(fd);
    if (len < 0) {
      errno = e;
      return -1;
    }
    if (static_cast<size_t>(len) == size) len = static_cast<ssize_t>(size) - 1;
    buf[len] = '\0';
    if (len > 0 && buf[len - 1] == '\n') buf[--len] = '\0';
    return static_cast<int>(len);
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
}

// ---------------------------------------------------------------------------------------
// Attributes: the engine's (emu::Device) values, converted field by field.

namespace rnic::shim {

static_assert(static_cast<int>(emu::AtomicCap::kHca) == IBV_ATOMIC_HCA);
static_assert(static_cast<int>(emu::Mtu::k4096) == IBV_MTU_4096);
static_assert(static_cast<int>(emu::PortState::kActive) == IBV_PORT_ACTIVE);
static_assert(static_cast<int>(emu::GidType::kRoceV2) == IBV_GID_TYPE_ROCE_V2);

void fill_device_attr(Context* ctx, ibv_device_attr* a) {
  const emu::DeviceAttr& e = ctx->emu_->attr();
  std::memset(a, 0, sizeof *a);
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "%s", e.fw_ver.c_str());
  // The GUID is the device list's (stable before open); emu's is used only if it has one.
  a->node_guid = ctx->dev_->node_guid_be_;
  a->sys_image_guid = ctx->dev_->node_guid_be_;
  a->max_mr_size = e.max_mr_size;
  a->page_size_cap = e.page_size_cap;
  a->vendor_id = e.vendor_id;
  a->vendor_part_id = e.vendor_part_id;
  a->hw_ver = e.hw_ver;
  a->max_qp = e.max_qp;
  a->max_qp_wr = e.max_qp_wr;
  a->device_cap_flags = e.device_cap_flags;
  a->max_sge = e.max_sge;
  a->max_sge_rd = e.max_sge_rd;
  a->max_cq = e.max_cq;
  a->max_cqe = e.max_cqe;
  a->max_mr = e.max_mr;
  a->max_pd = e.max_pd;
  a->max_qp_rd_atom = e.max_qp_rd_atom;
  a->max_ee_rd_atom = e.max_ee_rd_atom;
  a->max_res_rd_atom = e.max_res_rd_atom;
  a->max_qp_init_rd_atom = e.max_qp_init_rd_atom;
  a->max_ee_init_rd_atom = e.max_ee_init_rd_atom;
  a->atomic_cap = static_cast<ibv_atomic_cap>(e.atomic_cap);
  a->max_ee = e.max_ee;
  a->max_rdd = e.max_rdd;
  a->max_mw = e.max_mw;
  a->max_raw_ipv6_qp = e.max_raw_ipv6_qp;
  a->max_raw_ethy_qp = e.max_raw_ethy_qp;
  a->max_mcast_grp = e.max_mcast_grp;
  a->max_mcast_qp_attach = e.max_mcast_qp_attach;
  a->max_total_mcast_qp_attach = e.max_total_mcast_qp_attach;
  a->max_ah = e.max_ah;
  a->max_fmr = e.max_fmr;
  a->max_map_per_fmr = e.max_map_per_fmr;
  a->max_srq = e.max_srq;
  a->max_srq_wr = e.max_srq_wr;
  a->max_srq_sge = e.max_srq_sge;
  a->max_pkeys = e.max_pkeys;
  a->local_ca_ack_delay = e.local_ca_ack_delay;
  a->phys_port_cnt = e.phys_port_cnt;
}

void fill_port_attr(Context* ctx, ibv_port_attr* p) {
  std::memset(p, 0, sizeof *p);
  auto r = ctx->emu_->query_port(1);
  if (!r.has_value()) return;
  const emu::PortAttr& e = r.value();
  p->state = static_cast<ibv_port_state>(e.state);
  p->max_mtu = static_cast<ibv_mtu>(e.max_mtu);
  p->active_mtu = static_cast<ibv_mtu>(e.active_mtu);
  p->gid_tbl_len = e.gid_tbl_len;
  p->port_cap_flags = e.port_cap_flags;
  p->max_msg_sz = e.max_msg_sz;
  p->bad_pkey_cntr = e.bad_pkey_cntr;
  p->qkey_viol_cntr = e.qkey_viol_cntr;
  p->pkey_tbl_len = e.pkey_tbl_len;
  p->lid = e.lid;
  p->sm_lid = e.sm_lid;
  p->lmc = e.lmc;
  p->max_vl_num = e.max_vl_num;
  p->sm_sl = e.sm_sl;
  p->subnet_timeout = e.subnet_timeout;
  p->init_type_reply = e.init_type_reply;
  p->active_width = e.active_width;
  p->active_speed = e.active_speed;
  p->phys_state = e.phys_state;
  p->link_layer = e.link_layer;
  p->flags = e.flags;
  p->port_cap_flags2 = e.port_cap_flags2;
}

bool query_gid(Context* ctx, uint32_t port, uint32_t index, ibv_gid* gid, int* type,
               uint32_t* ifindex) {
  if (port > 255 || index > 0x7fffffffu) return false;
  auto r = ctx->emu_->query_gid(static_cast<uint8_t>(port), static_cast<int>(index));
  if (!r.has_value()) return false;
  std::memcpy(gid->raw, r.value().raw.data(), 16);
  *type = static_cast<int>(r.value().type);
  if (ifindex != nullptr) {
    // The netdev carrying the GID (ibv_gid_entry.ndev_ifindex); 1 (lo) if unknown.
    const std::string& nd = r.value().netdev;
    unsigned i = nd.empty() ? 0 : if_nametoindex(nd.c_str());
    *ifindex = i != 0 ? i : 1;
  }
  return true;
}

int op_query_port(ibv_context* context, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (context == nullptr || attr == nullptr) return fail_errno(EINVAL);
  if (inherited(context)) return fail_errno(EIO);
  auto r = to_ctx(context)->emu_->query_port(port);
  if (!r.has_value()) return fail_errno(err_of(r.error()));
  ibv_port_attr full;
  fill_port_attr(to_ctx(context), &full);
  size_t n = attr_len < sizeof full ? attr_len : sizeof full;
  std::memcpy(attr, &full, n);
  return 0;
}

int op_query_device_ex(ibv_context* context, const ibv_query_device_ex_input* in,
                       ibv_device_attr_ex* attr, size_t attr_size) {
  if (context == nullptr || attr == nullptr) return fail_errno(EINVAL);
  if (in != nullptr && in->comp_mask != 0) return fail_errno(EINVAL);
  if (attr_size < sizeof(ibv_device_attr)) return fail_errno(EINVAL);
  ibv_device_attr_ex full;
  std::memset(&full, 0, sizeof full);
  fill_device_attr(to_ctx(context), &full.orig_attr);
  full.comp_mask = 0;
  // Completion timestamps are CLOCK_MONOTONIC nanoseconds: a 1 GHz "core clock".
  full.completion_timestamp_mask = ~0ull;
  full.hca_core_clock = 1000000;  // kHz
  // ibv_modify_cq moderation (emu::Cq::set_moderation).
  full.cq_mod_caps.max_cq_count = 0xffff;
  full.cq_mod_caps.max_cq_period = emu::kMaxCqPeriodUs;
  // ATOMIC_WRITE and FLUSH with the GLOBAL placement type (rdma-core 45+ bits). Not
  // FLUSH_PERSISTENT: registered memory is ordinary process memory (check_mr_access).
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags | compat::kDeviceFlushGlobal |
                             compat::kDeviceAtomicWrite;
  full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
  full.max_dm_size = kMaxDmSize;  // device memory (dm.cc)
  // Tag matching on RC QPs of TM SRQs (emu::Srq::tm_post, resp.cc tm_take).
  full.tm_caps.max_rndv_hdr_size = emu::kTmMaxRndvHdr;
  full.tm_caps.max_num_tags = emu::kTmMaxNumTags;
  full.tm_caps.flags = IBV_TM_CAP_RC;
  full.tm_caps.max_ops = emu::kTmMaxOps;
  full.tm_caps.max_sge = emu::kTmMaxSge;
  // ODP: every access goes through the fault-safe path (emu/objects/memory.h), whatever the
  // transport or opcode; an ODP MR is simply not pinned. Implicit ODP: the whole space.
  full.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  full.odp_caps.per_transport_caps.rc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
      IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.per_transport_caps.ud_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  // XRC: the RC requester and responder (receives land in XRC SRQs).
  full.xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                      IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  size_t n = attr_size < sizeof full ? attr_size : sizeof full;
  std::memcpy(attr, &full, n);
  return 0;
}

// ibv_query_rt_values_ex: the device clock now, in the units of the completion timestamps
// (CLOCK_MONOTONIC ns; hca_core_clock = 1 GHz). Reported as libmlx5 reports its cycle
// counter: the whole count in raw_clock.tv_nsec and tv_sec 0, so both readers found in the
// wild (tv_nsec alone, as DPDK and VMA; tv_sec * 1e9 + tv_nsec) get the same value. Like
// libmlx5, bits it does not know are ignored and comp_mask comes back as the set filled.
int op_query_rt_values(ibv_context* context, ibv_values_ex* values) {
  if (context == nullptr || values == nullptr) return fail_errno(EINVAL);
  if (inherited(context)) return fail_errno(EIO);
  uint32_t filled = 0;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(emu::Device::now_ns());
    filled |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  values->comp_mask = filled;
  return 0;
}

}  // namespace rnic::shim
