// Daemon hosting, client side: finding softrnicd (SOFTRNIC_HOSTING, SOFTRNIC_RUNTIME_DIR, then
// /run/softrnic), choosing one of its devices, and opening a slot on it (daemon/proto/proto.h).
// Contract: never prints to stdout; failures are a positive errno and one log line.
#pragma once

#include <string>
#include <vector>

#include "daemon/proto/proto.h"
#include "verbs_shim/config.h"

namespace rnic::shim {

// What the device list and the open need from the daemon.
struct DaemonDevice {
  int fd = -1;                     // the connection (kept open by an open device)
  daemon::DeviceInfo info;         // the chosen device (SOFTRNIC_NAME, else the first)
  uint32_t index = 0;
  std::string path;                // socket path, for messages
};

// 0: connected and a device chosen (out->fd open; the caller closes it).
// ENOENT: no daemon answers (auto hosting then embeds the device); ENODEV: the daemon has no
// device named SOFTRNIC_NAME; another errno: the daemon answered badly.
int daemon_find(const Config& cfg, DaemonDevice* out);

// Opens a slot on out->index over out->fd: the slot, the limits and the device's sockets (one
// per GID, in order, owned by the caller). 0 or a positive errno (EUSERS: no free slot).
int daemon_open_slot(DaemonDevice* dd, daemon::OpenedMsg* opened, std::vector<int>* fds);

}  // namespace rnic::shim
