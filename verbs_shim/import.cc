// Sharing objects between contexts (ibv_import_device, ibv_import_pd/mr/dm and their
// unimport). In the kernel a context's cmd_fd is its uverbs file, the table of its objects by
// handle; ibv_import_device(fd) makes a second ibv_context over that same file, and
// ibv_import_pd/mr/dm look a handle up in it. Here every ibv_open_device makes a CmdFile and a
// memfd of its own as cmd_fd (named "softrnic-cmd", its first bytes "softrnic-cmd <pid>"); the
// memfd's inode identifies the file in this process's registry, so a dup()ed fd finds it.
//
// Decisions (README support table):
// - ibv_import_device: an fd that is no open file, or not a softrnic cmd_fd: EINVAL (as
//   rdma-core: fstat fails or not a uverbs character device); the cmd_fd of a context of
//   ANOTHER process (passed by SCM_RIGHTS), or of a context already closed here: EOPNOTSUPP,
//   in both hostings: the engine runs in each process (embedded, and daemon hosting too, where
//   softrnicd only hands out addresses), so another process's objects are not reachable. A
//   context a forked child inherited: EIO. The new context owns the fd (closed with it).
// - ibv_import_pd/mr/dm: a handle not in the file's table: ENOENT (the kernel's idr lookup).
//   The import is a second userspace object for the same engine object: traffic through
//   either is the same. Lifetime: while an import lives, dealloc_pd / dereg_mr / free_dm of
//   the original fail with EBUSY (the import holds a use count, so the original can never
//   disappear under it); ibv_unimport_* — or dealloc/dereg/free of the import itself, which
//   releases only the import — and the importing context's close release it (an imported
//   PD's memory stays until that close: objects created on it still point to it). Unimport of
//   an object that was not imported is ignored.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {

namespace {

constexpr char kMagic[] = "softrnic-cmd ";

std::mutex g_files_mu;
// (st_dev, st_ino) of a live file's memfd -> the file (weak: its contexts own it).
std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<CmdFile>> g_files;

template <class T>
void erase_one(std::vector<T*>& v, T* x) {
  auto it = std::find(v.begin(), v.end(), x);
  if (it != v.end()) v.erase(it);
}

}  // namespace

