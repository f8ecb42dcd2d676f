// Device memory (ibv_alloc_dm, ibv_free_dm, ibv_memcpy_to_dm/from_dm, ibv_reg_dm_mr). The
// "device memory" of a software NIC is engine-owned memory: each DM is its own anonymous
// mapping, counted against the device's max_dm_size pool; the application reaches it only
// through the two memcpy ops (ibv_dm's function pointers, as verbs.h inlines them) and an MR
// registered over it (zero-based: SGEs and RDMA addresses are offsets into the MR).
#include <sys/mman.h>

#include <cstring>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {

namespace {

// The largest log_align_req honoured: one page (every DM is page-aligned).
constexpr uint32_t kMaxDmLogAlign = 12;

// As libmlx5: the range must lie inside the DM (EFAULT), offset and length 4-byte aligned
// (EINVAL).
int dm_range(const Dm* d, uint64_t off, size_t len) {
  if ((off & 3) != 0 || (len & 3) != 0) return EINVAL;
  if (off > d->len_ || len > d->len_ - off) return EFAULT;
  return 0;
}

}  // namespace

int dm_copy_to(ibv_dm* dm, uint64_t off, const void* host, size_t len) {
  if (dm == nullptr || (host == nullptr && len != 0)) return fail_errno(EINVAL);
  Dm* d = to_dm(dm);
  if (int e = dm_range(d, off, len)) return fail_errno(e);
  std::memcpy(static_cast<uint8_t*>(d->buf_) + off, host, len);
  return 0;
}

int dm_copy_from(void* host, ibv_dm* dm, uint64_t off, size_t len) {
  if (dm == nullptr || (host == nullptr && len != 0)) return fail_errno(EINVAL);
  Dm* d = to_dm(dm);
  if (int e = dm_range(d, off, len)) return fail_errno(e);
  std::memcpy(host, static_cast<const uint8_t*>(d->buf_) + off, len);
  return 0;
}

// ibv_alloc_dm: comp_mask != 0, length 0 or above max_dm_size, log_align_req above a page:
// EINVAL (libmlx5); the device pool exhausted: ENOMEM. A forked child may allocate, copy and
// free DMs of an inherited context (they are the child's own memory, no engine involved);
// registering one there is EIO like every other engine verb.
ibv_dm* op_alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  return guard_ptr<ibv_dm>([&]() -> ibv_dm* {
    if (context == nullptr || attr == nullptr || attr->comp_mask != 0 || attr->length == 0 ||
        attr->length > kMaxDmSize || attr->log_align_req > kMaxDmLogAlign)
      return static_cast<ibv_dm*>(null_errno(EINVAL));
    Host* h = to_ctx(context)->host_;
    uint64_t used = h->dm_used_.load();
    do {
      if (attr->length > kMaxDmSize - used) return static_cast<ibv_dm*>(null_errno(ENOMEM));
    } while (!h->dm_used_.compare_exchange_weak(used, used + attr->length));
    void* m = mmap(nullptr, attr->length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) {
      h->dm_used_.fetch_sub(attr->length);
      return static_cast<ibv_dm*>(null_errno(ENOMEM));
    }
    auto* d = new Dm();
    d->buf_ = m;
    d->len_ = attr->length;
    d->pub_.context = context;
    d->pub_.memcpy_to_dm = dm_copy_to;
    d->pub_.memcpy_from_dm = dm_copy_from;
    d->pub_.comp_mask = 0;
    d->pub_.handle = h->dm_handles_.fetch_add(1);
    file_add_dm(to_ctx(context), d);
    return &d->pub_;
  });
}

// ibv_free_dm: EBUSY while an MR is registered over it (the kernel's usecnt).
int op_free_dm(ibv_dm* dm) {
  if (dm == nullptr) return fail_errno(EINVAL);
  Dm* d = to_dm(dm);
  if (d->import_of_ != nullptr) {  // an import: releases only it (import.cc)
    unimport_dm(d);
    return 0;
  }
  if (d->mrs_.load() != 0 || d->imports_.load() != 0) return fail_errno(EBUSY);
  file_del_dm(to_ctx(dm->context), d);
  munmap(d->buf_, d->len_);
  to_ctx(dm->context)->host_->dm_used_.fetch_sub(d->len_);
  delete d;
  return 0;
}

// ibv_reg_dm_mr: IBV_ACCESS_ZERO_BASED is required and only LOCAL_WRITE, REMOTE_WRITE,
// REMOTE_READ, REMOTE_ATOMIC may join it (the kernel and libmlx5: EINVAL); the range must
// lie inside the DM (EINVAL); length 0 is accepted, as the kernel does. The MR's iova is 0
// (addr NULL, as rdma-core reports it); the DM is engine memory, so it is not pinned.
ibv_mr* op_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t off, size_t length, unsigned int access) {
  return guard_ptr<ibv_mr>([&]() -> ibv_mr* {
    constexpr unsigned kAllowed = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE |
                                  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC;
    if (pd == nullptr || dm == nullptr || dm->context != pd->context)
      return static_cast<ibv_mr*>(null_errno(EINVAL));
    if (!(access & IBV_ACCESS_ZERO_BASED) || (access & ~kAllowed) != 0)
      return static_cast<ibv_mr*>(null_errno(EINVAL));
    Dm* d = to_dm(dm);
    if (d->import_of_ != nullptr) d = d->import_of_;  // MRs count on the original
    if (off > d->len_ || length > d->len_ - off)
      return static_cast<ibv_mr*>(null_errno(EINVAL));
    if (inherited(pd->context)) return static_cast<ibv_mr*>(null_errno(EIO));
    Context* ctx = to_ctx(pd->context);
    const uint64_t host = reinterpret_cast<uintptr_t>(d->buf_) + off;
    auto r = ctx->emu_->reg_dm_mr(to_pd(pd)->emu_, host, length,
                                  access & ~static_cast<unsigned>(IBV_ACCESS_ZERO_BASED));
    if (!r.has_value()) return static_cast<ibv_mr*>(null_errno(err_of(r.error())));
    auto* m = new Mr();
    m->emu_ = std::move(r.value());
    m->emu_->user_context = m;
    m->dm_ = d;
    d->mrs_.fetch_add(1);
    m->pub_.context = pd->context;
    m->pub_.pd = pd;
    m->pub_.addr = nullptr;  // zero-based
    m->pub_.length = length;
    m->pub_.handle = m->emu_->handle();
    m->pub_.lkey = m->emu_->lkey();
    m->pub_.rkey = m->emu_->rkey();
    pd_hold(pd);
    file_add_mr(ctx, m);
    return &m->pub_;
  });
}

}  // namespace rnic::shim
