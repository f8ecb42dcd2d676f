// Event channels and events: rdma_create/destroy_event_channel, rdma_get_cm_event,
// rdma_ack_cm_event, rdma_event_str, and the sync-mode wait (ucma_complete).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "rdmacm_shim/cma.h"

namespace rnic::rdmacm {

Channel* channel_new() {
  auto* c = new (std::nothrow) Channel();
  if (c == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  c->pub.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (c->pub.fd < 0) {
    int e = errno;
    delete c;
    errno = e;
    return nullptr;
  }
  return c;
}

void channel_free(Channel* c) {
  if (c == nullptr) return;
  for (Event* e : c->q) delete e;
  close(c->pub.fd);
  delete c;
}

Event* queue_event(Id* id, rdma_cm_event_type type, int status, Channel* on) {
  auto* ev = new Event();
  std::memset(&ev->pub, 0, sizeof ev->pub);
  std::memset(ev->pdata, 0, sizeof ev->pdata);
  ev->owner = id;
  ev->pub.id = &id->pub;
  ev->pub.event = type;
  ev->pub.status = status;
  queue_push(on ? on : to_channel(id->pub.channel), ev);
  return ev;
}

// The channel's eventfd (a semaphore) counts exactly the events in q: every push writes one
// count, every removal reads one, all under g().mu, so the fd polls readable iff an event is
// queued (a count left behind by a purged event would make poll() report one that
// rdma_get_cm_event then blocks on) and a removal's read never blocks.
void queue_push(Channel* ch, Event* ev) {
  ch->q.push_back(ev);
  uint64_t one = 1;
  ssize_t w = write(ch->pub.fd, &one, sizeof one);
  (void)w;
}

namespace {
void take_count(Channel* ch) {
  uint64_t v = 0;
  ssize_t r;
  do {
    r = read(ch->pub.fd, &v, sizeof v);
  } while (r < 0 && errno == EINTR);
}

void purge_from(Channel* ch, Id* id, Channel* to) {
  auto& q = ch->q;
  for (auto it = q.begin(); it != q.end();) {
    if ((*it)->owner == id) {
      take_count(ch);
      if (to != nullptr) {
        queue_push(to, *it);
      } else {
        delete *it;
      }
      it = q.erase(it);
    } else {
      ++it;
    }
  }
}
}  // namespace

void purge_events(Id* id, Channel* to) {
  purge_from(to_channel(id->pub.channel), id, to);
  // A CONNECT_REQUEST of a sync listener waits on the listener's channel.
  if (id->listen_parent != nullptr && id->listen_parent->pub.channel != id->pub.channel)
    purge_from(to_channel(id->listen_parent->pub.channel), id, to);
}

namespace {

// Destroyed channels kept, oldest first (rdma_destroy_event_channel). Guarded by g().mu.
constexpr size_t kGraveyard = 64;
std::deque<Channel*>& graveyard() {
  static auto* yard = new std::deque<Channel*>();  // never destroyed: no exit-time order
  return *yard;
}

// Takes the first event, or waits for one in poll() (outside the lock) unless the application
// made the fd non-blocking (EAGAIN, as the kernel's rdma_cm file).
int get_event(Channel* ch, rdma_cm_event** out) {
  std::unique_lock<std::mutex> lk(g().mu);
  ++ch->waiters;
  for (;;) {
    if (ch->closed && ch->nonblock_at_close) {
      --ch->waiters;
      return fail(EBADF);  // as a read of the closed fd: never blocks, whatever it was
    }
    if (ch->closed) {
      // Destroyed before or while this thread waited. A read of the kernel's rdma_cm file
      // that another thread closed stays blocked for good (the read holds the file), and
      // programs count on it: rping's CM thread goes back into rdma_get_cm_event right after
      // acknowledging the DISCONNECTED event that lets main tear everything down, and exits
      // 255 on any error from it. So this call never returns, whatever woke our poll (the
      // fd closed by the destroy, or a new file with its number); `waiters` stays counted,
      // so the channel is never freed under it.
      lk.unlock();
      for (;;) pause();
    }
    if (!ch->q.empty()) {
      Event* ev = ch->q.front();
      ch->q.pop_front();
      take_count(ch);
      ev->owner->reported++;
      --ch->waiters;
      *out = &ev->pub;
      return 0;
    }
    const int fl = fcntl(ch->pub.fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK) != 0) {
      --ch->waiters;
      return fail(EAGAIN);
    }
    const int fd = ch->pub.fd;
    lk.unlock();
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, -1);
    const int err = errno;
    lk.lock();
    if (!ch->closed && ((r < 0 && err != EINTR) || (r > 0 && (p.revents & POLLNVAL) != 0))) {
      --ch->waiters;
      return fail(r < 0 ? err : EBADF);  // the application closed the fd itself
    }
  }
}

}  // namespace

