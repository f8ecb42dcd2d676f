// Internal objects of the verbs shim: each public rdma-core struct is the FIRST member of
// a shim object that also holds the emu object behind it, so the pointer handed to the
// application converts back with a cast, and emu objects point back via user_context.
// Contract: nothing here is exported; only functions marked SHIM_EXPORT and listed in
// exports.map leave the library. No C++ exception may escape an exported function.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu/objects/device.h"
#include "verbs_shim/cm_bridge.h"
#include "verbs_shim/config.h"
#include "verbs_shim/host.h"
#include "verbs_shim/verbs_compat.h"

// Marks a function that leaves the library (the version script still decides the node).
#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace rnic::shim {

namespace emu = rnic::emu;

struct Host;  // the embedded engine of one device in this process (host.h)

// ---------------------------------------------------------------------------------------
// Device: `struct ibv_device` followed by a verbs_device-like tail. The real libmlx5 and
// libefa read the pointer right after ibv_device (offset 664) to ask "is this mine?", so
// that word must exist and stay NULL.
struct DeviceEntry {
  ibv_device dev_;
  const void* verbs_device_ops_ = nullptr;  // must stay NULL (see above)
  uint64_t verbs_device_pad_[6] = {};       // refcount, entry, sysfs, core_support
  uint64_t node_guid_be_ = 0;               // big-endian, as ibv_get_device_guid returns
  int index_ = 0;
  softrnic_cm_tail cm_tail_{};              // librdmacm's way in (verbs_shim/cm_bridge.h)
};
static_assert(offsetof(DeviceEntry, verbs_device_ops_) == sizeof(ibv_device));
static_assert(offsetof(DeviceEntry, cm_tail_) == SOFTRNIC_CM_TAIL_OFFSET);

// The device list of this process (one embedded device). Never fails; an invalid
// SOFTRNIC_NAME yields an empty list and a message on stderr.
DeviceEntry* device_lookup(ibv_device* dev);  // nullptr if not ours
int device_list_snapshot(DeviceEntry** out, int max);
std::string sysfs_root();  // $SYSFS_PATH or "/sys"
uint64_t device_guid(const std::string& name);  // host order

struct Pd;
struct Mr;
struct Dm;

// ---------------------------------------------------------------------------------------
// The kernel's uverbs file of one ibv_open_device (import.cc): cmd_fd is a memfd of its own,
// identified by its inode, and every context imported from that fd (ibv_import_device) shares
// this object, so the PDs, MRs and DMs created on any of them are found by handle
// (ibv_import_pd/mr/dm), as the kernel looks a handle up in the file's table. Under mu_.
struct CmdFile {
  uint64_t dev_ = 0, ino_ = 0;  // the memfd's st_dev / st_ino
  DeviceEntry* dev_entry_ = nullptr;  // its device
  uint64_t fork_gen_ = 0;             // g_fork_generation at creation (a forked child: EIO)
  std::mutex mu_;
  std::unordered_map<uint32_t, Pd*> pds_;  // PDs allocated (not imported, not parent domains)
  std::unordered_map<uint32_t, Mr*> mrs_;  // MRs registered (not imported)
  std::unordered_map<uint32_t, Dm*> dms_;  // DMs allocated (not imported)
};

