// tests/shim/rc_connect.h: brings one RC QP of a shim test through INIT -> RTR -> RTS towards
// (dest QPN, GID), PSNs 0, path MTU 1024, timeout 14, retry_cnt/rnr_retry 7. Test-only.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

// 0, or the errno ibv_modify_qp returned for the first transition that failed.
inline int rc_connect(ibv_qp* qp, uint32_t dest, const ibv_gid& gid, int access,
                      uint8_t rd_atomic) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS))
    return rc;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = rd_atomic;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                         IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return rc;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = rd_atomic;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}
