// ABI tests of the built libibverbs.so.1: exported symbol set and version nodes (against
// exports.map, the measured consumer TSV and, when installed, the real rdma-core library),
// the verbs_context contract (abi_compat, sz, every op slot non-NULL), the device tail
// word, and the sizes the query verbs may write.
#include <gtest/gtest.h>

#include "version_map.h"
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

namespace {

using rnic::test::SymSet;

// Default-version (node, symbol) pairs exported by a shared object, from objdump -T.
SymSet exported(const std::string& lib) {
  SymSet out;
  std::string cmd = "objdump -T '" + lib + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[1024];
  while (fgets(line, sizeof line, p)) {
    std::istringstream is(line);
    std::vector<std::string> f;
    std::string w;
    while (is >> w) f.push_back(w);
    if (f.size() < 7 || std::string(line).find("*UND*") != std::string::npos) continue;
    const std::string& node = f[f.size() - 2];
    const std::string& sym = f.back();
    if (node.rfind("IBVERBS", 0) != 0 || node == sym) continue;  // skip (VER) compat, node defs
    out.insert({node, sym});
  }
  pclose(p);
  return out;
}

SymSet from_map(const std::string& path) { return rnic::test::version_map_symbols(path); }

std::string dump(const SymSet& s) {
  std::string o;
  for (auto& [n, y] : s) o += n + " " + y + "\n";
  return o;
}

TEST(AbiTest, ExportsEqualVersionScript) {
  SymSet lib = exported(SHIM_LIB);
  SymSet map = from_map(SHIM_MAP);
  ASSERT_EQ(map.size(), 146u) << "exports.map should list rdma-core 44's 146 default symbols";
  SymSet only_lib, only_map;
  for (auto& e : lib)
    if (!map.count(e)) only_lib.insert(e);
  for (auto& e : map)
    if (!lib.count(e)) only_map.insert(e);
  EXPECT_TRUE(only_lib.empty()) << "exported but not in exports.map:\n" << dump(only_lib);
  EXPECT_TRUE(only_map.empty()) << "in exports.map but not exported:\n" << dump(only_map);
}

TEST(AbiTest, ExportsCoverEveryMeasuredConsumerImport) {
  SymSet lib = exported(SHIM_LIB);
  std::ifstream f(ABI_TSV);
  ASSERT_TRUE(f.good());
  std::string node, sym;
  int n = 0;
  while (f >> node >> sym) {
    ++n;
    EXPECT_TRUE(lib.count({node, sym})) << sym << "@" << node << " missing";
  }
  EXPECT_GT(n, 120);
}

TEST(AbiTest, ExportsEqualRealLibrary) {
  const char* real = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
  std::ifstream probe(real);
  // scripts/setup installs libibverbs1: without it this comparison would pass by skipping.
  ASSERT_TRUE(probe.good()) << real << " not found (scripts/setup installs libibverbs1)";
  // The real library may itself be ours only if someone copied it there; compare anyway.
  EXPECT_EQ(dump(exported(SHIM_LIB)), dump(exported(real)));
}

TEST(AbiTest, NothingElseExported) {
  std::string cmd = std::string("nm -D --defined-only '") + SHIM_LIB + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[1024];
  int total = 0;
  std::string stray;
  while (fgets(line, sizeof line, p)) {
    std::string s(line);
    ++total;
    bool ok = s.find("ibv_") != std::string::npos || s.find("verbs_") != std::string::npos ||
              s.find("IBVERBS_") != std::string::npos || s.find("execute_ioctl") != std::string::npos ||
              s.find("ioctl_final_num_attrs") != std::string::npos ||
              s.find("mbps_to_ibv_rate") != std::string::npos || s.find("mult_to_ibv_rate") != std::string::npos;
    if (!ok) stray += s;
  }
  pclose(p);
  EXPECT_EQ(stray, "");
  EXPECT_EQ(total, 146 + 13);  // symbols + one definition per version node
}

class ContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    list_ = ibv_get_device_list(&n_);
    ASSERT_NE(list_, nullptr);
    ASSERT_GE(n_, 1);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr) << strerror(errno);
  }
  void TearDown() override {
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }
  ibv_device** list_ = nullptr;
  int n_ = 0;
  ibv_context* ctx_ = nullptr;
};

TEST_F(ContextTest, VerbsContextIsExtendedWithFullSize) {
  EXPECT_EQ(ctx_->abi_compat, __VERBS_ABI_IS_EXTENDED);
  verbs_context* v = verbs_get_ctx(ctx_);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->sz, sizeof(verbs_context));
  EXPECT_EQ(&v->context, ctx_);
  EXPECT_EQ(ctx_->device, list_[0]);
  EXPECT_GE(ctx_->num_comp_vectors, 1);
}

TEST_F(ContextTest, EveryContextOpsSlotIsSet) {
  const auto* slots = reinterpret_cast<void* const*>(&ctx_->ops);
  size_t n = sizeof(ibv_context_ops) / sizeof(void*);
  ASSERT_EQ(n, 32u);
  for (size_t i = 0; i < n; ++i) EXPECT_NE(slots[i], nullptr) << "ibv_context_ops slot " << i;
}

