// Context plumbing: fills every ops slot of ibv_context and verbs_context, completion
// channels (eventfd + FIFO of fired CQs), async events, and the fork-support verbs.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "emu/transport/engine.h"
#include "verbs_shim/host.h"
#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {

void fill_ops(Context* ctx) {
  ibv_context_ops& o = ctx->vctx_.context.ops;
  // Pointers of the obsolete slots: code built against current headers never calls them,
  // but they point at a harmless stub rather than NULL.
  o._compat_query_device = uns_compat_query_device;
  o._compat_query_port = uns_compat_query_port;
  o._compat_alloc_pd = uns_compat_void;
  o._compat_dealloc_pd = uns_compat_void;
  o._compat_reg_mr = uns_compat_void;
  o._compat_rereg_mr = uns_compat_void;
  o._compat_dereg_mr = uns_compat_void;
  o.alloc_mw = op_alloc_mw;
  o.bind_mw = op_bind_mw;
  o.dealloc_mw = op_dealloc_mw;
  o._compat_create_cq = uns_compat_void;
  o.poll_cq = op_poll_cq;
  o.req_notify_cq = op_req_notify_cq;
  o._compat_cq_event = uns_compat_void;
  o._compat_resize_cq = uns_compat_void;
  o._compat_destroy_cq = uns_compat_void;
  o._compat_create_srq = uns_compat_void;
  o._compat_modify_srq = uns_compat_void;
  o._compat_query_srq = uns_compat_void;
  o._compat_destroy_srq = uns_compat_void;
  o.post_srq_recv = op_post_srq_recv;
  o._compat_create_qp = uns_compat_void;
  o._compat_query_qp = uns_compat_void;
  o._compat_modify_qp = uns_compat_void;
  o._compat_destroy_qp = uns_compat_void;
  o.post_send = op_post_send;
  o.post_recv = op_post_recv;
  o._compat_create_ah = uns_compat_void;
  o._compat_destroy_ah = uns_compat_void;
  o._compat_attach_mcast = uns_compat_void;
  o._compat_detach_mcast = uns_compat_void;
  o._compat_async_event = uns_compat_void;

  verbs_context& v = ctx->vctx_;
  v.query_port = op_query_port;
  v.advise_mr = op_advise_mr;
  v.alloc_null_mr = uns_alloc_null_mr;
  v.read_counters = uns_read_counters;
  v.attach_counters_point_flow = uns_attach_counters_point_flow;
  v.create_counters = uns_create_counters;
  v.destroy_counters = uns_destroy_counters;
  v.reg_dm_mr = op_reg_dm_mr;
  v.alloc_dm = op_alloc_dm;
  v.free_dm = op_free_dm;
  v.modify_flow_action_esp = uns_modify_flow_action_esp;
  v.destroy_flow_action = uns_destroy_flow_action;
  v.create_flow_action_esp = uns_create_flow_action_esp;
  v.modify_qp_rate_limit = uns_modify_qp_rate_limit;
  v.alloc_parent_domain = op_alloc_parent_domain;
  v.dealloc_td = op_dealloc_td;
  v.alloc_td = op_alloc_td;
  v.modify_cq = op_modify_cq;
  v.post_srq_ops = op_post_srq_ops;
  v.destroy_rwq_ind_table = uns_destroy_rwq_ind_table;
  v.create_rwq_ind_table = uns_create_rwq_ind_table;
  v.destroy_wq = uns_destroy_wq;
  v.modify_wq = uns_modify_wq;
  v.create_wq = uns_create_wq;
  v.query_rt_values = op_query_rt_values;
  v.create_cq_ex = op_create_cq_ex;
  v.priv = nullptr;
  v.query_device_ex = op_query_device_ex;
  v.ibv_destroy_flow = uns_destroy_flow;
  v.ABI_placeholder2 = uns_abi_placeholder;
  v.ibv_create_flow = uns_create_flow;
  v.ABI_placeholder1 = uns_abi_placeholder;
  v.open_qp = op_open_qp;
  v.create_qp_ex = op_create_qp_ex;
  v.get_srq_num = op_get_srq_num;
  v.create_srq_ex = op_create_srq_ex;
  v.open_xrcd = op_open_xrcd;
  v.close_xrcd = op_close_xrcd;
  v._ABI_placeholder3 = 0;
}

}  // namespace rnic::shim

using namespace rnic::shim;

// ---------------------------------------------------------------------------------------
// Completion channels.

