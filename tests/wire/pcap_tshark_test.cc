// pcap + tshark wire validation (suite slow): one packet of each opcode family is built with
// wire/packet, written with PcapWriter, decoded by tshark (fields must equal what was built,
// nothing malformed), and read back with PcapReader to verify every ICRC ourselves.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/pcap.h"

namespace rnic::wire {
namespace {

// Runs a shell command, returns its stdout (stderr discarded) and exit status.
std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> v;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) v.push_back(cur);
  if (!s.empty() && s.back() == sep) v.push_back("");
  return v;
}

// "0x0000abcd", "43981" or "" (absent) -> value; absent -> -1.
int64_t num(const std::string& s) {
  if (s.empty()) return -1;
  return int64_t(std::strtoull(s.c_str(), nullptr, 0));
}

// tshark prints FT_BYTES as hex without separators ("deadbeef").
int64_t bytes_be(const std::string& s) {
  if (s.empty()) return -1;
  std::string h;
  for (char c : s)
    if (std::isxdigit(static_cast<unsigned char>(c))) h += c;
  return int64_t(std::strtoull(h.c_str(), nullptr, 16));
}

struct Built {
  PacketFields f;
  size_t payload_len;
};

// Temp directory removed in TearDown, which gtest runs even after a failed assertion.
class PcapTsharkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/softrnic-pcap-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    int st = 0;
    run("tshark --version", &st);
    if (st != 0) GTEST_FAIL() << "tshark not installed (scripts/setup installs it)";
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

std::vector<Built> one_of_each_family() {
  std::vector<Built> v;
  auto add = [&](uint8_t opcode, size_t payload, auto&& set) {
    Built b{};
    b.f.opcode = opcode;
    b.f.dest_qp = 0x000100 + uint32_t(v.size());
    b.f.psn = (0xfffff0 + uint32_t(v.size())) & 0xffffff;  // crosses the 24-bit wrap
    b.payload_len = payload;
    set(b.f);
    v.push_back(b);
  };
  auto none = [](PacketFields&) {};
  add(op::kRcSendOnly, 13, [](PacketFields& f) { f.ack_req = true; f.se = true; });
  add(op::kRcSendOnlyWithImm, 8, [](PacketFields& f) { f.imm = 0xdeadbeef; });
  add(op::kRcSendOnlyWithInv, 4, [](PacketFields& f) { f.inv_rkey = 0x00c0ffee; });
  add(op::kRcRdmaWriteFirst, 256, [](PacketFields& f) {
    f.va = 0x00007f0012345000ull; f.rkey = 0x0000abcd; f.dma_len = 600; });
  add(op::kRcRdmaWriteMiddle, 256, none);
  add(op::kRcRdmaWriteLast, 88, [](PacketFields& f) { f.ack_req = true; });
  add(op::kRcRdmaWriteOnlyWithImm, 16, [](PacketFields& f) {
    f.va = 0x1000; f.rkey = 0x1234567; f.dma_len = 16; f.imm = 0x01020304; });
  add(op::kRcRdmaReadRequest, 0, [](PacketFields& f) {
    f.va = 0xffffffff00000000ull; f.rkey = 0x89abcdef; f.dma_len = 5000; });
  add(op::kRcRdmaReadResponseFirst, 256, [](PacketFields& f) { f.syndrome = 0x1f; f.msn = 7; });
  add(op::kRcRdmaReadResponseMiddle, 256, none);
  add(op::kRcRdmaReadResponseLast, 40, [](PacketFields& f) { f.syndrome = 0x1f; f.msn = 8; });
  add(op::kRcRdmaReadResponseOnly, 8, [](PacketFields& f) { f.syndrome = 0x1f; f.msn = 9; });
  add(op::kRcAcknowledge, 0, [](PacketFields& f) { f.syndrome = 0x1f; f.msn = 10; });        // ACK
  add(op::kRcAcknowledge, 0, [](PacketFields& f) { f.syndrome = 0x60; f.msn = 11; });        // NAK PSN seq
  add(op::kRcAcknowledge, 0, [](PacketFields& f) { f.syndrome = 0x62; f.msn = 12; });        // NAK rem access
  add(op::kRcAcknowledge, 0, [](PacketFields& f) { f.syndrome = 0x20 | 14; f.msn = 13; });   // RNR NAK
  add(op::kRcCompareSwap, 0, [](PacketFields& f) {
    f.va = 0x2000; f.rkey = 0x77; f.swap_add = 0x1111222233334444ull; f.compare = 0x5555666677778888ull; });
  add(op::kRcFetchAdd, 0, [](PacketFields& f) { f.va = 0x2008; f.rkey = 0x78; f.swap_add = 5; });
  add(op::kRcAtomicAcknowledge, 0, [](PacketFields& f) {
    f.syndrome = 0x1f; f.msn = 14; f.orig = 0x0123456789abcdefull; });
  add(op::kUcSendOnly, 5, none);
  add(op::kUcRdmaWriteOnly, 32, [](PacketFields& f) { f.va = 0x3000; f.rkey = 0x99; f.dma_len = 32; });
  add(op::kUdSendOnly, 64, [](PacketFields& f) { f.qkey = 0x11111111; f.src_qp = 0x000003; });
  add(op::kUdSendOnlyWithImm, 3, [](PacketFields& f) { f.qkey = 0x80010000; f.src_qp = 0x42; f.imm = 0xa5a5a5a5; });
  add(op::kCnp, 0, [](PacketFields& f) { f.becn = true; f.psn = 0; });
  return v;
}

