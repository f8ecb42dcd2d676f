// verbs_shim/verbs_compat.h: the parts of the verbs ABI that rdma-core 45+ added for FLUSH and
// ATOMIC_WRITE (kernel uapi ib_user_ioctl_verbs.h / ib_user_verbs.h values) which Debian's
// rdma-core 44 headers, the ones softrnic builds against, do not define yet. An application
// built against newer headers uses the same numbers; its inline ibv_wr_flush() calls the
// wr_flush slot that follows wr_atomic_write at the end of struct ibv_qp_ex.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace rnic::shim::compat {

inline constexpr int kWrFlush = 14;                       // IBV_WR_FLUSH
inline constexpr int kWcFlush = 8;                        // IBV_WC_FLUSH
inline constexpr uint64_t kQpExWithFlush = 1ull << 11;    // IBV_QP_EX_WITH_FLUSH
inline constexpr unsigned kAccessFlushGlobal = 1u << 8;      // IBV_ACCESS_FLUSH_GLOBAL
inline constexpr unsigned kAccessFlushPersistent = 1u << 9;  // IBV_ACCESS_FLUSH_PERSISTENT
inline constexpr uint64_t kDeviceFlushGlobal = 1ull << 38;      // IB_UVERBS_DEVICE_FLUSH_GLOBAL
inline constexpr uint64_t kDeviceFlushPersistent = 1ull << 39;  // ..._FLUSH_PERSISTENT
inline constexpr uint64_t kDeviceAtomicWrite = 1ull << 40;      // IB_UVERBS_DEVICE_ATOMIC_WRITE
inline constexpr uint8_t kFlushGlobal = 1;      // enum ibv_placement_type
inline constexpr uint8_t kFlushPersistent = 2;
inline constexpr uint8_t kFlushRange = 0;       // enum ibv_selectivity_level
inline constexpr uint8_t kFlushMr = 1;

// struct ibv_qp_ex of rdma-core 45+: the 44 layout plus wr_flush.
using WrFlushFn = void (*)(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len,
                           uint8_t type, uint8_t level);
struct QpEx45 {
  ibv_qp_ex base;
  WrFlushFn wr_flush;
};
static_assert(offsetof(ibv_qp_ex, wr_atomic_write) == 344 && sizeof(ibv_qp_ex) == 352,
              "rdma-core 44 ibv_qp_ex layout");
static_assert(offsetof(QpEx45, wr_flush) == 352, "wr_flush follows wr_atomic_write");

// ibv_wr_flush() of rdma-core 45+ for callers built against 44's headers.
inline void wr_flush(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len,
                     uint8_t type, uint8_t level) {
  reinterpret_cast<QpEx45*>(qp)->wr_flush(qp, rkey, remote_addr, len, type, level);
}

}  // namespace rnic::shim::compat