int cmd_file_create(DeviceEntry* d, std::shared_ptr<CmdFile>* out, int* fd_out) {
  int fd = memfd_create("softrnic-cmd", MFD_CLOEXEC);
  if (fd < 0) return errno;
  char hdr[48];
  int n = std::snprintf(hdr, sizeof hdr, "%s%d\n", kMagic, static_cast<int>(getpid()));
  struct stat st{};
  if (pwrite(fd, hdr, static_cast<size_t>(n), 0) != n || fstat(fd, &st) != 0) {
    int e = errno != 0 ? errno : EIO;
    close(fd);
    return e;
  }
  // Deleter: unregister with the last context of the file.
  auto key = std::make_pair(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
  std::shared_ptr<CmdFile> f(new CmdFile(), [key](CmdFile* p) {
    {
      std::lock_guard<std::mutex> g(g_files_mu);
      auto it = g_files.find(key);
      if (it != g_files.end() && it->second.expired()) g_files.erase(it);
    }
    delete p;
  });
  f->dev_ = key.first;
  f->ino_ = key.second;
  f->dev_entry_ = d;
  f->fork_gen_ = g_fork_generation.load();
  {
    std::lock_guard<std::mutex> g(g_files_mu);
    g_files[key] = f;
  }
  *out = std::move(f);
  *fd_out = fd;
  return 0;
}

void file_add_pd(Context* ctx, Pd* p) {
  std::lock_guard<std::mutex> g(ctx->file_->mu_);
  ctx->file_->pds_[p->pub_.handle] = p;
}
void file_del_pd(Context* ctx, Pd* p) {
  std::lock_guard<std::mutex> g(ctx->file_->mu_);
  ctx->file_->pds_.erase(p->pub_.handle);
}
void file_add_mr(Context* ctx, Mr* m) {
  std::lock_guard<std::mutex> g(ctx->file_->mu_);
  ctx->file_->mrs_[m->pub_.handle] = m;
}
void file_del_mr(Context* ctx, Mr* m) {
  std::lock_guard<std::mutex> g(ctx->file_->mu_);
  ctx->file_->mrs_.erase(m->pub_.handle);
}
void file_add_dm(Context* ctx, Dm* d) {
  std::lock_guard<std::mutex> g(ctx->file_->mu_);
  ctx->file_->dms_[d->pub_.handle] = d;
}
void file_del_dm(Context* ctx, Dm* d) {
  std::lock_guard<std::mutex> g(ctx->file_->mu_);
  ctx->file_->dms_.erase(d->pub_.handle);
}

void unimport_pd(Pd* p) {
  Context* ctx = to_ctx(p->pub_.context);
  {
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    erase_one(ctx->imported_pds_, p);
    ctx->retired_pds_.push_back(p);  // freed at close (see Context::retired_pds_)
  }
  p->emu_->drop_user();
  p->emu_.reset();
}

void unimport_mr(Mr* m) {
  Context* ctx = to_ctx(m->pub_.context);
  {
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    erase_one(ctx->imported_mrs_, m);
  }
  m->import_of_->imports_.fetch_sub(1);
  delete m;
}

void unimport_dm(Dm* d) {
  Context* ctx = to_ctx(d->pub_.context);
  {
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    erase_one(ctx->imported_dms_, d);
  }
  d->import_of_->imports_.fetch_sub(1);
  delete d;
}

void release_imports(Context* ctx) {
  if (!ctx->file_) return;
  std::vector<Pd*> pds;
  std::vector<Mr*> mrs;
  std::vector<Dm*> dms;
  std::vector<Pd*> retired;
  {
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    retired.swap(ctx->retired_pds_);
    pds.swap(ctx->imported_pds_);
    mrs.swap(ctx->imported_mrs_);
    dms.swap(ctx->imported_dms_);
  }
  for (Mr* m : mrs) {
    m->import_of_->imports_.fetch_sub(1);
    delete m;
  }
  for (Dm* d : dms) {
    d->import_of_->imports_.fetch_sub(1);
    delete d;
  }
  for (Pd* p : pds) {
    p->emu_->drop_user();
    delete p;
  }
  for (Pd* p : retired) delete p;
}

}  // namespace rnic::shim

using namespace rnic::shim;

