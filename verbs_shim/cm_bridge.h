/* The bridge between librdmacm.so.1 (rdmacm_shim/) and the CM agent of a device that lives
 * inside our libibverbs.so.1, crossing no exported symbol.
 *
 * librdmacm opens devices through the public ibv_get_device_list/ibv_open_device. Our
 * ibv_device (verbs_shim/shim.h DeviceEntry) carries, at SOFTRNIC_CM_TAIL_OFFSET, a
 * softrnic_cm_tail {magic, ops}: a C table of function pointers into libibverbs.so.1 that
 * reach the device's cm::Agent (emu/cm/agent.h). Both libraries are built from one tree at
 * one time, so sharing this header is sound; the magic and abi fields catch a mismatch.
 *
 * Recognising our device: the word right after struct ibv_device is the verbs_device ops
 * pointer, never NULL in rdma-core's libibverbs and always NULL in ours. librdmacm reads the
 * tail only when that word is NULL, then checks magic and abi; anything else is "not our
 * libibverbs" (ENODEV).
 *
 * This header is C (librdmacm's sources are C++, but the contract is plain data).
 */
#ifndef SOFTRNIC_VERBS_SHIM_CM_BRIDGE_H
#define SOFTRNIC_VERBS_SHIM_CM_BRIDGE_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOFTRNIC_CM_MAGIC 0x31626d632d6e7273ULL /* "srn-cmb1" */
#define SOFTRNIC_CM_ABI 3u /* 2: the GID table in softrnic_cm_device_info; connect by GID; 3: left_data_path */
/* sizeof(ibv_device) + the verbs_device-like words of DeviceEntry (ops ptr, 6 pad words,
 * node GUID, index + padding): static_asserted in verbs_shim/device.cc. */
#define SOFTRNIC_CM_TAIL_OFFSET (sizeof(struct ibv_device) + 72)

/* CM messages, as the agent sends or delivers them (IBA ch. 12 names). */
enum softrnic_cm_msg_type {
  SOFTRNIC_CM_REQ = 1,
  SOFTRNIC_CM_MRA,
  SOFTRNIC_CM_REJ,
  SOFTRNIC_CM_REP,
  SOFTRNIC_CM_RTU,
  SOFTRNIC_CM_DREQ,
  SOFTRNIC_CM_DREP,
  SOFTRNIC_CM_SIDR_REQ,
  SOFTRNIC_CM_SIDR_REP,
  /* Delivered only: */
  SOFTRNIC_CM_TIMEOUT,       /* status = the message that ran out of retries (REQ, REP, DREQ, SIDR_REQ) */
  SOFTRNIC_CM_TIMEWAIT_EXIT, /* the connection left timewait */
  SOFTRNIC_CM_ESTABLISHED,   /* sent by librdmacm on rdma_notify(COMM_EST): passive REP_SENT -> ESTABLISHED */
};

/* The fields of one CM message. A sender fills what its message type carries (IBA tables
 * 106-120); a received message has them as they were on the wire ("local" = the sender's).
 * private_data excludes nothing: for REQ / SIDR_REQ it starts with rdma_cm's 36-byte IP CM
 * header, which librdmacm builds and parses itself. */
struct softrnic_cm_msg {
  uint32_t type;   /* enum softrnic_cm_msg_type */
  uint32_t status; /* REJ reason, SIDR_REP status, MRA: service timeout, TIMEOUT: msg type */
  uint64_t service_id;    /* REQ, SIDR_REQ, SIDR_REP (host order) */
  uint32_t qpn;           /* REQ/REP: the sender's QPN; SIDR_REP: the responder's UD QPN */
  uint32_t starting_psn;  /* REQ/REP: the PSN the sender expects to receive */
  uint32_t qkey;          /* SIDR_REP (UD) */
  uint8_t qp_type;        /* REQ: IBV_QPT_RC or IBV_QPT_UC */
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t flow_control;
  uint8_t srq;
  uint8_t path_mtu;          /* enum ibv_mtu */
  uint8_t target_ack_delay;  /* REP */
  uint8_t local_ack_timeout; /* REQ primary path */
  uint8_t traffic_class;
  uint8_t hop_limit;
  uint8_t sl;
  uint8_t rej_msg;           /* REJ: Message REJected (0 REQ, 1 REP, 2 other) */
  uint8_t pad_[2];
  uint32_t flow_label;
  uint8_t local_gid[16];     /* REQ primary path: the REQ sender's GID */
  uint8_t remote_gid[16];    /* REQ primary path: the receiver's GID */
  uint32_t private_data_len; /* bytes valid in private_data (received: the message's maximum) */
  uint8_t private_data[232];
};