// ---------------------------------------------------------------------------------------
// Context: a whole `struct verbs_context` (its last member is the ibv_context we return,
// with abi_compat = __VERBS_ABI_IS_EXTENDED and sz = sizeof(verbs_context)), then state.
struct Context {
  verbs_context vctx_;
  DeviceEntry* dev_ = nullptr;
  Host* host_ = nullptr;  // shared engine, refcounted
  emu::Device* emu_ = nullptr;  // == host_->dev_.get()
  std::mutex async_mu_;
  std::deque<ibv_async_event> async_q_;  // events not yet returned by ibv_get_async_event
  // Per object (its ibv_qp/ibv_cq/ibv_srq): events ibv_get_async_event handed out, the
  // kernel's events_reported, which destroy waits to see acked.
  std::unordered_map<const void*, uint32_t> async_reported_;
  // Queues an async event and makes async_fd readable. Thread-safe.
  void post_async(const ibv_async_event& ev);
  // Destroy of the object `obj` (a QP, CQ or SRQ of this context), after its engine object is
  // gone and `*user_context` (the emu object's back pointer) has been cleared here under the
  // dispatcher's lock, so no new event can name it: drops its events not yet read and
  // returns how many were handed out. (The kernel drops an object's unread events at destroy
  // and answers events_reported; libibverbs then waits for that many acks.)
  uint32_t retire_async(void** user_context, const void* obj);
  // XRC (xrc.cc), under xrc_mu_: the domains opened by file, keyed by (st_dev, st_ino), with
  // the number of open handles (the kernel's inode-keyed xrcd table, per process since the
  // device is embedded); and the open handles of each XRC target QP (ibv_open_qp), the QP
  // itself being destroyed with its last handle.
  std::mutex xrc_mu_;
  struct XrcdShare {
    std::shared_ptr<emu::Xrcd> xrcd;
    uint32_t opens = 0;
  };
  std::unordered_map<uint64_t, std::unordered_map<uint64_t, XrcdShare>> xrcd_by_file_;
  std::unordered_map<const emu::Qp*, uint32_t> tgt_handles_;
  // The uverbs file this context belongs to (its own, or the one it was imported from), and
  // the objects imported on this context and not yet unimported (released at close), under
  // file_->mu_.
  std::shared_ptr<CmdFile> file_;
  std::vector<Pd*> imported_pds_;
  // Imported PDs already released: their memory stays until close, since QPs, MRs, SRQs and
  // AHs created on them may be destroyed later and read their pd (pd_release).
  std::vector<Pd*> retired_pds_;
  std::vector<Mr*> imported_mrs_;
  std::vector<Dm*> imported_dms_;
};
// The object an async event names, or nullptr for a port or device event.
const void* async_object(const ibv_async_event& ev);
// Blocks until `*completed` (the ibv_* struct's events_completed, bumped by ack under `mu`)
// reaches `reported`, as libibverbs' destroy does: the object is freed only after every event
// the application got for it was acked.
void wait_async_acks(pthread_mutex_t* mu, pthread_cond_t* cond, const uint32_t* completed,
                     uint32_t reported);
inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline ibv_context* from_ctx(Context* c) { return &c->vctx_.context; }

// True for an object a forked child inherited from its parent (host.h, fork safety): every
// verb on it fails with EIO and never reaches the engine.
inline bool inherited(const ibv_context* c) {
  return host_inherited(to_ctx(const_cast<ibv_context*>(c))->host_);
}

// Fills every ibv_context_ops and verbs_context op slot (context.cc).
void fill_ops(Context* ctx);

// ---------------------------------------------------------------------------------------
// Objects. `pub_` is the application-visible struct; `emu_` keeps the engine object alive.

struct CompChannel {
  ibv_comp_channel pub_;
  std::shared_ptr<emu::CompChannel> emu_;
};
inline CompChannel* to_channel(ibv_comp_channel* c) { return reinterpret_cast<CompChannel*>(c); }

// A thread domain (ibv_alloc_td). softrnic's per-QP/CQ locks stay in place for objects
// bound to a TD (they are uncontended there, and the engine's own threads still take them).
struct Td {
  ibv_td pub_;
  std::atomic<uint32_t> users_{0};  // parent domains naming it (dealloc_td: EBUSY)
};
inline Td* to_td(ibv_td* t) { return reinterpret_cast<Td*>(t); }

// A PD, or a parent domain (ibv_alloc_parent_domain): then `emu_` is the protection
// domain's engine PD itself, so a parent domain works wherever a PD does and its objects
// interoperate with the PD's (MRs on one serve QPs on the other, as the kernel sees one
// PD handle). Objects created on a parent domain count in `users_` (pd_hold/pd_release):
// dealloc of a parent domain in use is EBUSY, as mlx5's refcount gives.
struct Pd {
  ibv_pd pub_;
  std::shared_ptr<emu::Pd> emu_;
  bool parent_ = false;
  ibv_pd* protection_domain_ = nullptr;  // parent domain: its PD
  Td* td_ = nullptr;                     // parent domain: its TD, or null
  ibv_parent_domain_init_attr attr_{};   // parent domain: allocators and pd_context
  std::atomic<uint32_t> users_{0};
  Pd* import_of_ = nullptr;  // ibv_import_pd: the PD it names (holds one emu user: EBUSY)
};
inline Pd* to_pd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline bool is_parent_domain(ibv_pd* p) { return p != nullptr && to_pd(p)->parent_; }
// An object was created on / released from `p`: counted only for parent domains.
inline void pd_hold(ibv_pd* p) {
  if (is_parent_domain(p)) to_pd(p)->users_.fetch_add(1);
}
inline void pd_release(ibv_pd* p) {
  if (is_parent_domain(p)) to_pd(p)->users_.fetch_sub(1);
}

