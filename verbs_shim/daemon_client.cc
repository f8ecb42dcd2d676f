// Daemon hosting, client side (daemon_client.h).
#include "verbs_shim/daemon_client.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "emu/services/control.h"

namespace rnic::shim {

namespace {
constexpr int kTimeoutMs = 5000;
}

int daemon_find(const Config& cfg, DaemonDevice* out) {
  std::string dir = cfg.runtime_dir.empty() ? emu::control_runtime_dir() : cfg.runtime_dir;
  int fd = daemon::connect_daemon(dir, &out->path);
  if (fd < 0) return (fd == -ENOENT || fd == -ECONNREFUSED) ? ENOENT : -fd;
  daemon::HelloMsg hello;
  daemon::init_msg(&hello, daemon::MsgType::kHello);
  hello.pid = static_cast<uint32_t>(getpid());
  daemon::DevicesMsg devs;
  ssize_t r = daemon::call(fd, &hello, sizeof hello, &devs, sizeof devs, nullptr, 0, kTimeoutMs);
  if (r != static_cast<ssize_t>(sizeof devs) || devs.h.type != uint32_t(daemon::MsgType::kDevices) ||
      devs.count == 0 || devs.count > daemon::kMaxDevices) {
    RNIC_LOG(kError, "softrnicd at %s answered badly (%s)", out->path.c_str(),
             r < 0 ? std::strerror(int(-r)) : "bad device list");
    close(fd);
    return EPROTO;
  }
  // SOFTRNIC_NAME picks a device by name, SOFTRNIC_IP by address; neither set means the
  // daemon's first. An address the daemon does not serve is not its device: ENOENT, so auto
  // hosting embeds a device on that address as it always has.
  const bool by_name = cfg.name_set;
  for (uint32_t i = 0; i < devs.count; ++i) {
    devs.dev[i].name[sizeof devs.dev[i].name - 1] = 0;
    devs.dev[i].ip[sizeof devs.dev[i].ip - 1] = 0;
    if (cfg.ip && *cfg.ip != devs.dev[i].ip) continue;
    if (!by_name || cfg.name == devs.dev[i].name) {
      out->fd = fd;
      out->info = devs.dev[i];
      out->index = i;
      return 0;
    }
  }
  close(fd);
  if (cfg.ip) {
    if (cfg.hosting == base::Hosting::kDaemon) {
      RNIC_LOG(kError, "softrnicd at %s serves no device on %s (SOFTRNIC_IP)", out->path.c_str(),
               cfg.ip->c_str());
    }
    return ENOENT;
  }
  RNIC_LOG(kError, "softrnicd at %s has no device named %s", out->path.c_str(), cfg.name.c_str());
  return ENODEV;
}

int daemon_open_slot(DaemonDevice* dd, daemon::OpenedMsg* opened, std::vector<int>* fds) {
  // Any bad answer leaves no descriptor behind.
  auto fail = [fds](int err) {
    for (int f : *fds) close(f);
    fds->clear();
    return err;
  };
  daemon::OpenMsg m;
  daemon::init_msg(&m, daemon::MsgType::kOpen);
  m.index = dd->index;
  ssize_t r = daemon::call(dd->fd, &m, sizeof m, opened, sizeof *opened, fds, daemon::kMaxFds,
                           kTimeoutMs);
  if (r != static_cast<ssize_t>(sizeof *opened) || opened->h.type != uint32_t(daemon::MsgType::kOpened)) {
    return fail(r < 0 ? int(-r) : EPROTO);
  }
  if (opened->err != 0) return fail(opened->err);
  if (opened->slot == 0 || opened->slot > 255 || opened->side > 1 || opened->nfds == 0 ||
      fds->size() != size_t(opened->nfds) + opened->side) {
    return fail(EPROTO);
  }
  return 0;
}

}  // namespace rnic::shim
