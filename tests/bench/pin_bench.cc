// Google Benchmark of shadow pinning (issue 10 item 2, emu/objects/pin.h): the cost of
// reg_mr + dereg_mr with a shadow pin (move the pages to a memfd and back: two copies, a
// maps read, a few mmaps) against a direct pin (the range check only), at 4 KiB..16 MiB; and
// the data path: a guarded 4 KiB / 64 KiB copy through the device view against the same copy
// at the application's address (it must stay the same memcpy).
// Run: pin_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "emu/objects/device.h"

namespace rnic::emu {
namespace {

struct Dev {
  std::shared_ptr<Device> dev;
  std::shared_ptr<Pd> pd;
  explicit Dev(PinMode pin) {
    DeviceConfig cfg;
    cfg.ip = "127.0.0.1";
    cfg.netdev_mtu = 1500;
    cfg.pin = pin;
    dev = *Device::open(cfg);
    pd = *dev->alloc_pd();
  }
};

uint8_t* pages(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(p, 1, n);  // resident, as a buffer in use is
  return static_cast<uint8_t*>(p);
}

void BM_RegDereg(benchmark::State& state, PinMode pin) {
  Dev d(pin);
  const size_t n = static_cast<size_t>(state.range(0));
  uint8_t* buf = pages(n);
  const auto a = reinterpret_cast<uint64_t>(buf);
  for (auto _ : state) {
    auto mr = d.dev->reg_mr(d.pd, a, n, a, kAccessLocalWrite | kAccessRemoteRead);
    if (!mr) state.SkipWithError("reg_mr failed");
    benchmark::DoNotOptimize((*mr)->shadowed());
    (void)d.dev->dereg_mr(*mr);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  munmap(buf, n);
}

// 16 guarded copies of range(0) bytes out of a registered 1 MiB buffer (as a READ response
// gathers), through MrView::translate: the device view (shadow) or the host address (direct).
void BM_CopyOut(benchmark::State& state, PinMode pin) {
  Dev d(pin);
  constexpr size_t kBuf = 1 << 20;
  const size_t n = static_cast<size_t>(state.range(0));
  uint8_t* buf = pages(kBuf);
  const auto a = reinterpret_cast<uint64_t>(buf);
  auto mr = *d.dev->reg_mr(d.pd, a, kBuf, a, kAccessLocalWrite | kAccessRemoteRead);
  const MrView v = mr->view();
  std::vector<uint8_t> own(16 * n);
  for (auto _ : state) {
    for (size_t i = 0; i < 16; ++i) {
      bool ok = d.dev->mem().read(v.translate(a + i * n), own.data() + i * n, n);
      benchmark::DoNotOptimize(ok);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 16 * state.range(0));
  (void)d.dev->dereg_mr(mr);
  munmap(buf, kBuf);
}

// Time: wall clock per reg+dereg; CPU: of the whole process (the moves may run on the mover).
BENCHMARK_CAPTURE(BM_RegDereg, shadow, PinMode::kShadow)
    ->Arg(4096)->Arg(65536)->Arg(1 << 20)->Arg(64 << 20)
    ->MeasureProcessCPUTime()->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_RegDereg, direct, PinMode::kDirect)
    ->Arg(4096)->Arg(65536)->Arg(1 << 20)->Arg(64 << 20)
    ->MeasureProcessCPUTime()->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CopyOut, shadow, PinMode::kShadow)->Arg(4096)->Arg(65536);
BENCHMARK_CAPTURE(BM_CopyOut, direct, PinMode::kDirect)->Arg(4096)->Arg(65536);

}  // namespace
}  // namespace rnic::emu

BENCHMARK_MAIN();