// Device memory (dm.cc): an anonymous mapping of the engine's, counted in Host::dm_used_.
constexpr uint64_t kMaxDmSize = 128 * 1024;  // max_dm_size: the device's whole pool
struct Dm {
  ibv_dm pub_;
  void* buf_ = nullptr;
  uint64_t len_ = 0;
  std::atomic<uint32_t> mrs_{0};  // MRs over it (free_dm: EBUSY), counted on the original
  std::atomic<uint32_t> imports_{0};  // live ibv_import_dm of it (free_dm: EBUSY)
  Dm* import_of_ = nullptr;           // ibv_import_dm: the DM it names (same memory)
};
inline Dm* to_dm(ibv_dm* d) { return reinterpret_cast<Dm*>(d); }

struct Mr {
  ibv_mr pub_;
  std::shared_ptr<emu::Mr> emu_;
  Dm* dm_ = nullptr;  // ibv_reg_dm_mr: the DM it lies in (the original, never an import)
  std::atomic<uint32_t> imports_{0};  // live ibv_import_mr of it (dereg_mr: EBUSY)
  Mr* import_of_ = nullptr;           // ibv_import_mr: the MR it names
};
inline Mr* to_mr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }

struct Mw {
  ibv_mw pub_;
  std::shared_ptr<emu::Mw> emu_;
};
inline Mw* to_mw(ibv_mw* m) { return reinterpret_cast<Mw*>(m); }

struct Ah {
  ibv_ah pub_;
  std::shared_ptr<emu::Ah> emu_;
};
inline Ah* to_ah(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }

// Every CQ is an ibv_cq_ex (ibv_cq is its prefix), so the start/next/end_poll family works
// on any CQ. cur_ is the completion the extended-poll cursor stands on.
struct Cq {
  ibv_cq_ex pub_;
  std::shared_ptr<emu::Cq> emu_;
  uint64_t wc_flags_ = 0;  // IBV_WC_EX_WITH_* requested at create
  emu::Cqe cur_{};
  bool polling_ = false;
  ibv_pd* parent_domain_ = nullptr;  // IBV_CQ_INIT_ATTR_MASK_PD (pd_hold)
};
inline Cq* to_cq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Cq* to_cq(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }

// An XRC domain handle (ibv_open_xrcd). rdma-core's verbs_xrcd layout: ibv_xrcd, then
// comp_mask and handle. Several handles (opens of one file) may share one emu::Xrcd.
struct Xrcd {
  ibv_xrcd pub_;
  uint32_t comp_mask_ = 0;
  uint32_t handle_ = 0;
  std::shared_ptr<emu::Xrcd> emu_;
  bool by_file_ = false;         // opened with an fd (shared), else private (fd -1)
  uint64_t dev_ = 0, ino_ = 0;   // that file's st_dev / st_ino
};
inline Xrcd* to_xrcd(ibv_xrcd* x) { return reinterpret_cast<Xrcd*>(x); }

struct Srq {
  ibv_srq pub_;
  std::shared_ptr<emu::Srq> emu_;
};
inline Srq* to_srq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }

// Every QP is an ibv_qp_ex (ibv_qp is its prefix), so ibv_qp_to_qp_ex works on any QP.
// The ibv_wr_* builders collect WRs between wr_start and wr_complete (send lock of the
// application's own: the wr_* API is not thread-safe per QP, as in rdma-core).
struct Qp {
  ibv_qp_ex pub_;
  // rdma-core 45+ appends wr_flush to ibv_qp_ex (verbs_compat.h): it must follow pub_.
  compat::WrFlushFn wr_flush_ = nullptr;
  std::shared_ptr<emu::Qp> emu_;
  uint64_t send_ops_flags_ = 0;
  // wr_* batch state; storage reserved at create so the hot path does not allocate.
  std::vector<emu::SendWr> batch_;
  std::vector<emu::Sge> batch_sge_;      // SGEs of all WRs of the batch, in order
  std::vector<uint32_t> batch_sge_at_;   // per WR: index of its first SGE in batch_sge_
  std::vector<uint8_t> batch_inline_;    // inline bytes copied by wr_set_inline_data*
  std::vector<uint32_t> batch_inline_at_;  // per WR: offset in batch_inline_ or ~0u
  int batch_err_ = 0;                    // first error seen by a builder (wr_complete returns it)
};
inline Qp* to_qp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Qp* to_qp(ibv_qp_ex* q) { return reinterpret_cast<Qp*>(q); }

