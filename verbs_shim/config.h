// The shim's view of the configuration: every SOFTRNIC_* variable is declared and parsed by
// base/config.h; this file reads it at device list and device open and applies the logging
// settings. Contract: never prints to stdout, never aborts; a bad value yields a message
// naming the variable, and the caller fails the verb with EINVAL.
#pragma once

#include <string>

#include "base/config.h"

namespace rnic::shim {

using Config = base::Config;

// Device list (ibv_get_device_list): SOFTRNIC_NAME and SYSFS_PATH only, so a bad value of a
// variable the open reads still lists the device (and the open then names the variable).
bool parse_list_config(Config* cfg, std::string* err);

// Device open: every variable. On success sets the log threshold (SOFTRNIC_LOG) and the log
// file (SOFTRNIC_LOG_FILE), then warns once per process about unknown SOFTRNIC_* variables.
// Returns false and fills *err (naming the variable) on the first invalid one.
bool parse_config(Config* cfg, std::string* err);

}  // namespace rnic::shim
