// Google Benchmark of the CRC-32 implementations behind the ICRC (zlib, ISA-L, own
// slicing-by-8, own PCLMULQDQ and AVX-512 VPCLMULQDQ folding) at 64 B, 1 KiB and 4 KiB, plus the full ICRC (fast form and datagram form)
// with the default implementation. Run: icrc_bench --benchmark_repetitions=5
// --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <vector>

#include "wire/icrc.h"
#include "wire/packet.h"

namespace rnic::wire {
namespace {

std::vector<uint8_t> data(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

void BM_Crc32(benchmark::State& state, Crc32Impl impl) {
  if (!crc32_impl_available(impl)) {
    state.SkipWithError("implementation not built");
    return;
  }
  auto d = data(static_cast<size_t>(state.range(0)));
  uint32_t crc = 0;
  for (auto _ : state) {
    crc = crc32_update(impl, crc, d);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK_CAPTURE(BM_Crc32, zlib, Crc32Impl::kZlib)->Arg(64)->Arg(1024)->Arg(4096);
BENCHMARK_CAPTURE(BM_Crc32, isal, Crc32Impl::kIsal)->Arg(64)->Arg(1024)->Arg(4096);
BENCHMARK_CAPTURE(BM_Crc32, slice8, Crc32Impl::kSlice8)->Arg(64)->Arg(1024)->Arg(4096);
BENCHMARK_CAPTURE(BM_Crc32, pclmul, Crc32Impl::kPclmul)->Arg(64)->Arg(1024)->Arg(4096);
BENCHMARK_CAPTURE(BM_Crc32, vpclmul, Crc32Impl::kVpclmul)->Arg(64)->Arg(1024)->Arg(4096);

// Full ICRC of a RoCE packet whose UDP payload is range(0) bytes (BTH..pad, no ICRC),
// from socket metadata (the send/receive hot path).
void BM_IcrcFastForm(benchmark::State& state) {
  IpUdpMeta m;
  m.src[0] = 10;
  m.dst[0] = 10;
  m.dst[3] = 2;
  m.src_port = 0xc000;
  auto d = data(static_cast<size_t>(state.range(0)));
  d[1] = 0;  // TVer 0
  for (auto _ : state) {
    uint32_t c = icrc_compute(m, d);
    benchmark::DoNotOptimize(c);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  state.SetLabel(crc32_impl_name(crc32_default_impl()));
}
BENCHMARK(BM_IcrcFastForm)->Arg(16)->Arg(108)->Arg(220)->Arg(1024)->Arg(4096);

// Full ICRC over an IPv4 datagram of range(0) bytes of RoCE (pcap/tests path).
void BM_IcrcDatagram(benchmark::State& state) {
  IpUdpMeta m;
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  size_t payload = static_cast<size_t>(state.range(0)) - kBthBytes - kIcrcBytes;
  auto pl = data(payload);
  std::vector<uint8_t> buf(payload + 128);
  size_t n = build_ip_datagram(buf, f, pl, m);
  std::span<const uint8_t> ip(buf.data(), n);
  for (auto _ : state) {
    bool ok = icrc_check(ip);
    benchmark::DoNotOptimize(ok);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_IcrcDatagram)->Arg(64)->Arg(1024)->Arg(4096);

}  // namespace
}  // namespace rnic::wire

BENCHMARK_MAIN();