TEST_F(PcapTsharkTest, EveryFamilyDecodesWithBuiltFieldsAndNothingMalformed) {
  const Endpoint src = *Endpoint::parse("127.0.0.2", 49152);
  const Endpoint dst = *Endpoint::parse("127.0.0.3", kRoceUdpPort);
  IpUdpMeta meta;
  std::memcpy(meta.src, src.addr, 4);
  std::memcpy(meta.dst, dst.addr, 4);
  meta.src_port = src.port;
  meta.dst_port = dst.port;

  const std::string path = dir_ + "/families-%p.pcap";
  int err = 0;
  auto w = PcapWriter::open(path, &err);
  ASSERT_NE(w, nullptr) << strerror(err);
  EXPECT_EQ(w->path().find("%p"), std::string::npos);
  EXPECT_NE(w->path().find(std::to_string(::getpid())), std::string::npos);

  auto pkts = one_of_each_family();
  std::vector<std::vector<uint8_t>> roce_bytes;
  for (size_t i = 0; i < pkts.size(); ++i) {
    std::vector<uint8_t> payload(pkts[i].payload_len);
    for (size_t k = 0; k < payload.size(); ++k) payload[k] = uint8_t(k + i);
    std::vector<uint8_t> buf(roce_size(pkts[i].f.opcode, payload.size()));
    ASSERT_GT(buf.size(), 0u) << "opcode " << int(pkts[i].f.opcode);
    size_t n = build_roce(buf, pkts[i].f, payload, meta);
    ASSERT_EQ(n, buf.size()) << "opcode " << int(pkts[i].f.opcode);
    ASSERT_TRUE(w->write_packet(src, dst, buf, /*ip_id=*/0));
    roce_bytes.push_back(std::move(buf));
  }
  EXPECT_EQ(w->packets(), pkts.size());
  const std::string file = w->path();
  w.reset();  // flush + close

  // 1. tshark decodes every field as built. RPC-over-RDMA's heuristic would otherwise claim
  //    SEND payloads; disabling the protocol (filter name rpcordma) keeps plain IB decoding.
  const char* fields[] = {
      "frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
      "infiniband.bth.a", "infiniband.bth.se", "infiniband.bth.padcnt", "infiniband.bth.p_key",
      "infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
      "infiniband.aeth.syndrome", "infiniband.aeth.msn", "infiniband.deth.q_key",
      "infiniband.deth.srcqp", "infiniband.immdt", "infiniband.ieth",
      "infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
      "infiniband.atomicacketh.origremdt", "ip.id", "ip.flags.df", "ip.checksum.status",
      "udp.srcport", "udp.dstport"};
  std::string cmd = "tshark -n -r '" + file +
                    "' --disable-protocol rpcordma -o ip.check_checksum:TRUE -T fields"
                    " -E separator=/t -E occurrence=f";
  for (const char* f : fields) cmd += std::string(" -e ") + f;
  int st = 0;
  std::string out = run(cmd, &st);
  ASSERT_EQ(st, 0) << cmd;
  auto lines = split(out, '\n');
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  ASSERT_EQ(lines.size(), pkts.size()) << out;
  for (size_t i = 0; i < pkts.size(); ++i) {
    const PacketFields& f = pkts[i].f;
    const OpcodeInfo& info = opcode_table()[f.opcode];
    auto c = split(lines[i], '\t');
    ASSERT_EQ(c.size(), std::size(fields)) << lines[i];
    std::map<std::string, std::string> m;
    for (size_t k = 0; k < c.size(); ++k) m[fields[k]] = c[k];
    SCOPED_TRACE(std::string(info.name) + ": " + lines[i]);
    EXPECT_EQ(num(m["frame.number"]), int64_t(i + 1));
    EXPECT_EQ(num(m["infiniband.bth.opcode"]), f.opcode);
    EXPECT_EQ(num(m["infiniband.bth.destqp"]), f.dest_qp);
    EXPECT_EQ(num(m["infiniband.bth.psn"]), f.psn);
    EXPECT_EQ(num(m["infiniband.bth.p_key"]), 0xffff);
    EXPECT_EQ(num(m["infiniband.bth.padcnt"]), int64_t((4 - pkts[i].payload_len % 4) % 4));
    EXPECT_EQ(num(m["infiniband.bth.a"]) == 1, f.ack_req);
    EXPECT_EQ(num(m["infiniband.bth.se"]) == 1, f.se);
    if (info.mask & kRethMask) {
      EXPECT_EQ(uint64_t(num(m["infiniband.reth.va"])), f.va);
      EXPECT_EQ(num(m["infiniband.reth.r_key"]), f.rkey);
      EXPECT_EQ(num(m["infiniband.reth.dmalen"]), f.dma_len);
    }
    if (info.mask & kAethMask) {
      EXPECT_EQ(num(m["infiniband.aeth.syndrome"]), f.syndrome);
      EXPECT_EQ(num(m["infiniband.aeth.msn"]), f.msn);
    } else {
      EXPECT_EQ(m["infiniband.aeth.syndrome"], "");
    }
    if (info.mask & kDethMask) {
      EXPECT_EQ(num(m["infiniband.deth.q_key"]), f.qkey);
      EXPECT_EQ(num(m["infiniband.deth.srcqp"]), f.src_qp);
    }
    if (info.mask & kImmMask) {
      EXPECT_EQ(bytes_be(m["infiniband.immdt"]), f.imm);
    }
    if (info.mask & kIethMask) {
      EXPECT_EQ(bytes_be(m["infiniband.ieth"]), f.inv_rkey);
    }
    if (info.mask & kAtmEthMask) {
      // Wireshark reports the AtomicETH VA and R_Key with the RETH field names.
      EXPECT_EQ(uint64_t(num(m["infiniband.reth.va"])), f.va);
      EXPECT_EQ(num(m["infiniband.reth.r_key"]), f.rkey);
      EXPECT_EQ(uint64_t(num(m["infiniband.atomiceth.swapdt"])), f.swap_add);
      EXPECT_EQ(uint64_t(num(m["infiniband.atomiceth.cmpdt"])), f.compare);
    }
    if (info.mask & kAtmAckMask) {
      EXPECT_EQ(uint64_t(num(m["infiniband.atomicacketh.origremdt"])), f.orig);
    }
    // Our IP/UDP framing: ID 0, DF, correct header checksum (status 1 = good), ports.
    EXPECT_EQ(num(m["ip.id"]), 0);
    EXPECT_EQ(num(m["ip.flags.df"]), 1);
    EXPECT_EQ(num(m["ip.checksum.status"]), 1);
    EXPECT_EQ(num(m["udp.srcport"]), src.port);
    EXPECT_EQ(num(m["udp.dstport"]), kRoceUdpPort);
  }

  // 2. Nothing malformed and every frame is InfiniBand.
  std::string bad = run("tshark -n -r '" + file + "' --disable-protocol rpcordma -Y '_ws.malformed || _ws.expert.severity >= error || !infiniband'", &st);
  EXPECT_EQ(st, 0);
  EXPECT_EQ(bad, "") << "tshark reports malformed/error/non-IB frames";

  // 3. tshark does not verify ICRC: read every frame back and check it ourselves.
  auto r = PcapReader::open(file, &err);
  ASSERT_NE(r, nullptr) << strerror(err);
  EXPECT_EQ(r->linktype(), kLinktypeEthernet);
  PcapFrame fr;
  size_t i = 0;
  while (r->next(fr)) {
    ASSERT_LT(i, pkts.size());
    std::span<const uint8_t> frame(fr.data);
    EXPECT_TRUE(icrc_check(frame.subspan(kEthHdrLen))) << "frame " << i + 1;
    PacketView pv;
    IpUdpMeta got;
    ASSERT_EQ(parse_ethernet_frame(frame, &pv, &got, /*check_icrc=*/true), ParseError::kOk)
        << "frame " << i + 1;
    EXPECT_EQ(pv.opcode, pkts[i].f.opcode);
    EXPECT_TRUE(std::equal(roce_bytes[i].begin(), roce_bytes[i].end(), pv.roce, pv.roce + pv.roce_len));
    EXPECT_EQ(got.ip_id, 0);
    EXPECT_TRUE(got.df);
    ++i;
  }
  EXPECT_EQ(i, pkts.size());
}

