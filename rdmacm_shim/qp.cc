// QPs and SRQs on ids: rdma_create_qp[_ex], rdma_destroy_qp, rdma_create_srq[_ex],
// rdma_destroy_srq, and the attributes the CM gives a QP (rdma_init_qp_attr, cm-notes §2.3).
#include <arpa/inet.h>

#include <cstring>

#include "rdmacm_shim/cma.h"

namespace rnic::rdmacm {

int qp_attr_for(Id* id, ibv_qp_attr* attr, int* mask) {
  ibv_qp_state want = attr->qp_state;
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = want;
  bool ud = id->pub.qp_type == IBV_QPT_UD;
  if (id->dev == nullptr) return EINVAL;
  switch (want) {
    case IBV_QPS_INIT:
      attr->pkey_index = 0;
      attr->port_num = id->pub.port_num;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        attr->qkey = id->pub.ps == RDMA_PS_UDP ? RDMA_UDP_QKEY : 0;
        *mask |= IBV_QP_QKEY;
      } else {
        // Before the CM knows the peer the access flags are 0 (cm-notes §2.3).
        if (id->peer_known)
          attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                  (id->rr > 0 ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0);
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      if (ud) {
        *mask = IBV_QP_STATE;
        return 0;
      }
      if (!id->peer_known) return EINVAL;
      attr->path_mtu = static_cast<ibv_mtu>(id->mtu);
      attr->dest_qp_num = id->peer_qpn;
      attr->rq_psn = id->my_psn;
      attr->max_dest_rd_atomic = id->rr;
      attr->min_rnr_timer = 0;
      attr->ah_attr.is_global = 1;
      std::memcpy(attr->ah_attr.grh.dgid.raw, id->path.dgid.raw, 16);
      attr->ah_attr.grh.sgid_index = static_cast<uint8_t>(id->sgid_index);
      attr->ah_attr.grh.hop_limit = id->path.hop_limit ? id->path.hop_limit : 64;
      attr->ah_attr.grh.traffic_class = id->path.traffic_class;
      attr->ah_attr.grh.flow_label = ntohl(id->path.flow_label);
      attr->ah_attr.sl = id->path.sl;
      attr->ah_attr.port_num = id->pub.port_num;
      *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      return 0;
    case IBV_QPS_RTS:
      if (ud) {
        attr->sq_psn = 0;
        *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        return 0;
      }
      if (!id->peer_known) return EINVAL;
      attr->sq_psn = id->peer_psn;
      attr->timeout = id->ack_timeout;
      attr->retry_cnt = id->retry;
      attr->rnr_retry = id->rnr;
      attr->max_rd_atomic = id->ini;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
              IBV_QP_MAX_QP_RD_ATOMIC;
      return 0;
    default:
      return EINVAL;
  }
}

namespace {

int modify_to(Id* id, ibv_qp_state s) {
  ibv_qp_attr a{};
  a.qp_state = s;
  int mask = 0;
  if (int rc = qp_attr_for(id, &a, &mask); rc != 0) return rc;
  return ibv_modify_qp(id->pub.qp, &a, mask);
}

// The state rdma_create_qp leaves a new QP in: INIT for RC/UC, RTS for UD.
int init_new_qp(Id* id) {
  if (int rc = modify_to(id, IBV_QPS_INIT); rc != 0) return rc;
  if (id->pub.qp_type != IBV_QPT_UD) return 0;
  if (int rc = modify_to(id, IBV_QPS_RTR); rc != 0) return rc;
  return modify_to(id, IBV_QPS_RTS);
}

int create_cqs(Id* id, uint32_t send_size, uint32_t recv_size) {
  rdma_cm_id& p = id->pub;
  if (recv_size) {
    p.recv_cq_channel = ibv_create_comp_channel(p.verbs);
    if (p.recv_cq_channel == nullptr) return errno;
    p.recv_cq = ibv_create_cq(p.verbs, static_cast<int>(recv_size), &p, p.recv_cq_channel, 0);
    if (p.recv_cq == nullptr) return errno;
  }
  if (send_size) {
    p.send_cq_channel = ibv_create_comp_channel(p.verbs);
    if (p.send_cq_channel == nullptr) return errno;
    p.send_cq = ibv_create_cq(p.verbs, static_cast<int>(send_size), &p, p.send_cq_channel, 0);
    if (p.send_cq == nullptr) return errno;
  }
  return 0;
}

void destroy_cqs(Id* id) {
  rdma_cm_id& p = id->pub;
  if (p.qp_type == IBV_QPT_XRC_RECV && p.srq) return;
  if (p.recv_cq) {
    ibv_destroy_cq(p.recv_cq);
    if (p.send_cq && p.send_cq != p.recv_cq) ibv_destroy_cq(p.send_cq);
    p.send_cq = nullptr;
    p.recv_cq = nullptr;
  }
  if (p.recv_cq_channel) {
    ibv_destroy_comp_channel(p.recv_cq_channel);
    if (p.send_cq_channel && p.send_cq_channel != p.recv_cq_channel) ibv_destroy_comp_channel(p.send_cq_channel);
    p.send_cq_channel = nullptr;
    p.recv_cq_channel = nullptr;
  }
  if (p.send_cq) {
    ibv_destroy_cq(p.send_cq);
    p.send_cq = nullptr;
  }
  if (p.send_cq_channel) {
    ibv_destroy_comp_channel(p.send_cq_channel);
    p.send_cq_channel = nullptr;
  }
}

int create_qp_ex_locked(Id* id, ibv_qp_init_attr_ex* attr) {
  rdma_cm_id& p = id->pub;
  if (p.verbs == nullptr || attr == nullptr) return EINVAL;
  if (p.qp != nullptr) return EINVAL;  // one QP per id
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->pd = p.pd;
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (attr->pd->context != p.verbs) return EINVAL;
  // XRC through rdma_cm (the REQ's XRC transport type, the device's implicit XRC domain and
  // SRQ) is not built: refused plainly rather than connected wrong. XRC itself works through
  // verbs (ibv_xsrq_pingpong).
  if (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV) return EOPNOTSUPP;
  if (attr->qp_type != p.qp_type && !(p.qp_type == IBV_QPT_RC && attr->qp_type == IBV_QPT_UC)) {
    if (!(p.ps == RDMA_PS_IB)) return EINVAL;
  }
  if (attr->srq == nullptr && p.srq != nullptr) attr->srq = p.srq;
  uint32_t ssz = (attr->send_cq || p.send_cq) ? 0 : attr->cap.max_send_wr;
  uint32_t rsz = (attr->recv_cq || p.recv_cq) ? 0 : attr->cap.max_recv_wr;
  if (attr->srq != nullptr && rsz == 0 && !attr->recv_cq && !p.recv_cq) rsz = 1;
  if (int rc = create_cqs(id, ssz, rsz); rc != 0) {
    destroy_cqs(id);
    return rc;
  }
  if (!attr->send_cq) attr->send_cq = p.send_cq;
  if (!attr->recv_cq) attr->recv_cq = p.recv_cq;
  ibv_qp* qp = ibv_create_qp_ex(p.verbs, attr);
  if (qp == nullptr) {
    int e = errno ? errno : ENOMEM;
    destroy_cqs(id);
    return e;
  }
  p.qp = qp;
  p.qp_type = qp->qp_type;
  if (int rc = init_new_qp(id); rc != 0) {
    ibv_destroy_qp(qp);
    p.qp = nullptr;
    destroy_cqs(id);
    return rc;
  }
  return 0;
}

}  // namespace

int qp_connect(Id* id) {
  if (id->pub.qp == nullptr) return 0;
  // INIT -> INIT re-applies the access flags the connection allows (cm-notes §2.3).
  if (int rc = modify_to(id, IBV_QPS_INIT); rc != 0) return rc;
  if (int rc = modify_to(id, IBV_QPS_RTR); rc != 0) return rc;
  return modify_to(id, IBV_QPS_RTS);
}

void qp_to_err(Id* id) {
  if (id->pub.qp == nullptr) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  (void)ibv_modify_qp(id->pub.qp, &a, IBV_QP_STATE);
}

}  // namespace rnic::rdmacm