// ---------------------------------------------------------------------------------------
// Boundary helpers. int verbs return 0 or a positive errno and, like rdma-core's command
// path (whose failed write()/ioctl() leaves errno set), set errno to it; pointer verbs
// return NULL and set errno. `guard_*` turn any C++ exception into ENOMEM so none crosses
// the ABI.
inline int fail_errno(int e) {
  errno = e;
  return e;
}
template <class F>
int guard_int(F&& f) noexcept {
  try {
    int r = f();
    if (r > 0) errno = r;
    return r;
  } catch (const std::bad_alloc&) {
    return fail_errno(ENOMEM);
  } catch (...) {
    return fail_errno(EIO);
  }
}
template <class T, class F>
T* guard_ptr(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
    return nullptr;
  } catch (...) {
    errno = EIO;
    return nullptr;
  }
}
inline void* null_errno(int e) {
  errno = e;
  return nullptr;
}
inline int err_of(emu::Status s) { return s.errno_value(); }
inline int err_of(emu::Errc e) { return static_cast<int>(e); }

// Posts a chain of ibv_recv_wr to an emu receive queue (a QP's RQ or an SRQ), in batches
// converted on the stack; `post(const emu::RecvWr*, int n, int* bad)` is the queue's
// post_recv. WRs before *bad stay posted, as in rdma-core. Sge layouts are identical
// (static_asserted in emu's types_mirror_test), so SGE arrays pass straight through.
template <class PostFn>
int post_recv_chain(ibv_recv_wr* wr, ibv_recv_wr** bad, PostFn&& post) {
  constexpr int kBatch = 32;
  emu::RecvWr buf[kBatch];
  ibv_recv_wr* src[kBatch];
  while (wr != nullptr) {
    int n = 0;
    for (; wr != nullptr && n < kBatch; wr = wr->next) {
      buf[n].wr_id = wr->wr_id;
      buf[n].sg_list = reinterpret_cast<const emu::Sge*>(wr->sg_list);
      buf[n].num_sge = wr->num_sge;
      src[n++] = wr;
    }
    int b = 0;
    emu::Status st = post(buf, n, &b);
    if (!st.is_ok()) {
      if (bad) *bad = src[b < n ? b : n - 1];
      return err_of(st);
    }
  }
  return 0;
}

// The emu QP of an XRC target QP created (or opened) on this context gets one more handle
// (xrc.cc); drop returns true for the last one (then the caller destroys the emu QP).
void xrc_tgt_handle_add(Context* ctx, const emu::Qp* qp);
bool xrc_tgt_handle_drop(Context* ctx, const emu::Qp* qp);
// The ibv_qp_ex function table of a new shim QP (qp.cc).
void fill_qp_ex(Qp* q);

// Conversions between verbs and emu address attributes (ah.cc).
emu::AhAttr to_emu(const ibv_ah_attr& a);
void from_emu(const emu::AhAttr& e, ibv_ah_attr* a);

// Import support (import.cc). The new uverbs file of an ibv_open_device: a memfd (its fd in
// *fd) registered by inode; 0 or an errno.
int cmd_file_create(DeviceEntry* d, std::shared_ptr<CmdFile>* out, int* fd);
// The DM memcpy ops (dm.cc), shared by imported DMs.
int dm_copy_to(ibv_dm* dm, uint64_t off, const void* host, size_t len);
int dm_copy_from(void* host, ibv_dm* dm, uint64_t off, size_t len);
// Registers / forgets an object of `ctx`'s file by handle (alloc/dealloc, reg/dereg).
void file_add_pd(Context* ctx, Pd* p);
void file_del_pd(Context* ctx, Pd* p);
void file_add_mr(Context* ctx, Mr* m);
void file_del_mr(Context* ctx, Mr* m);
void file_add_dm(Context* ctx, Dm* d);
void file_del_dm(Context* ctx, Dm* d);
// Releases an imported object (ibv_unimport_*, or dealloc/dereg/free of an import).
void unimport_pd(Pd* p);
void unimport_mr(Mr* m);
void unimport_dm(Dm* d);
ibv_context* context_open(DeviceEntry* d, int cmd_fd, std::shared_ptr<CmdFile> file);
// ibv_close_device: releases the imports still live on `ctx` (the originals stay).
void release_imports(Context* ctx);

// Device attributes the shim reports (device.cc).
void fill_device_attr(Context* ctx, ibv_device_attr* attr);
void fill_port_attr(Context* ctx, ibv_port_attr* attr);
bool query_gid(Context* ctx, uint32_t port, uint32_t index, ibv_gid* gid, int* type,
               uint32_t* ifindex = nullptr);

}  // namespace rnic::shim