#define SOFTRNIC_CM_MAX_GIDS 16

/* One GID of the device: the address it names as 16 bytes (IPv4: ::ffff:a.b.c.d). */
struct softrnic_cm_gid {
  uint8_t raw[16];
  uint32_t scope_id; /* interface index of a link-local IPv6 GID (fe80::/10), else 0 */
};

/* One device's identity for address resolution. */
struct softrnic_cm_device_info {
  struct in_addr ipv4;  /* the device's IPv4 address (network order); 0.0.0.0 on an IPv6 device */
  uint8_t gid[16];      /* GID index 0: the device's own address (::ffff:ipv4, or its IPv6 address) */
  /* The whole GID table (index = GID index; gids[0] is `gid`): on a device whose interface
   * also has IPv6 addresses, those follow (emu/objects/device.h gid_table_for). */
  uint32_t gid_count;
  struct softrnic_cm_gid gids[SOFTRNIC_CM_MAX_GIDS];
  uint64_t node_guid;   /* network order */
  uint8_t port_num;     /* 1 */
  uint8_t active_mtu;   /* enum ibv_mtu */
  uint8_t ack_delay;    /* local_ca_ack_delay */
};

/* Called by the device (from its thread, never from inside an ops call) for every message
 * that reaches this process's consumer: `conn` is the connection the message belongs to;
 * for an incoming REQ / SIDR_REQ it is a new connection and `listen` the listener's handle
 * (0 otherwise). The message is valid only during the call: copy what you keep. */
typedef void (*softrnic_cm_handler)(void* user, uint64_t conn, uint64_t listen,
                                    const struct softrnic_cm_msg* msg);

struct softrnic_cm_ops {
  uint64_t magic; /* SOFTRNIC_CM_MAGIC */
  uint32_t abi;   /* SOFTRNIC_CM_ABI */
  uint32_t size;  /* sizeof(struct softrnic_cm_ops) */
  /* Every function returns 0 or a positive errno. `ctx` is a context of this device. */
  int (*query)(struct ibv_context* ctx, struct softrnic_cm_device_info* out);
  /* Installs the process's consumer of this device's CM (one per device; a second call
   * replaces it). `fn` NULL removes it; after that returns, no call is in progress. */
  int (*set_handler)(struct ibv_context* ctx, softrnic_cm_handler fn, void* user);
  /* Listens on a service ID; EADDRINUSE if someone in this process already does. */
  int (*listen)(struct ibv_context* ctx, uint64_t service_id, uint64_t* handle);
  int (*unlisten)(struct ibv_context* ctx, uint64_t handle);
  /* Sends a REQ or SIDR_REQ to the peer msg->remote_gid (IPv4-mapped or IPv6), from the
   * device's GID msg->local_gid, and returns the new connection's handle. EHOSTUNREACH: a
   * zero remote GID. */
  int (*connect)(struct ibv_context* ctx, const struct softrnic_cm_msg* msg, uint64_t* conn);
  /* Sends REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REP (or ESTABLISHED) on a connection. */
  int (*send)(struct ibv_context* ctx, uint64_t conn, const struct softrnic_cm_msg* msg);
  /* Forgets a connection: the agent finishes it as the kernel does when an id is destroyed
   * (REJ in REQ/REP states, DREQ/DREP when connected). No callback for it afterwards. */
  void (*release)(struct ibv_context* ctx, uint64_t conn);
  /* The calling thread left the data path (a CM call): the ACKs the device held for its next
   * post go now (emu::Engine::release_held_acks_now). */
  void (*left_data_path)(struct ibv_context* ctx);
};

struct softrnic_cm_tail {
  uint64_t magic; /* SOFTRNIC_CM_MAGIC */
  const struct softrnic_cm_ops* ops;
};

/* The table libibverbs.so.1 points its devices at (verbs_shim/cm_bridge.cc). */
#ifdef __cplusplus
}
namespace rnic::shim {
const softrnic_cm_ops* cm_bridge_ops();
}
#endif

#endif /* SOFTRNIC_VERBS_SHIM_CM_BRIDGE_H */
