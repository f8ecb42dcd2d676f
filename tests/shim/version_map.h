// tests/shim/version_map.h: the (version node, symbol) pairs a linker version script
// declares, for the ABI tests of libibverbs.so.1 (tests/shim/abi_test) and librdmacm.so.1
// (tests/rdmacm/abi_test). Comments are ignored; "local" is not a symbol.
#pragma once

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

namespace rnic::test {

using SymSet = std::set<std::pair<std::string, std::string>>;  // (node, symbol)

inline SymSet version_map_symbols(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = std::regex_replace(ss.str(), std::regex(R"(/\*[\s\S]*?\*/)"), "");
  SymSet out;
  std::regex node_re(R"(([A-Za-z0-9_.]+)\s*\{([^}]*)\})");
  for (std::sregex_iterator it(s.begin(), s.end(), node_re), end; it != end; ++it) {
    std::string node = (*it)[1];
    std::string body = (*it)[2];
    std::regex sym_re(R"(([A-Za-z0-9_]+)\s*;)");
    for (std::sregex_iterator jt(body.begin(), body.end(), sym_re); jt != end; ++jt) {
      std::string sym = (*jt)[1];
      if (sym != "local") out.insert({node, sym});
    }
  }
  return out;
}

}  // namespace rnic::test
