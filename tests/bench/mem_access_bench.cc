// Google Benchmark of the access paths to registered memory (issue 10): raw memcpy
// (DirectMemAccess) vs SafeMemAccess guarded (sigsetjmp + memcpy) vs SafeMemAccess process_vm
// (process_vm_readv/writev on our own pid), at 64 B, 4 KiB and 64 KiB, one call per copy and
// batched (16 segments per call), plus the AccessGate enter/leave a key lookup adds per
// access. Run: mem_access_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "emu/objects/memory.h"
#include "emu/objects/mr.h"

namespace rnic::emu {
namespace {

constexpr int kSegs = 16;

std::unique_ptr<MemAccess> make(int kind) {
  if (kind == 0) return std::make_unique<DirectMemAccess>();
  return std::make_unique<SafeMemAccess>(kind == 1 ? SafeMemAccess::Mode::kGuarded
                                                   : SafeMemAccess::Mode::kProcessVm);
}

// 16 copies of range(0) bytes each, one call per copy. read = registered -> engine buffer.
void BM_Single(benchmark::State& state, int kind, bool write) {
  auto m = make(kind);
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> reg(n * kSegs, 1), own(n * kSegs, 2);
  for (auto _ : state) {
    for (int i = 0; i < kSegs; ++i) {
      uint64_t a = reinterpret_cast<uint64_t>(reg.data() + i * n);
      bool ok = write ? m->write(a, own.data() + i * n, n) : m->read(a, own.data() + i * n, n);
      benchmark::DoNotOptimize(ok);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kSegs * state.range(0));
}

// The same 16 copies as one readv/writev call.
void BM_Batched(benchmark::State& state, int kind, bool write) {
  auto m = make(kind);
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> reg(n * kSegs, 1), own(n * kSegs, 2);
  MemSeg segs[kSegs];
  for (int i = 0; i < kSegs; ++i)
    segs[i] = {reinterpret_cast<uint64_t>(reg.data() + i * n), own.data() + i * n, n};
  for (auto _ : state) {
    bool ok = write ? m->writev(segs, kSegs) : m->readv(segs, kSegs);
    benchmark::DoNotOptimize(ok);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kSegs * state.range(0));
}

#define MEM_BENCH(fn, name, kind, write) \
  BENCHMARK_CAPTURE(fn, name, kind, write)->Arg(64)->Arg(4096)->Arg(65536)
MEM_BENCH(BM_Single, memcpy_read, 0, false);
MEM_BENCH(BM_Single, guarded_read, 1, false);
MEM_BENCH(BM_Single, process_vm_read, 2, false);
MEM_BENCH(BM_Single, memcpy_write, 0, true);
MEM_BENCH(BM_Single, guarded_write, 1, true);
MEM_BENCH(BM_Single, process_vm_write, 2, true);
MEM_BENCH(BM_Batched, guarded_readv, 1, false);
MEM_BENCH(BM_Batched, process_vm_readv, 2, false);
MEM_BENCH(BM_Batched, guarded_writev, 1, true);
MEM_BENCH(BM_Batched, process_vm_writev, 2, true);

// 64-bit fetch-and-add: raw vs guarded.
void BM_Faa(benchmark::State& state, int kind) {
  auto m = make(kind);
  alignas(8) uint64_t v = 0;
  uint64_t o = 0;
  for (auto _ : state) {
    bool ok = m->atomic_faa64(reinterpret_cast<uint64_t>(&v), 1, &o);
    benchmark::DoNotOptimize(ok);
  }
}
BENCHMARK_CAPTURE(BM_Faa, raw, 0);
BENCHMARK_CAPTURE(BM_Faa, guarded, 1);

// The quiescence cost per access: AccessGuard acquire + release on an MR's gate (one
// seq_cst increment, one decrement, a thread-local table entry).
void BM_GateEnterLeave(benchmark::State& state) {
  AccessGate gate;
  for (auto _ : state) {
    bool ok = gate.enter();
    benchmark::DoNotOptimize(ok);
    gate.leave();
  }
}
BENCHMARK(BM_GateEnterLeave);

// The same through AccessGuard (adds the owner shared_ptr copy RemoteTarget keeps).
void BM_GuardAcquireRelease(benchmark::State& state) {
  auto owner = std::make_shared<AccessGate>();
  for (auto _ : state) {
    AccessGuard g;
    bool ok = g.acquire(*owner, owner);
    benchmark::DoNotOptimize(ok);
  }
}
BENCHMARK(BM_GuardAcquireRelease);

}  // namespace
}  // namespace rnic::emu

BENCHMARK_MAIN();
