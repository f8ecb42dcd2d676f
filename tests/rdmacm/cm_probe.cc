// cm_probe: exits 0 when this process's device serves rdma_listen (a CM agent is there),
// 77 when the device has no CM agent (rdma_listen fails with ENOSYS), 1 on other errors.
// cm_pair.sh runs it first so the pairs are counted as skips, not failures, in a build whose
// device has no agent.
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main() {
  const char* ip = std::getenv("SOFTRNIC_IP");
  rdma_cm_id* id = nullptr;
  if (ip == nullptr || rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) != 0) {
    std::fprintf(stderr, "cm_probe: no id: %s\n", std::strerror(errno));
    return 1;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &sa.sin_addr);
  int rc = rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sa));
  if (rc == 0) rc = rdma_listen(id, 1);
  int e = errno;
  rdma_destroy_id(id);
  if (rc == 0) return 0;
  std::fprintf(stderr, "cm_probe: %s\n", std::strerror(e));
  return e == ENOSYS ? 77 : 1;
}