SHIM_EXPORT struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* context) {
  return guard_ptr<ibv_comp_channel>([&]() -> ibv_comp_channel* {
    if (context == nullptr) return static_cast<ibv_comp_channel*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_comp_channel*>(null_errno(EIO));
    auto r = to_ctx(context)->emu_->create_comp_channel();
    if (!r.has_value()) return static_cast<ibv_comp_channel*>(null_errno(err_of(r.error())));
    auto* ch = new CompChannel();
    ch->emu_ = std::move(r.value());
    ch->pub_.context = context;
    ch->pub_.fd = ch->emu_->fd();  // eventfd: readable exactly while an event is queued
    ch->pub_.refcnt = 0;
    return &ch->pub_;
  });
}

SHIM_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel* channel) {
  if (channel == nullptr) return fail_errno(EINVAL);
  if (inherited(channel->context)) return fail_errno(EIO);
  return guard_int([&] {
    CompChannel* ch = to_channel(channel);
    emu::Status st = to_ctx(channel->context)->emu_->destroy_comp_channel(ch->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while CQs use it
    delete ch;
    return 0;
  });
}

SHIM_EXPORT int ibv_get_cq_event(struct ibv_comp_channel* channel, struct ibv_cq** cq,
                                 void** cq_context) {
  if (channel == nullptr || cq == nullptr || cq_context == nullptr) {
    errno = EINVAL;
    return -1;
  }
  if (inherited(channel->context)) {  // its eventfd is the parent's: never consume its events
    errno = EIO;
    return -1;
  }
  try {
    // The thread goes to sleep, not to a post: the ACKs held for one go now.
    host_left_data_path(to_ctx(channel->context)->host_);
    // A real read of the eventfd: blocks, or EAGAIN when the app set O_NONBLOCK.
    auto r = to_channel(channel)->emu_->get_event();
    if (!r.has_value()) {
      errno = err_of(r.error());
      return -1;
    }
    auto* c = static_cast<Cq*>(r.value()->user_context);
    if (c == nullptr) {
      errno = EAGAIN;
      return -1;
    }
    *cq = reinterpret_cast<ibv_cq*>(&c->pub_);
    *cq_context = c->pub_.cq_context;
    return 0;
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
}

SHIM_EXPORT void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) {
  if (cq == nullptr || inherited(cq->context)) return;
  to_cq(cq)->emu_->ack_events(nevents);
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---------------------------------------------------------------------------------------
// Async events.

SHIM_EXPORT int ibv_get_async_event(struct ibv_context* context, struct ibv_async_event* event) {
  if (context == nullptr || event == nullptr) {
    errno = EINVAL;
    return -1;
  }
  if (inherited(context)) {  // the async fd is the parent's
    errno = EIO;
    return -1;
  }
  Context* ctx = to_ctx(context);
  // One eventfd count per event posted; a destroyed object's unread events leave their
  // counts behind, so a count with no event is read past (blocking fd) or is EAGAIN.
  for (;;) {
    uint64_t v = 0;
    if (read(context->async_fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return -1;
    std::lock_guard<std::mutex> lk(ctx->async_mu_);
    if (!ctx->async_q_.empty()) {
      *event = ctx->async_q_.front();
      ctx->async_q_.pop_front();
      if (const void* obj = async_object(*event)) ++ctx->async_reported_[obj];
      return 0;
    }
    if (fcntl(context->async_fd, F_GETFL) & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
  }
}

SHIM_EXPORT void ibv_ack_async_event(struct ibv_async_event* event) {
  if (event == nullptr) return;
  switch (event->event_type) {
    case IBV_EVENT_CQ_ERR: {
      ibv_cq* cq = event->element.cq;
      if (cq == nullptr) return;
      pthread_mutex_lock(&cq->mutex);
      ++cq->async_events_completed;
      pthread_cond_signal(&cq->cond);
      pthread_mutex_unlock(&cq->mutex);
      return;
    }
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED: {
      ibv_qp* qp = event->element.qp;
      if (qp == nullptr) return;
      pthread_mutex_lock(&qp->mutex);
      ++qp->events_completed;
      pthread_cond_signal(&qp->cond);
      pthread_mutex_unlock(&qp->mutex);
      return;
    }
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: {
      ibv_srq* srq = event->element.srq;
      if (srq == nullptr) return;
      pthread_mutex_lock(&srq->mutex);
      ++srq->events_completed;
      pthread_cond_signal(&srq->cond);
      pthread_mutex_unlock(&srq->mutex);
      return;
    }
    default:
      return;
  }
}

// ---------------------------------------------------------------------------------------
// Fork support: softrnic never pins pages in a kernel, so fork is always safe.

SHIM_EXPORT int ibv_fork_init(void) { return 0; }

SHIM_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

SHIM_EXPORT int ibv_dontfork_range(void* base, size_t size) {
  (void)base;
  (void)size;
  return 0;
}

SHIM_EXPORT int ibv_dofork_range(void* base, size_t size) {
  (void)base;
  (void)size;
  return 0;
}