TEST_F(PcapTsharkTest, Ipv6FrameDecodesWithValidUdpChecksum) {
  const Endpoint src = *Endpoint::parse("fd00::2", 49153);
  const Endpoint dst = *Endpoint::parse("fd00::3", kRoceUdpPort);
  IpUdpMeta meta;
  meta.ipv6 = true;
  std::memcpy(meta.src, src.addr, 16);
  std::memcpy(meta.dst, dst.addr, 16);
  meta.src_port = src.port;
  meta.dst_port = dst.port;
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  f.dest_qp = 0x11;
  f.psn = 77;
  std::vector<uint8_t> payload(10, 0x5a), buf(roce_size(f.opcode, 10));
  ASSERT_EQ(build_roce(buf, f, payload, meta), buf.size());
  auto w = PcapWriter::open(dir_ + "/v6.pcap");
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->write_packet(src, dst, buf));
  w.reset();
  int st = 0;
  std::string out = run("tshark -n -r '" + dir_ + "/v6.pcap' --disable-protocol rpcordma"
                        " -o udp.check_checksum:TRUE -T fields -E separator=/t"
                        " -e udp.checksum.status -e infiniband.bth.opcode -e infiniband.bth.psn"
                        " -e ipv6.src", &st);
  ASSERT_EQ(st, 0);
  EXPECT_EQ(out, "1\t4\t77\tfd00::2\n");  // status 1 = checksum good
  auto r = PcapReader::open(dir_ + "/v6.pcap");
  ASSERT_NE(r, nullptr);
  PcapFrame fr;
  ASSERT_TRUE(r->next(fr));
  EXPECT_TRUE(icrc_check(std::span<const uint8_t>(fr.data).subspan(kEthHdrLen)));
}

