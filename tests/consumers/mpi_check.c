/* mpi_check: a small MPI program for the consumer conformance tests (2 ranks or more).
 *  - ping-pong between ranks 0 and 1, 8 B to 1 MiB, every byte checked on both sides;
 *  - MPI_Allreduce (sum of 64-bit integers and doubles), checked against the formula;
 *  - one-sided: MPI_Put and MPI_Get in a fence epoch and MPI_Accumulate, checked.
 * Prints "mpi_check: OK" from rank 0 when everything matched, and per-size one-way times in
 * microseconds (`pingpong SIZE us`). Any mismatch prints what differed and exits 1. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

static void fail(const char* what, long a, long b) {
  fprintf(stderr, "mpi_check: rank %d: %s (%ld != %ld)\n", rank, what, a, b);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char pat(size_t i, int seed) { return (unsigned char)(i * 131u + (unsigned)seed * 7u + 1u); }

static void pingpong(size_t size, int iters) {
  unsigned char* buf = malloc(size);
  double t0 = 0;
  for (int it = -1; it < iters; it++) { /* it == -1: warm-up */
    if (it == 0) t0 = MPI_Wtime();
    if (rank == 0) {
      for (size_t i = 0; i < size; i++) buf[i] = pat(i, it);
      MPI_Send(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
      MPI_Recv(buf, (int)size, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (size_t i = 0; i < size; i++)
        if (buf[i] != (unsigned char)~pat(i, it)) fail("pong data", buf[i], (unsigned char)~pat(i, it));
    } else if (rank == 1) {
      MPI_Recv(buf, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (size_t i = 0; i < size; i++) {
        if (buf[i] != pat(i, it)) fail("ping data", buf[i], pat(i, it));
        buf[i] = (unsigned char)~buf[i];
      }
      MPI_Send(buf, (int)size, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    }
  }
  double us = (MPI_Wtime() - t0) / iters / 2 * 1e6;
  if (rank == 0) printf("pingpong %zu %.1f us\n", size, us);
  free(buf);
}

static void allreduce(void) {
  enum { N = 1000 };
  int64_t in[N], out[N];
  double din[N], dout[N];
  for (int i = 0; i < N; i++) {
    in[i] = (int64_t)i * (rank + 1);
    din[i] = 0.5 * i + rank;
  }
  MPI_Allreduce(in, out, N, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(din, dout, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int64_t rs = (int64_t)nranks * (nranks + 1) / 2;
  for (int i = 0; i < N; i++) {
    if (out[i] != (int64_t)i * rs) fail("allreduce int64", (long)out[i], (long)(i * rs));
    double want = 0.5 * i * nranks + (double)nranks * (nranks - 1) / 2;
    if (dout[i] != want) fail("allreduce double", (long)dout[i], (long)want);
  }
  if (rank == 0) printf("allreduce ok\n");
}

static void rma(void) {
  enum { N = 4096 };
  int64_t* base;
  MPI_Win win;
  MPI_Win_allocate(N * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  for (int i = 0; i < N; i++) base[i] = -1;
  int peer = (rank + 1) % nranks;
  int64_t src[N], got[N];
  for (int i = 0; i < N; i++) src[i] = ((int64_t)rank << 32) | i;
  MPI_Win_fence(0, win);
  MPI_Put(src, N, MPI_INT64_T, peer, 0, N, MPI_INT64_T, win);
  MPI_Win_fence(0, win);
  int from = (rank + nranks - 1) % nranks;
  for (int i = 0; i < N; i++)
    if (base[i] != (((int64_t)from << 32) | i)) fail("MPI_Put data", (long)base[i], (long)(((int64_t)from << 32) | i));
  MPI_Get(got, N, MPI_INT64_T, peer, 0, N, MPI_INT64_T, win);
  MPI_Win_fence(0, win);
  for (int i = 0; i < N; i++)
    if (got[i] != src[i]) fail("MPI_Get data", (long)got[i], (long)src[i]);
  int64_t one = 1;
  MPI_Accumulate(&one, 1, MPI_INT64_T, 0, 0, 1, MPI_INT64_T, MPI_SUM, win);
  MPI_Win_fence(0, win);
  if (rank == 0 && base[0] != (((int64_t)(nranks - 1) << 32) | 0) + nranks)
    fail("MPI_Accumulate", (long)base[0], (long)((((int64_t)(nranks - 1) << 32)) + nranks));
  MPI_Win_free(&win);
  if (rank == 0) printf("rma ok\n");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks < 2) {
    fprintf(stderr, "mpi_check: needs 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int do_rma = argc > 1 && strcmp(argv[1], "--rma") == 0;
  for (size_t s = 8; s <= (1u << 20); s *= 8) pingpong(s, s >= 65536 ? 20 : 200);
  pingpong(1u << 20, 20);
  allreduce();
  if (do_rma) rma();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_check: OK\n");
  MPI_Finalize();
  return 0;
}
