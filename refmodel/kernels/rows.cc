// y = x w^T for a few rows of x: the weight products of a decode step, on the CPU's cores.
//
// x [M, K] (M = the step's tokens: 1 at batch 1, a few more at small batch or in a
// speculative verify), w [N, K] stored output-major as ggml/llama.cpp store it, so each output
// is a dot product over one contiguous row of w and every core streams its own contiguous block
// of rows: the weight is read once, front to back, at the speed of memory. y [M, N].
//
// Work: the N output rows are cut into chunks of CHUNK rows taken from a shared counter by the
// calling thread and by tasks scheduled on XLA's own intra-op thread pool (the FFI's
// ThreadPool context), so the kernel uses the cores XLA uses and never oversubscribes them. A
// task that starts after every chunk is taken finds none and returns.
//
// Inner loop: R rows of w against B <= 4 rows of x (R = 4 for B <= 2, else 2), R + B loads
// per R x B fused multiply-adds, at least 8 independent accumulators; more than four rows of
// x re-read the same block of w from L1 (`chunk`, below). refmodel/kernels/rows.py says which
// rows go here (2-16) and which stay XLA's, with the measurements behind it. Vectors are GCC vector extensions of the widest
// native width (the same idiom as microbench/native.py's STREAM kernels); -march=native picks
// AVX-512, AVX2 or SSE at build time, and -ffp-contract=fast makes each `a += v * x` one FMA.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(__AVX512F__)
constexpr int64_t VL = 16;  // float32 lanes of the widest native vector
#elif defined(__AVX__)
constexpr int64_t VL = 8;
#else
constexpr int64_t VL = 4;
#endif
typedef float vec __attribute__((vector_size(4 * VL), aligned(4)));  // unaligned loads allowed

constexpr int64_t CHUNK = 16;  // output rows per unit of work
constexpr int MB = 4;          // rows of x per pass over the chunk's rows of w
constexpr int64_t KB = 1024;   // inputs per block of K: MB rows of x in 16 KiB of L1

static inline float hsum(vec v) {
  float s = 0.0f;
  for (int64_t i = 0; i < VL; i++) s += v[i];
  return s;
}

// Rows n0 .. n0 + R of w against rows m0 .. m0 + B of x (B <= MB): R x B dot products, each
// with U partial sums so that at least 8 independent FMA chains hide the FMA latency (two
// FMA units x four cycles) even for one row of x. `len` inputs from x and w (a block of K;
// rows are `ld` apart); the sums are added to y. `next`: R rows of w to prefetch meanwhile.
template <int R, int B>
static void tile(const float* x, const float* w, float* y, int64_t len, int64_t ld, int64_t N,
                 int64_t n0, int64_t m0, const float* next = nullptr) {
  constexpr int U = (R * B >= 8) ? 1 : (R * B >= 4 ? 2 : 4);
  const int64_t kv = len / (VL * U) * (VL * U);
  vec acc[R][B][U];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++)
      for (int u = 0; u < U; u++) acc[r][b][u] = vec{};
  const float* wr[R];
  for (int r = 0; r < R; r++) wr[r] = w + (n0 + r) * ld;
  for (int64_t k = 0; k < kv; k += VL * U) {
    for (int u = 0; u < U; u++) {
      vec wv[R];
      for (int r = 0; r < R; r++) wv[r] = *(const vec*)(wr[r] + k + u * VL);
      if (next && u == 0 && (k & 15) == 0)
        for (int r = 0; r < R; r++) __builtin_prefetch(next + r * ld + k);
      for (int b = 0; b < B; b++) {
        const vec xv = *(const vec*)(x + (m0 + b) * ld + k + u * VL);
        for (int r = 0; r < R; r++) acc[r][b][u] += wv[r] * xv;
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) {
      vec a = acc[r][b][0];
      for (int u = 1; u < U; u++) a += acc[r][b][u];
      float s = hsum(a);
      for (int64_t k = kv; k < len; k++) s += wr[r][k] * x[(m0 + b) * ld + k];
      y[(m0 + b) * N + n0 + r] += s;
    }
}

// Four rows of w (n .. n + 4) against rows m0 .. m0 + B of x: one tile of 4 x B for one or
// two rows of x, two tiles of 2 x B for three or four (at most 8 accumulators of AVX2's 16
// registers); fewer than four rows left: one row at a time.
template <int B>
static void group(const float* x, const float* w, float* y, int64_t len, int64_t ld, int64_t N,
                  int64_t n, int64_t rows, int64_t m0, const float* prefetch) {
  if (rows < 4) {
    for (int64_t r = 0; r < rows; r++) tile<1, B>(x, w, y, len, ld, N, n + r, m0);
  } else if (B <= 2) {
    tile<4, B>(x, w, y, len, ld, N, n, m0, prefetch);
  } else {
    tile<2, B>(x, w, y, len, ld, N, n, m0, prefetch);
    tile<2, B>(x, w, y, len, ld, N, n + 2, m0, prefetch ? prefetch + 2 * ld : nullptr);
  }
}

// One chunk of output rows for every row of x. K in blocks of KB inputs; in each block, four
// rows of w at a time against every row of x, MB rows of x per pass: the four rows' block
// (16 KiB) comes from memory for the first pass and from L1 for the next, and the block of x
// (M x KB floats) stays in L1/L2 for the whole chunk, so the memory stream never waits long.
static void chunk(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N,
                  int64_t c) {
  const int64_t n0 = c * CHUNK, n1 = std::min(N, n0 + CHUNK);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = n0; n < n1; n++) y[m * N + n] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t len = std::min(KB, K - k0);
    for (int64_t n = n0; n < n1; n += 4) {
      const int64_t rows = std::min<int64_t>(4, n1 - n);
      // while the first pass computes on these four rows, prefetch the next four (M > 2:
      // enough work per byte for the stream to stall without it)
      const float* pf = (M > 2 && n + 8 <= n1) ? w + (n + 4) * K + k0 : nullptr;
      for (int64_t m0 = 0; m0 < M; m0 += MB) {
        switch (std::min<int64_t>(MB, M - m0)) {
          case 4: group<4>(x + k0, w + k0, y, len, K, N, n, rows, m0, m0 ? nullptr : pf); break;
          case 3: group<3>(x + k0, w + k0, y, len, K, N, n, rows, m0, m0 ? nullptr : pf); break;
          case 2: group<2>(x + k0, w + k0, y, len, K, N, n, rows, m0, m0 ? nullptr : pf); break;
          default: group<1>(x + k0, w + k0, y, len, K, N, n, rows, m0, m0 ? nullptr : pf); break;
        }
      }
    }
  }
}

struct Counter {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

static ffi::Error Rows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("rows: x [M, K] and w [N, K] with one K");
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  const int64_t chunks = (N + CHUNK - 1) / CHUNK;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  auto counter = std::make_shared<Counter>();
  auto work = [=](Counter* s) {
    for (int64_t c; (c = s->next.fetch_add(1)) < chunks;) {
      chunk(xp, wp, yp, M, K, N, c);
      s->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks) - 1;
  for (int64_t t = 0; t < helpers; t++) pool.Schedule([counter, work] { work(counter.get()); });
  work(counter.get());
  while (counter->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsF32, Rows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [N, K]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N]
);