// ATOMIC_WRITE (0x1D) and FLUSH (0x1C), IBA 1.5 Annex A19, and their answer, a zero-length
// READ RESPONSE ONLY: build -> parse -> tshark. Wireshark 4.0 (Debian 12's tshark 4.0.17)
// has no rows for 0x1C/0x1D: it decodes the BTH ("Opcode: Unknown (28/29)") and shows the rest
// of the packet as "Unknown/Vendor Specific Data" (infiniband.vendor), without marking it
// malformed. So tshark checks the BTH fields and that the opaque bytes are exactly ours
// (FETH, RETH, payload, pad, ICRC); our parser checks the extension-header fields.
TEST_F(PcapTsharkTest, AtomicWriteAndFlushBthDecodesExtensionHeadersOpaque) {
  const Endpoint src = *Endpoint::parse("127.0.0.2", 49152);
  const Endpoint dst = *Endpoint::parse("127.0.0.3", kRoceUdpPort);
  IpUdpMeta meta;
  std::memcpy(meta.src, src.addr, 4);
  std::memcpy(meta.dst, dst.addr, 4);
  meta.src_port = src.port;
  meta.dst_port = dst.port;
  std::vector<Built> pkts;
  auto add = [&](uint8_t opcode, size_t payload, auto&& set) {
    Built b{};
    b.f.opcode = opcode;
    b.f.dest_qp = 0x000200 + uint32_t(pkts.size());
    b.f.psn = 0x123450 + uint32_t(pkts.size());
    b.f.ack_req = true;
    b.payload_len = payload;
    set(b.f);
    pkts.push_back(b);
  };
  add(op::kRcAtomicWrite, 8, [](PacketFields& f) {
    f.va = 0x00007f0011223340ull; f.rkey = 0x1234; f.dma_len = 8; });
  add(op::kRcFlush, 0, [](PacketFields& f) {
    f.va = 0x00007f0011220000ull; f.rkey = 0x55; f.dma_len = 4096; f.flush_plt = 1;
    f.flush_sel = 0; });
  add(op::kRcFlush, 0, [](PacketFields& f) { f.rkey = 0x56; f.flush_plt = 2; f.flush_sel = 1; });
  add(op::kRcRdmaReadResponseOnly, 0, [](PacketFields& f) {
    f.ack_req = false; f.syndrome = 0x1f; f.msn = 3; });
  auto w = PcapWriter::open(dir_ + "/a19.pcap");
  ASSERT_NE(w, nullptr);
  std::vector<std::vector<uint8_t>> roce;
  for (size_t i = 0; i < pkts.size(); ++i) {
    std::vector<uint8_t> payload(pkts[i].payload_len);
    for (size_t k = 0; k < payload.size(); ++k) payload[k] = uint8_t(0xa0 + k);
    std::vector<uint8_t> buf(roce_size(pkts[i].f.opcode, payload.size()));
    ASSERT_EQ(build_roce(buf, pkts[i].f, payload, meta), buf.size()) << i;
    // parse: every field and the payload come back as built.
    PacketView pv;
    ASSERT_EQ(parse_roce(buf, &pv), ParseError::kOk) << i;
    PacketFields got = pv.fields();
    PacketFields want = pkts[i].f;
    want.payload = std::span<const uint8_t>(payload);
    want.pad_cnt = uint8_t((4 - payload.size() % 4) % 4);
    EXPECT_TRUE(got == want) << i;
    ASSERT_TRUE(w->write_packet(src, dst, buf, /*ip_id=*/0));
    roce.push_back(std::move(buf));
  }
  w.reset();
  // Header layout, written out from the spec: FLUSH = BTH | FETH | RETH, ATOMIC_WRITE = BTH |
  // RETH | 8 bytes.
  EXPECT_EQ(roce[0].size(), 12u + 16u + 8u + 4u);
  EXPECT_EQ(roce[1].size(), 12u + 4u + 16u + 4u);
  EXPECT_EQ(roce[1][15], 0x01);         // FETH: SEL 0 (range), PLT 1 (global)
  EXPECT_EQ(roce[2][15], 0x12);         // SEL 1 (whole MR), PLT 2 (persistent)
  EXPECT_EQ(load_be32(roce[1].data() + 16 + 12), 4096u);  // RETH DMA length after the FETH

  int st = 0;
  std::string out = run("tshark -n -r '" + dir_ + "/a19.pcap' --disable-protocol rpcordma"
                        " -T fields -E separator=/t -E occurrence=l -e infiniband.bth.opcode"
                        " -e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.bth.a"
                        " -e infiniband.vendor -e infiniband.aeth.syndrome -e infiniband.aeth.msn",
                        &st);
  ASSERT_EQ(st, 0);
  auto lines = split(out, '\n');
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  ASSERT_EQ(lines.size(), pkts.size()) << out;
  for (size_t i = 0; i < pkts.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    auto c = split(lines[i], '\t');
    ASSERT_EQ(c.size(), 7u);
    EXPECT_EQ(num(c[0]), pkts[i].f.opcode);
    EXPECT_EQ(num(c[1]), pkts[i].f.dest_qp);
    EXPECT_EQ(num(c[2]), pkts[i].f.psn);
    EXPECT_EQ(num(c[3]) == 1, pkts[i].f.ack_req);
    if (pkts[i].f.opcode == op::kRcRdmaReadResponseOnly) {
      EXPECT_EQ(num(c[5]), pkts[i].f.syndrome);
      EXPECT_EQ(num(c[6]), pkts[i].f.msn);
      continue;
    }
    std::string hex;
    static const char* d = "0123456789abcdef";
    for (size_t k = kBthBytes; k < roce[i].size(); ++k) {
      hex += d[roce[i][k] >> 4];
      hex += d[roce[i][k] & 15];
    }
    EXPECT_EQ(c[4], hex);
  }
  std::string bad = run("tshark -n -r '" + dir_ + "/a19.pcap' --disable-protocol rpcordma -Y "
                        "'_ws.malformed || _ws.expert.severity >= error || !infiniband'", &st);
  EXPECT_EQ(st, 0);
  EXPECT_EQ(bad, "");
}

