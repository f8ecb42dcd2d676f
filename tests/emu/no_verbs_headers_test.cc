// tests/emu/no_verbs_headers_test.cc: the build check that emu/ (and wire/) never include
// rdma-core's verbs headers (<infiniband/...>, <rdma/...>): every source file is scanned
// for such #include lines. emu keeps its own mirrored types (emu/objects/types.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>

#ifndef SOFTRNIC_SOURCE_ROOT
#error "SOFTRNIC_SOURCE_ROOT must be defined by the build"
#endif

namespace {

namespace fs = std::filesystem;

// True for `#include <infiniband/...>` / `# include "rdma/..."` (any spacing).
bool includes_verbs(const std::string& line) {
  size_t i = line.find_first_not_of(" \t");
  if (i == std::string::npos || line[i] != '#') return false;
  i = line.find_first_not_of(" \t", i + 1);
  if (i == std::string::npos || line.compare(i, 7, "include") != 0) return false;
  i = line.find_first_not_of(" \t", i + 7);
  if (i == std::string::npos || (line[i] != '<' && line[i] != '"')) return false;
  return line.compare(i + 1, 11, "infiniband/") == 0 || line.compare(i + 1, 5, "rdma/") == 0;
}

std::vector<std::string> offenders(const fs::path& dir, int* scanned) {
  std::vector<std::string> bad;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".hpp" && ext != ".cpp" && ext != ".c") continue;
    ++*scanned;
    std::ifstream f(e.path());
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
      ++n;
      if (includes_verbs(line)) bad.push_back(e.path().string() + ":" + std::to_string(n));
    }
  }
  return bad;
}

TEST(NoVerbsHeaders, EmuSourcesDoNotIncludeVerbsHeaders) {
  int scanned = 0;
  auto bad = offenders(fs::path(SOFTRNIC_SOURCE_ROOT) / "emu", &scanned);
  EXPECT_GT(scanned, 10);
  EXPECT_TRUE(bad.empty()) << bad.size() << " include(s), first: " << (bad.empty() ? "" : bad[0]);
}

TEST(NoVerbsHeaders, WireSourcesDoNotIncludeVerbsHeaders) {
  int scanned = 0;
  auto bad = offenders(fs::path(SOFTRNIC_SOURCE_ROOT) / "wire", &scanned);
  EXPECT_GT(scanned, 3);
  EXPECT_TRUE(bad.empty()) << bad.size() << " include(s), first: " << (bad.empty() ? "" : bad[0]);
}

TEST(NoVerbsHeaders, DetectorCatchesAnInclude) {
  // The scanner really fires: a temporary tree with one offending file.
  fs::path tmp = fs::temp_directory_path() / ("softrnic_nvh_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::ofstream(tmp / "x.h") << "// ok <infiniband/verbs.h> in a comment\n"
                                "#include <infiniband/verbs.h>\n"
                                "  #  include \"rdma/rdma_cma.h\"\n"
                                "#include <infiniband_not/x.h>\n";
  int scanned = 0;
  auto bad = offenders(tmp, &scanned);
  fs::remove_all(tmp);
  EXPECT_EQ(scanned, 1);
  EXPECT_EQ(bad.size(), 2u);
}

}  // namespace