TEST_F(ContextTest, EveryVerbsContextOpIsSet) {
  verbs_context* v = verbs_get_ctx(ctx_);
  const auto* slots = reinterpret_cast<void* const*>(v);
  size_t n = offsetof(verbs_context, _ABI_placeholder3) / sizeof(void*);
  for (size_t i = 0; i < n; ++i) {
    if (i * sizeof(void*) == offsetof(verbs_context, priv)) continue;  // data, not an op
    EXPECT_NE(slots[i], nullptr) << "verbs_context op at offset " << i * sizeof(void*);
  }
  // The inline dispatch helper agrees for the ops the tools rely on.
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_port), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_device_ex), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, create_qp_ex), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, create_cq_ex), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, close_xrcd), nullptr);
}

TEST_F(ContextTest, DeviceIsFollowedByNullOpsWord) {
  // libmlx5/libefa read the word after struct ibv_device (verbs_device::ops).
  const void* const* word = reinterpret_cast<const void* const*>(
      reinterpret_cast<const char*>(list_[0]) + sizeof(ibv_device));
  EXPECT_EQ(*word, nullptr);
  EXPECT_EQ(list_[0]->node_type, IBV_NODE_CA);
  EXPECT_EQ(list_[0]->transport_type, IBV_TRANSPORT_IB);
  EXPECT_STREQ(ibv_get_device_name(list_[0]), list_[0]->name);
  EXPECT_NE(ibv_get_device_guid(list_[0]), 0u);
}

TEST_F(ContextTest, ExportedQueryPortWritesOnlyTheOldStruct) {
  unsigned char buf[sizeof(ibv_port_attr) + 16];
  std::memset(buf, 0xA5, sizeof buf);
  // Call the exported symbol, not the header macro.
  ASSERT_EQ((ibv_query_port)(ctx_, 1, reinterpret_cast<_compat_ibv_port_attr*>(buf)), 0);
  for (size_t i = 48; i < sizeof buf; ++i) EXPECT_EQ(buf[i], 0xA5) << "byte " << i;
  auto* pa = reinterpret_cast<ibv_port_attr*>(buf);
  EXPECT_EQ(pa->state, IBV_PORT_ACTIVE);
  EXPECT_EQ(pa->link_layer, IBV_LINK_LAYER_ETHERNET);
}

TEST_F(ContextTest, QueryPortOpHonoursLength) {
  verbs_context* v = verbs_get_ctx(ctx_);
  unsigned char buf[sizeof(ibv_port_attr) + 8];
  std::memset(buf, 0x5A, sizeof buf);
  ASSERT_EQ(v->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(buf), 20), 0);
  for (size_t i = 20; i < sizeof buf; ++i) EXPECT_EQ(buf[i], 0x5A) << "byte " << i;
  ibv_port_attr pa;
  ASSERT_EQ(ibv_query_port(ctx_, 1, &pa), 0);  // the header macro path
  EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
  EXPECT_GE(pa.gid_tbl_len, 1);
}

TEST_F(ContextTest, QueryDeviceExHonoursSize) {
  ibv_device_attr_ex ex;
  std::memset(&ex, 0, sizeof ex);
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_GT(ex.orig_attr.max_qp, 0);
  EXPECT_NE(ex.completion_timestamp_mask, 0u);
  EXPECT_GT(ex.hca_core_clock, 0u);
  ibv_device_attr a;
  ASSERT_EQ(ibv_query_device(ctx_, &a), 0);
  EXPECT_EQ(a.max_qp, ex.orig_attr.max_qp);
  EXPECT_NE(a.vendor_id, 0x1d0fu);  // not AWS (libfabric would skip it)
  EXPECT_EQ(a.phys_port_cnt, 1);
  verbs_context* v = verbs_get_ctx(ctx_);
  unsigned char buf[sizeof(ibv_device_attr_ex) + 8];
  std::memset(buf, 0x33, sizeof buf);
  ASSERT_EQ(v->query_device_ex(ctx_, nullptr, reinterpret_cast<ibv_device_attr_ex*>(buf),
                               sizeof(ibv_device_attr)), 0);
  for (size_t i = sizeof(ibv_device_attr); i < sizeof buf; ++i) EXPECT_EQ(buf[i], 0x33);
}

TEST_F(ContextTest, GidZeroIsIpv4MappedRoceV2) {
  ibv_gid g;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &g), 0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(g.raw[i], 0);
  EXPECT_EQ(g.raw[10], 0xff);
  EXPECT_EQ(g.raw[11], 0xff);
  EXPECT_EQ(g.raw[12], 127);
  ibv_gid_entry e;
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 0, &e, 0), 0);
  EXPECT_EQ(e.gid_type, static_cast<uint32_t>(IBV_GID_TYPE_ROCE_V2));
  EXPECT_EQ(std::memcmp(e.gid.raw, g.raw, 16), 0);
  ibv_gid_entry t[4];
  EXPECT_EQ(ibv_query_gid_table(ctx_, t, 4, 0), 1);
}

TEST_F(ContextTest, CqAndQpAreExtendedObjects) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  auto* cqx = reinterpret_cast<ibv_cq_ex*>(cq);
  EXPECT_NE(cqx->start_poll, nullptr);
  EXPECT_NE(cqx->read_completion_ts, nullptr);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cqx, &pa), ENOENT);
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.qp_type = IBV_QPT_RC;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(qp, nullptr) << strerror(errno);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(qp);
  ASSERT_NE(qx, nullptr);
  EXPECT_EQ(&qx->qp_base, qp);
  const auto* first = reinterpret_cast<void* const*>(&qx->wr_atomic_cmp_swp);
  const auto* last = reinterpret_cast<void* const*>(&qx->wr_atomic_write);
  for (const auto* p = first; p <= last; ++p) EXPECT_NE(*p, nullptr);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  EXPECT_NE(qp->qp_num, 0u);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