// XRC (IBA 9.3.6, opcodes 0xA0..0xB7): requests carry the 4-byte XRCETH (reserved byte, XRC
// SRQ number) right after the BTH, before RETH / AtomicETH / ImmDt; responses carry none.
// build -> parse (every field back, bytes at the spec's offsets) -> tshark: opcode names, BTH
// fields, the bytes after the BTH exactly ours, nothing malformed.
TEST_F(PcapTsharkTest, XrcRequestsCarryXrcethAndDecode) {
  const Endpoint src = *Endpoint::parse("127.0.0.2", 49152);
  const Endpoint dst = *Endpoint::parse("127.0.0.3", kRoceUdpPort);
  IpUdpMeta meta;
  std::memcpy(meta.src, src.addr, 4);
  std::memcpy(meta.dst, dst.addr, 4);
  meta.src_port = src.port;
  meta.dst_port = dst.port;
  std::vector<Built> pkts;
  auto add = [&](uint8_t opcode, size_t payload, auto&& set) {
    Built b{};
    b.f.opcode = opcode;
    b.f.dest_qp = 0x000300 + uint32_t(pkts.size());
    b.f.psn = 0x00abc0 + uint32_t(pkts.size());
    b.payload_len = payload;
    set(b.f);
    pkts.push_back(b);
  };
  add(op::kXrcSendOnly, 13, [](PacketFields& f) { f.xrc_srqn = 0x00beef; f.ack_req = true; });
  add(op::kXrcSendOnlyWithImm, 8, [](PacketFields& f) { f.xrc_srqn = 0xfffffe; f.imm = 0xdeadbeef; });
  add(op::kXrcRdmaWriteFirst, 256, [](PacketFields& f) {
    f.xrc_srqn = 0x000001; f.va = 0x00007f0012345000ull; f.rkey = 0x0000abcd; f.dma_len = 600; });
  add(op::kXrcRdmaReadRequest, 0, [](PacketFields& f) {
    f.xrc_srqn = 0x123456; f.va = 0x4000; f.rkey = 0x89abcdef; f.dma_len = 5000; });
  add(op::kXrcCompareSwap, 0, [](PacketFields& f) {
    f.xrc_srqn = 0x000042; f.va = 0x2000; f.rkey = 0x77; f.swap_add = 0x1111222233334444ull;
    f.compare = 0x5555666677778888ull; });
  add(op::kXrcAcknowledge, 0, [](PacketFields& f) { f.syndrome = 0x1f; f.msn = 10; });
  add(op::kXrcAcknowledge, 0, [](PacketFields& f) { f.syndrome = 0x61; f.msn = 11; });  // NAK inv req
  add(op::kXrcRdmaReadResponseOnly, 8, [](PacketFields& f) { f.syndrome = 0x1f; f.msn = 12; });
  auto w = PcapWriter::open(dir_ + "/xrc.pcap");
  ASSERT_NE(w, nullptr);
  std::vector<std::vector<uint8_t>> roce;
  for (size_t i = 0; i < pkts.size(); ++i) {
    std::vector<uint8_t> payload(pkts[i].payload_len);
    for (size_t k = 0; k < payload.size(); ++k) payload[k] = uint8_t(0x30 + k);
    std::vector<uint8_t> buf(roce_size(pkts[i].f.opcode, payload.size()));
    ASSERT_EQ(build_roce(buf, pkts[i].f, payload, meta), buf.size()) << i;
    PacketView pv;
    ASSERT_EQ(parse_roce(buf, &pv), ParseError::kOk) << i;
    PacketFields got = pv.fields();
    PacketFields want = pkts[i].f;
    want.payload = std::span<const uint8_t>(payload);
    want.pad_cnt = uint8_t((4 - payload.size() % 4) % 4);
    EXPECT_TRUE(got == want) << i;
    EXPECT_EQ(got.xrc_srqn, pkts[i].f.xrc_srqn) << i;
    ASSERT_TRUE(w->write_packet(src, dst, buf, /*ip_id=*/0));
    roce.push_back(std::move(buf));
  }
  w.reset();
  // Layout from the spec: XRCETH = resv8 | SRQ number (24) at byte 12, then the RC headers.
  EXPECT_EQ(roce[0].size(), 12u + 4u + 16u + 4u);  // BTH, XRCETH, 13 bytes + 3 pad, ICRC
  EXPECT_EQ(roce[0][12], 0x00);
  EXPECT_EQ(load_be24(roce[0].data() + 13), 0x00beefu);
  EXPECT_EQ(load_be32(roce[1].data() + 16), 0xdeadbeefu);  // ImmDt after the XRCETH
  EXPECT_EQ(load_be32(roce[2].data() + 16 + 8), 0x0000abcdu);  // RETH R_Key after the XRCETH
  EXPECT_EQ(roce[4].size(), 12u + 4u + 28u + 4u);
  EXPECT_EQ(roce[5].size(), 12u + 4u + 4u);  // XRC ACK: BTH, AETH, ICRC (no XRCETH)

  // tshark (Wireshark 4.0, Debian 12): it names every XRC opcode ("Extended Reliable
  // Connection (XRC) - SEND Only (164)") and decodes the BTH, but has no XRCETH dissector:
  // everything after the BTH is "Unknown/Vendor Specific Data". So tshark checks the BTH
  // fields, the opcode names, and that those opaque bytes are exactly ours (XRCETH first, then
  // the RC headers, payload, pad, ICRC); our parser checked the fields above.
  int st = 0;
  std::string out = run("tshark -n -r '" + dir_ + "/xrc.pcap' --disable-protocol rpcordma"
                        " -T fields -E separator=/t -E occurrence=l -e infiniband.bth.opcode"
                        " -e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.bth.a"
                        " -e infiniband.vendor", &st);
  ASSERT_EQ(st, 0);
  auto lines = split(out, '\n');
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  ASSERT_EQ(lines.size(), pkts.size()) << out;
  for (size_t i = 0; i < pkts.size(); ++i) {
    const PacketFields& f = pkts[i].f;
    SCOPED_TRACE(std::string(opcode_info(f.opcode).name) + ": " + lines[i]);
    auto c = split(lines[i], '\t');
    ASSERT_EQ(c.size(), 5u);
    EXPECT_EQ(num(c[0]), f.opcode);
    EXPECT_EQ(num(c[1]), f.dest_qp);
    EXPECT_EQ(num(c[2]), f.psn);
    EXPECT_EQ(num(c[3]) == 1, f.ack_req);
    std::string hex;
    static const char* d = "0123456789abcdef";
    for (size_t k = kBthBytes; k < roce[i].size(); ++k) {
      hex += d[roce[i][k] >> 4];
      hex += d[roce[i][k] & 15];
    }
    EXPECT_EQ(c[4], hex);
  }
  std::string names = run("tshark -n -r '" + dir_ + "/xrc.pcap' --disable-protocol rpcordma -V"
                          " | grep -o 'Opcode: Extended Reliable Connection (XRC) - .*'", &st);
  auto nl = split(names, '\n');
  while (!nl.empty() && nl.back().empty()) nl.pop_back();
  ASSERT_EQ(nl.size(), pkts.size()) << names;
  for (size_t i = 0; i < pkts.size(); ++i)
    EXPECT_NE(nl[i].find("(" + std::to_string(pkts[i].f.opcode) + ")"), std::string::npos) << nl[i];
  std::string bad = run("tshark -n -r '" + dir_ + "/xrc.pcap' --disable-protocol rpcordma -Y "
                        "'_ws.malformed || _ws.expert.severity >= error || !infiniband'", &st);
  EXPECT_EQ(st, 0);
  EXPECT_EQ(bad, "");
}

TEST(PcapPathTest, PercentPExpandsToPid) {
  EXPECT_EQ(expand_pcap_path("/tmp/x-%p.pcap"), "/tmp/x-" + std::to_string(::getpid()) + ".pcap");
  EXPECT_EQ(expand_pcap_path("a%%p%"), "a%p%");
}

}  // namespace
}  // namespace rnic::wire