int ucma_complete(Id* id) {
  if (!id->sync) return 0;
  if (id->pub.event != nullptr) {
    rdma_ack_cm_event(id->pub.event);
    id->pub.event = nullptr;
  }
  rdma_cm_event* ev = nullptr;
  if (get_event(to_channel(id->pub.channel), &ev) != 0) return -1;
  id->pub.event = ev;
  if (ev->status != 0) {
    if (ev->event == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
    return fail(ev->status < 0 ? -ev->status : ev->status);
  }
  return 0;
}

}  // namespace rnic::rdmacm

using namespace rnic::rdmacm;

RDMACM_EXPORT struct rdma_event_channel* rdma_create_event_channel(void) {
  int rc = ucma_init();
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  Channel* c = channel_new();
  return c ? &c->pub : nullptr;
}

RDMACM_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel* channel) {
  if (channel == nullptr) return;
  Channel* c = to_channel(channel);
  std::lock_guard<std::mutex> lk(g().mu);
  for (Event* e : c->q) delete e;
  c->q.clear();
  c->closed = true;
  const int fl = fcntl(c->pub.fd, F_GETFL);
  c->nonblock_at_close = fl >= 0 && (fl & O_NONBLOCK) != 0;
  close(c->pub.fd);
  // Threads in rdma_get_cm_event on it stay blocked, as in a read of the kernel's file
  // after a close (get_event), and keep it. One without waiters is kept for a while too (the
  // last kGraveyard destroyed): a call that comes just after the destroy (rping's race above)
  // then finds it closed and blocks, as against the kernel it would most often have, instead
  // of reading freed memory.
  if (c->waiters > 0) return;
  auto& yard = graveyard();
  yard.push_back(c);
  while (yard.size() > kGraveyard) {
    Channel* old = yard.front();
    yard.pop_front();
    if (old->waiters == 0) delete old;  // else a blocked caller holds it for good
  }
}

namespace rnic::rdmacm {
int get_cm_event_on_data_path(rdma_event_channel* channel, rdma_cm_event** event) {
  return guard([&] {
    int rc = ucma_init();
    if (rc != 0) return fail(rc);
    if (channel == nullptr || event == nullptr) return fail(EINVAL);
    return get_event(to_channel(channel), event);
  });
}
}  // namespace rnic::rdmacm

RDMACM_EXPORT int rdma_get_cm_event(struct rdma_event_channel* channel, struct rdma_cm_event** event) {
  left_data_path();
  return get_cm_event_on_data_path(channel, event);
}

RDMACM_EXPORT int rdma_ack_cm_event(struct rdma_cm_event* event) {
  if (event == nullptr) return fail(EINVAL);
  Event* ev = to_event(event);
  {
    std::lock_guard<std::mutex> lk(g().mu);
    ev->owner->acked++;
  }
  g().acked_cv.notify_all();
  delete ev;
  return 0;
}

RDMACM_EXPORT const char* rdma_event_str(enum rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}
