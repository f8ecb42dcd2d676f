// Internal objects of the verbs shim: each public rdma-core struct is the FIRST member of
// a shim object, so the pointer handed to the application converts back with a cast.
// Contract: nothing here is exported; only functions marked SHIM_EXPORT and listed in
// exports.map leave the library. No C++ exception may escape an exported function.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "verbs_shim/config.h"

// Marks a function that leaves the library (the version script still decides the node).
#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace rnic::emu {
class Device;
}

namespace rnic::shim {

struct Host;  // the embedded engine of one device in this process (host.cc)

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
};
static_assert(offsetof(DeviceEntry, verbs_device_ops_) == sizeof(ibv_device));

// The device list of this process (one embedded device). Never fails; an invalid
// SOFTRNIC_NAME yields an empty list and a message on stderr.
DeviceEntry* device_lookup(ibv_device* dev);  // nullptr if not ours
int device_list_snapshot(DeviceEntry** out, int max);
std::string sysfs_root();  // $SYSFS_PATH or "/sys"

// ---------------------------------------------------------------------------------------
// Completion channel: an eventfd (semaphore mode) plus a FIFO of CQs that fired.
// ibv_get_cq_event reads the fd first, so O_NONBLOCK set by the app is honoured.
struct CompChannel {
  ibv_comp_channel ch_;
  std::mutex mu_;
  std::deque<ibv_cq*> fired_;
  // Queues one event for `cq` and makes the fd readable. Thread-safe.
  void notify(ibv_cq* cq);
  // Removes queued events of `cq` (on destroy). Thread-safe.
  void forget(ibv_cq* cq);
};
inline CompChannel* to_channel(ibv_comp_channel* c) { return reinterpret_cast<CompChannel*>(c); }

// ---------------------------------------------------------------------------------------
// Context: a whole `struct verbs_context` (its last member is the ibv_context we return,
// with abi_compat = __VERBS_ABI_IS_EXTENDED and sz = sizeof(verbs_context)), then state.
struct Context {
  verbs_context vctx_;
  DeviceEntry* dev_ = nullptr;
  Host* host_ = nullptr;  // shared engine, refcounted
  std::mutex async_mu_;
  std::deque<ibv_async_event> async_q_;  // events not yet returned by ibv_get_async_event
  // Queues an async event and makes async_fd readable. Thread-safe.
  void post_async(const ibv_async_event& ev);
};
inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline ibv_context* from_ctx(Context* c) { return &c->vctx_.context; }

// Fills every ibv_context_ops and verbs_context op slot (context.cc).
void fill_ops(Context* ctx);

// ---------------------------------------------------------------------------------------
// Boundary helpers. int verbs return 0 or a positive errno; pointer verbs return NULL and
// set errno. `guard_*` turn any C++ exception into ENOMEM so none crosses the ABI.
template <class F>
int guard_int(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return ENOMEM;
  } catch (...) {
    return EIO;
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

// Device attributes the shim reports (filled from the engine's device when open).
void fill_device_attr(Context* ctx, ibv_device_attr* attr);
void fill_port_attr(Context* ctx, ibv_port_attr* attr);
bool query_gid(Context* ctx, uint32_t port, uint32_t index, ibv_gid* gid, int* type);

}  // namespace rnic::shim