SHIM_EXPORT struct ibv_context* ibv_import_device(int cmd_fd) {
  return guard_ptr<ibv_context>([&]() -> ibv_context* {
    struct stat st{};
    if (cmd_fd < 0 || fstat(cmd_fd, &st) != 0) return static_cast<ibv_context*>(null_errno(EINVAL));
    std::shared_ptr<CmdFile> file;
    {
      std::lock_guard<std::mutex> g(g_files_mu);
      auto it = g_files.find({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
      if (it != g_files.end()) file = it->second.lock();
    }
    if (!file) {
      // Not a live file of this process: a softrnic cmd_fd of another process (or of a
      // closed context) is EOPNOTSUPP, anything else EINVAL.
      char hdr[sizeof kMagic] = {};
      ssize_t n = S_ISREG(st.st_mode) ? pread(cmd_fd, hdr, sizeof kMagic - 1, 0) : -1;
      bool ours = n == static_cast<ssize_t>(sizeof kMagic - 1) &&
                  std::memcmp(hdr, kMagic, sizeof kMagic - 1) == 0;
      return static_cast<ibv_context*>(null_errno(ours ? EOPNOTSUPP : EINVAL));
    }
    // The file of a context a forked child inherited: the parent's objects (EIO).
    if (file->fork_gen_ != g_fork_generation.load())
      return static_cast<ibv_context*>(null_errno(EIO));
    DeviceEntry* dev = file->dev_entry_;
    return context_open(dev, cmd_fd, std::move(file));
  });
}

SHIM_EXPORT struct ibv_pd* ibv_import_pd(struct ibv_context* context, uint32_t pd_handle) {
  return guard_ptr<ibv_pd>([&]() -> ibv_pd* {
    if (context == nullptr) return static_cast<ibv_pd*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_pd*>(null_errno(EIO));
    Context* ctx = to_ctx(context);
    auto* p = new Pd();
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    auto it = ctx->file_->pds_.find(pd_handle);
    if (it == ctx->file_->pds_.end()) {
      delete p;
      return static_cast<ibv_pd*>(null_errno(ENOENT));
    }
    p->emu_ = it->second->emu_;
    p->import_of_ = it->second;
    p->pub_.context = context;
    p->pub_.handle = pd_handle;
    p->emu_->add_user();  // dealloc of the original: EBUSY while this lives
    ctx->imported_pds_.push_back(p);
    return &p->pub_;
  });
}

SHIM_EXPORT void ibv_unimport_pd(struct ibv_pd* pd) {
  if (pd == nullptr || to_pd(pd)->import_of_ == nullptr) return;
  unimport_pd(to_pd(pd));
}

SHIM_EXPORT struct ibv_mr* ibv_import_mr(struct ibv_pd* pd, uint32_t mr_handle) {
  return guard_ptr<ibv_mr>([&]() -> ibv_mr* {
    if (pd == nullptr) return static_cast<ibv_mr*>(null_errno(EINVAL));
    if (inherited(pd->context)) return static_cast<ibv_mr*>(null_errno(EIO));
    Context* ctx = to_ctx(pd->context);
    auto* m = new Mr();
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    auto it = ctx->file_->mrs_.find(mr_handle);
    if (it == ctx->file_->mrs_.end()) {
      delete m;
      return static_cast<ibv_mr*>(null_errno(ENOENT));
    }
    Mr* orig = it->second;
    m->emu_ = orig->emu_;
    m->import_of_ = orig;
    m->pub_.context = pd->context;
    m->pub_.pd = pd;
    m->pub_.addr = nullptr;  // as rdma-core's import: the address is the exporter's to tell
    m->pub_.length = orig->pub_.length;
    m->pub_.handle = mr_handle;
    m->pub_.lkey = orig->pub_.lkey;
    m->pub_.rkey = orig->pub_.rkey;
    orig->imports_.fetch_add(1);
    ctx->imported_mrs_.push_back(m);
    return &m->pub_;
  });
}

SHIM_EXPORT void ibv_unimport_mr(struct ibv_mr* mr) {
  if (mr == nullptr || to_mr(mr)->import_of_ == nullptr) return;
  unimport_mr(to_mr(mr));
}

SHIM_EXPORT struct ibv_dm* ibv_import_dm(struct ibv_context* context, uint32_t dm_handle) {
  return guard_ptr<ibv_dm>([&]() -> ibv_dm* {
    if (context == nullptr) return static_cast<ibv_dm*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_dm*>(null_errno(EIO));
    Context* ctx = to_ctx(context);
    auto* d = new Dm();
    std::lock_guard<std::mutex> g(ctx->file_->mu_);
    auto it = ctx->file_->dms_.find(dm_handle);
    if (it == ctx->file_->dms_.end()) {
      delete d;
      return static_cast<ibv_dm*>(null_errno(ENOENT));
    }
    Dm* orig = it->second;
    d->buf_ = orig->buf_;
    d->len_ = orig->len_;
    d->import_of_ = orig;
    d->pub_.context = context;
    d->pub_.memcpy_to_dm = dm_copy_to;
    d->pub_.memcpy_from_dm = dm_copy_from;
    d->pub_.comp_mask = 0;
    d->pub_.handle = dm_handle;
    orig->imports_.fetch_add(1);
    ctx->imported_dms_.push_back(d);
    return &d->pub_;
  });
}

SHIM_EXPORT void ibv_unimport_dm(struct ibv_dm* dm) {
  if (dm == nullptr || to_dm(dm)->import_of_ == nullptr) return;
  unimport_dm(to_dm(dm));
}
