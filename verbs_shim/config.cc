// The shim's configuration reads (base/config.h holds the declarations and the parser) and
// the application of SOFTRNIC_LOG / SOFTRNIC_LOG_FILE at device open.
#include "verbs_shim/config.h"

#include <mutex>

namespace rnic::shim {

bool parse_list_config(Config* cfg, std::string* err) {
  static constexpr std::string_view kListVars[] = {"SOFTRNIC_NAME", "SYSFS_PATH", "SOFTRNIC_HOSTING",
                                                   "SOFTRNIC_RUNTIME_DIR", "XDG_RUNTIME_DIR"};
  *err = base::parse_config(base::process_env(), cfg, kListVars);
  return err->empty();
}

bool parse_config(Config* cfg, std::string* err) {
  *err = base::parse_config(base::process_env(), cfg);
  if (!err->empty()) return false;
  base::set_log_level(cfg->log);
  // set_log_file keeps the previous descriptor open (base/log.h): change it only when the
  // path changes, so reopening the device does not leak one descriptor per open.
  static std::mutex mu;
  static std::string applied;
  {
    std::lock_guard lk(mu);
    if (cfg->log_file != applied) {
      if (std::string e = base::set_log_file(cfg->log_file); !e.empty()) {
        *err = "SOFTRNIC_LOG_FILE: " + e;
        return false;
      }
      applied = cfg->log_file;
    }
  }
  base::warn_unknown_variables_once(cfg->log);
  return true;
}

}  // namespace rnic::shim
