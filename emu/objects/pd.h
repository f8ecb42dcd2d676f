// emu/objects/pd.h: protection domains (the container of QPs, MRs, MWs, AHs and SRQs) and address
// handles (AhAttr as in ibv_ah_attr, resolved once into an Av).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "emu/objects/status.h"
#include "emu/objects/wqe.h"

namespace rnic::emu {

class Device;

// A protection domain. Objects created in it count as users; dealloc_pd refuses (EBUSY)
// while users() > 0.
class Pd {
 public:
  Pd(Device& dev, uint32_t handle) : dev_(&dev), handle_(handle) {}
  uint32_t handle() const { return handle_; }
  Device& device() const { return *dev_; }
  uint32_t users() const { return users_.load(); }
  void add_user() { users_.fetch_add(1); }
  void drop_user() { users_.fetch_sub(1); }

  void* user_context = nullptr;  // free for the shim

 private:
  friend class Device;
  Device* dev_;
  uint32_t handle_;
  std::atomic<uint32_t> users_{0};
};

// An XRC domain (IBA 11.2.2 / ibv_open_xrcd): the scope XRC SRQs and XRC target QPs live in.
// A target QP delivers only into SRQs of its own domain. SRQs and target QPs count as users;
// dealloc_xrcd refuses (EBUSY) while users() > 0. Sharing a domain between opens (the inode
// of ibv_xrcd_init_attr.fd) is the shim's business: emu sees one Xrcd per domain.
class Xrcd {
 public:
  Xrcd(Device& dev, uint32_t handle) : dev_(&dev), handle_(handle) {}
  uint32_t handle() const { return handle_; }
  Device& device() const { return *dev_; }
  uint32_t users() const { return users_.load(); }
  void add_user() { users_.fetch_add(1); }
  void drop_user() { users_.fetch_sub(1); }

  void* user_context = nullptr;  // free for the shim

 private:
  friend class Device;
  Device* dev_;
  uint32_t handle_;
  std::atomic<uint32_t> users_{0};
};

// ibv_global_route + ibv_ah_attr, field for field.
struct GlobalRoute {
  uint8_t dgid[16] = {};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
};
struct AhAttr {
  GlobalRoute grh;
  uint16_t dlid = 0;
  uint8_t sl = 0;
  uint8_t src_path_bits = 0;
  uint8_t static_rate = 0;
  uint8_t is_global = 0;
  uint8_t port_num = 0;
};

// Validate an AhAttr for this RoCEv2 device and resolve it: is_global must be 1 (RoCE has
// no LIDs), port_num == 1, sgid_index < gid table length (any flow_label: its low 20 bits), and the dgid
// must be IPv4-mapped (::ffff:a.b.c.d; IPv6 GIDs come later). EINVAL otherwise.
Result<Av> resolve_ah_attr(const Device& dev, const AhAttr& attr);

// An address handle (UD destinations).
class Ah {
 public:
  Ah(Device& dev, uint32_t handle, std::shared_ptr<Pd> pd, const AhAttr& attr, const Av& av)
      : dev_(&dev), handle_(handle), pd_(std::move(pd)), attr_(attr), av_(av) {}
  uint32_t handle() const { return handle_; }
  const std::shared_ptr<Pd>& pd() const { return pd_; }
  const AhAttr& attr() const { return attr_; }  // as created (ibv_query_ah)
  const Av& av() const { return av_; }          // resolved destination

  void* user_context = nullptr;

 private:
  friend class Device;
  Device* dev_;
  uint32_t handle_;
  std::shared_ptr<Pd> pd_;
  AhAttr attr_;
  Av av_;
};

}  // namespace rnic::emu