using namespace rnic::rdmacm;

RDMACM_EXPORT int rdma_create_qp_ex(struct rdma_cm_id* id, struct ibv_qp_init_attr_ex* qp_init_attr) {
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    int rc = create_qp_ex_locked(to_id(id), qp_init_attr);
    return rc ? fail(rc) : 0;
  });
}

RDMACM_EXPORT int rdma_create_qp(struct rdma_cm_id* id, struct ibv_pd* pd, struct ibv_qp_init_attr* qp_init_attr) {
  return guard([&] {
    if (id == nullptr || qp_init_attr == nullptr) return fail(EINVAL);
    if (pd != nullptr && id->verbs != nullptr && pd->context != id->verbs) return fail(EINVAL);
    ibv_qp_init_attr_ex ex{};
    std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd ? pd : id->pd;
    std::lock_guard<std::mutex> lk(g().mu);
    int rc = create_qp_ex_locked(to_id(id), &ex);
    if (rc != 0) return fail(rc);
    qp_init_attr->send_cq = ex.send_cq;
    qp_init_attr->recv_cq = ex.recv_cq;
    qp_init_attr->srq = ex.srq;
    qp_init_attr->cap = ex.cap;
    return 0;
  });
}

RDMACM_EXPORT void rdma_destroy_qp(struct rdma_cm_id* id) {
  if (id == nullptr) return;
  std::lock_guard<std::mutex> lk(g().mu);
  if (id->qp != nullptr) ibv_destroy_qp(id->qp);  // detaches it from its groups
  id->qp = nullptr;
  for (Id::Mcast& m : to_id(id)->mcasts) m.attached = false;
  destroy_cqs(to_id(id));
}

RDMACM_EXPORT int rdma_create_srq_ex(struct rdma_cm_id* id, struct ibv_srq_init_attr_ex* attr) {
  return guard([&] {
    if (id == nullptr || attr == nullptr || id->verbs == nullptr) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr) {
      attr->pd = id->pd;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) {
      attr->srq_type = IBV_SRQT_BASIC;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
    }
    ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
    if (srq == nullptr) return -1;
    id->srq = srq;
    return 0;
  });
}

RDMACM_EXPORT int rdma_create_srq(struct rdma_cm_id* id, struct ibv_pd* pd, struct ibv_srq_init_attr* attr) {
  return guard([&] {
    if (id == nullptr || attr == nullptr || id->verbs == nullptr) return fail(EINVAL);
    ibv_srq* srq = ibv_create_srq(pd ? pd : id->pd, attr);
    if (srq == nullptr) return -1;
    std::lock_guard<std::mutex> lk(g().mu);
    id->srq = srq;
    return 0;
  });
}

RDMACM_EXPORT void rdma_destroy_srq(struct rdma_cm_id* id) {
  if (id == nullptr || id->srq == nullptr) return;
  std::lock_guard<std::mutex> lk(g().mu);
  ibv_destroy_srq(id->srq);
  id->srq = nullptr;
}

RDMACM_EXPORT int rdma_init_qp_attr(struct rdma_cm_id* id, struct ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  return guard([&] {
    if (id == nullptr || qp_attr == nullptr || qp_attr_mask == nullptr) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    int rc = qp_attr_for(to_id(id), qp_attr, qp_attr_mask);
    return rc ? fail(rc) : 0;
  });
}
