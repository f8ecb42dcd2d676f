// ABI of the built librdmacm.so.1: its exported (node, symbol) set equals exports.map and,
// when installed, the real rdma-core 44 library's; the version nodes chain 1.3 -> 1.0; it
// needs our libibverbs.so.1 and no emu code (no engine symbol, no second device copy).
#include <gtest/gtest.h>

#include "../shim/version_map.h"

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using rnic::test::SymSet;

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Defined dynamic symbols of a shared object as (version node, name), from objdump -T.
SymSet exported(const std::string& lib, bool all_nodes = false) {
  SymSet out;
  std::istringstream in(run("objdump -T '" + lib + "' 2>/dev/null"));
  std::string line;
  while (std::getline(in, line)) {
    bool defined = line.find(" DF ") != std::string::npos || line.find(" DO ") != std::string::npos;
    if (line.find("*UND*") != std::string::npos || !defined) continue;
    std::istringstream is(line);
    std::vector<std::string> f;
    std::string w;
    while (is >> w) f.push_back(w);
    if (f.size() < 7) continue;
    const std::string& node = f[f.size() - 2];
    const std::string& sym = f.back();
    if (node == sym) continue;  // the version node definition itself
    if (!all_nodes && node.rfind("RDMACM", 0) != 0) continue;
    out.insert({node, sym});
  }
  return out;
}

SymSet from_map(const std::string& path) { return rnic::test::version_map_symbols(path); }

std::string diff(const SymSet& a, const SymSet& b) {
  std::string o;
  for (auto& e : a)
    if (!b.count(e)) o += "  " + e.first + " " + e.second + "\n";
  return o;
}

TEST(RdmacmAbi, ExportsEqualVersionScript) {
  SymSet lib = exported(RDMACM_LIB), map = from_map(RDMACM_MAP);
  ASSERT_EQ(map.size(), 68u) << "exports.map should list rdma-core 44's 68 functions";
  EXPECT_EQ(diff(lib, map), "") << "exported but not in exports.map";
  EXPECT_EQ(diff(map, lib), "") << "in exports.map but not exported";
}

TEST(RdmacmAbi, ExportsNothingElse) {
  // Every defined dynamic symbol is one of the 68 (plus the node definitions themselves).
  SymSet all = exported(RDMACM_LIB, true), map = from_map(RDMACM_MAP);
  std::string extra;
  for (auto& [node, sym] : all)
    if (!map.count({node, sym}) && node != sym) extra += "  " + node + " " + sym + "\n";
  EXPECT_EQ(extra, "");
}

TEST(RdmacmAbi, EqualsInstalledRdmaCore) {
  const std::string real = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";
  if (!std::ifstream(real).good()) GTEST_SKIP() << "rdma-core's librdmacm.so.1 not installed";
  SymSet theirs = exported(real), ours = exported(RDMACM_LIB);
  EXPECT_EQ(diff(theirs, ours), "") << "rdma-core exports these, we do not";
  EXPECT_EQ(diff(ours, theirs), "") << "we export these, rdma-core does not";
  int per_node[4] = {};
  for (auto& [node, sym] : ours)
    for (int i = 0; i < 4; ++i)
      if (node == "RDMACM_1." + std::to_string(i)) per_node[i]++;
  EXPECT_EQ(per_node[0], 62);
  EXPECT_EQ(per_node[1], 1);
  EXPECT_EQ(per_node[2], 2);
  EXPECT_EQ(per_node[3], 3);
}

TEST(RdmacmAbi, VersionNodesChain) {
  std::string v = run("readelf -V '" RDMACM_LIB "' 2>/dev/null");
  // Version definitions: each node names its parent (1.3 -> 1.2 -> 1.1 -> 1.0).
  for (const char* pair : {"RDMACM_1.1.*\\n.*Parent 1: RDMACM_1.0", "RDMACM_1.2.*\\n.*Parent 1: RDMACM_1.1",
                           "RDMACM_1.3.*\\n.*Parent 1: RDMACM_1.2"})
    EXPECT_TRUE(std::regex_search(v, std::regex(pair))) << pair << "\n" << v;
}

TEST(RdmacmAbi, LinksOurVerbsAndNoEngine) {
  std::string d = run("readelf -d '" RDMACM_LIB "' 2>/dev/null");
  EXPECT_NE(d.find("[libibverbs.so.1]"), std::string::npos);
  EXPECT_NE(d.find("[librdmacm.so.1]"), std::string::npos) << "SONAME";
  EXPECT_NE(d.find("BIND_NOW"), std::string::npos);
  // No engine code inside: emu's classes would show up as local symbols of rnic::emu.
  std::string syms = run("nm -C '" RDMACM_LIB "' 2>/dev/null");
  EXPECT_EQ(syms.find("rnic::emu::"), std::string::npos) << "librdmacm.so.1 contains emu code";
  EXPECT_EQ(syms.find("rnic::cm::"), std::string::npos) << "librdmacm.so.1 contains the CM agent";
}

}  // namespace
