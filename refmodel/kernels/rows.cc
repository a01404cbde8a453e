// y = x w^T for a few rows of x: the weight products of a decode step, on the CPU's cores.
//
// x [M, K] (M = the step's tokens: 1 at batch 1, a few more at small batch or in a
// speculative verify), w [N, K] stored output-major as ggml/llama.cpp store it, so each output
// is a dot product over one contiguous row of w and every core streams its own contiguous block
// of rows: the weight is read once, front to back, at the speed of memory. y [M, N].
//
// Work: the N output rows are cut into SHARES blocks per thread (whole CHUNKs of 16 rows), taken
// from a shared counter by the calling thread and by tasks scheduled on XLA's own intra-op
// thread pool (the FFI's ThreadPool context), so the kernel uses the cores XLA uses and never
// oversubscribes them. A task that starts after every block is taken finds none and returns.
//
// Inner loop (`tile`): R rows of w against B rows of x over all of K, the R x B dot products in
// registers (R x B + R + 1 vectors: R = 4 for up to 4 rows of x, 3 for 5-8 with AVX-512's 32
// registers; 4 then 2 with 16), each with enough partial sums for 8 independent FMA chains.
// Rows of x past a pass (MB) re-read the chunk's 16 rows of w from L2.
//
// Measured on a 2-core Zen 4 (AVX-512), 113 chained products of llama-309m's shapes (1.10 GB),
// interleaved with the kernel this one replaced (K blocked by 1024, 2 rows of w per 4 of x, 16
// rows per unit of work), 2 / 4 / 8 / 16 rows: 46 / 54-61 / 75-79 / 114-117 ms before, 37-40 /
// 38-43 / 52-54 / 83-89 ms now. What did it: loaded vectors pinned in registers (`PIN`; GCC
// otherwise folds a load into every FMA: 4 rows on an L3-resident weight 63 -> 117 GFLOP/s),
// x packed so that a step's B vectors are adjacent (`pack`; measured only together with the
// pin), the next tile's rows prefetched into L2 (into L1 was 10-20% slower) and fewer, longer
// blocks per thread (8 rows: 54 -> 49 ms). refmodel/kernels/rows.py says
// which rows come here (2-16) and which stay XLA's. Vectors are GCC vector extensions of the
// widest native width (the idiom of microbench/native.py's STREAM kernels); -march=native
// picks AVX-512, AVX2 or SSE at build time; -ffp-contract=fast makes `a += v * x` one FMA.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(__AVX512F__)
constexpr int64_t VL = 16;  // float32 lanes of the widest native vector
constexpr int REGS = 32;    // vector registers
#elif defined(__AVX__)
constexpr int64_t VL = 8;
constexpr int REGS = 16;
#else
constexpr int64_t VL = 4;
constexpr int REGS = 16;
#endif
typedef float vec __attribute__((vector_size(4 * VL), aligned(4)));  // unaligned loads allowed

// Keep a loaded vector in a register: without it GCC 12 folds the loads of w and x into the
// FMAs, one load per FMA instead of one per R or B of them.
#if defined(__AVX512F__)
#define PIN(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define PIN(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define PIN(v) __asm__("" : "+w"(v))
#else
#define PIN(v) (void)0
#endif

constexpr int64_t CHUNK = 16;  // rows of w per group of passes; blocks of work are whole CHUNKs
constexpr int64_t SHARES = 4;  // blocks of work per thread: a late or slowed thread is covered
constexpr int MB = REGS >= 32 ? 8 : 4;  // rows of x per pass over a chunk of w

static inline float hsum(vec v) {
  float s = 0.0f;
  for (int64_t i = 0; i < VL; i++) s += v[i];
  return s;
}

// Rows n0 .. n0 + R of w against rows m0 .. m0 + B of x over all K inputs: R x B dot products
// in registers, each with U partial sums so that at least 8 independent FMA chains hide the
// FMA latency even for one row of x. Per step: R + B loads, R x B fused multiply-adds. x comes
// packed (`pack`): the B vectors a step needs are adjacent.
template <int R, int B>
static void tile(const float* xp, int64_t M, const float* w, float* y, int64_t K, int64_t N,
                 int64_t n0, int64_t m0) {
  constexpr int U = (R * B >= 8) ? 1 : (R * B >= 4 ? 2 : 4);
  const int64_t kv = K / (VL * U) * (VL * U);
  vec acc[R][B][U];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++)
      for (int u = 0; u < U; u++) acc[r][b][u] = vec{};
  const float* wr[R];
  for (int r = 0; r < R; r++) wr[r] = w + (n0 + r) * K;
  const bool ahead = n0 + 2 * R <= N;
  const float* xb = xp + m0 * VL;  // vector j of row m0 + b: xb[(j * M + b) * VL]
  for (int64_t k = 0; k < kv; k += VL * U) {
    for (int u = 0; u < U; u++) {
      vec wv[R];
      for (int r = 0; r < R; r++) {
        wv[r] = *(const vec*)(wr[r] + k + u * VL);
        PIN(wv[r]);
      }
      if (ahead)  // the next tile's rows, at the same offset, into L2 (into L1 was slower)
        for (int r = 0; r < R; r++) __builtin_prefetch(wr[r] + R * K + k + u * VL, 0, 2);
      const float* xv = xb + (k / VL + u) * M * VL;
      for (int b = 0; b < B; b++) {
        vec v = *(const vec*)(xv + b * VL);
        PIN(v);
        for (int r = 0; r < R; r++) acc[r][b][u] += wv[r] * v;
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) {
      vec a = acc[r][b][0];
      for (int u = 1; u < U; u++) a += acc[r][b][u];
      float s = hsum(a);
      for (int64_t k = kv; k < K; k++) s += wr[r][k] * xb[((k / VL) * M + b) * VL + k % VL];
      y[(m0 + b) * N + n0 + r] = s;
    }
}

// The rows of w a tile takes for B rows of x: R x B accumulators, R rows of w and one row of x
// must fit the registers.
template <int B>
constexpr int rows_for() {
  if (REGS >= 32) return B <= 4 ? 4 : 3;
  return B <= 2 ? 4 : 2;
}

template <int B>
static void pass(const float* x, int64_t M, const float* w, float* y, int64_t K, int64_t N,
                 int64_t n0, int64_t n1, int64_t m0) {
  constexpr int R = rows_for<B>();
  int64_t n = n0;
  for (; n + R <= n1; n += R) tile<R, B>(x, M, w, y, K, N, n, m0);
  for (; n < n1; n++) tile<1, B>(x, M, w, y, K, N, n, m0);
}

// Output rows n0 .. n1 for every row of x, CHUNK rows at a time, MB rows of x per pass over
// those rows of w: the first pass reads them from memory, later ones (M > MB) from L2. (With
// MB = 4 the cases past 4 never run; they name pass<1> only so that no tile is instantiated
// that the registers cannot hold.)
static void chunk(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N,
                  int64_t n0, int64_t n1) {
  for (int64_t c0 = n0; c0 < n1; c0 += CHUNK) {
    const int64_t c1 = std::min(n1, c0 + CHUNK);
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      switch (std::min<int64_t>(MB, M - m0)) {
        case 1: pass<1>(x, M, w, y, K, N, c0, c1, m0); break;
        case 2: pass<2>(x, M, w, y, K, N, c0, c1, m0); break;
        case 3: pass<3>(x, M, w, y, K, N, c0, c1, m0); break;
        case 4: pass<4>(x, M, w, y, K, N, c0, c1, m0); break;
        case 5: pass<(MB >= 5 ? 5 : 1)>(x, M, w, y, K, N, c0, c1, m0); break;
        case 6: pass<(MB >= 6 ? 6 : 1)>(x, M, w, y, K, N, c0, c1, m0); break;
        case 7: pass<(MB >= 7 ? 7 : 1)>(x, M, w, y, K, N, c0, c1, m0); break;
        default: pass<MB>(x, M, w, y, K, N, c0, c1, m0); break;
      }
    }
  }
}

// x [M, K] packed as vectors [K / VL][M][VL] (zero-padded to whole vectors): the B vectors of
// x that a step of `tile` loads are adjacent. Rows of x K floats apart would otherwise fall in
// one L1 set when K x 4 bytes is a multiple of 4 KiB (every K of a transformer) and evict each
// other and the rows of w: 8 rows of x and 3 of w are 11 lines for 8 ways.
static void pack(const float* x, float* xp, int64_t M, int64_t K) {
  const int64_t kv = (K + VL - 1) / VL;
  for (int64_t j = 0; j < kv; j++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t l = 0; l < VL; l++) {
        const int64_t k = j * VL + l;
        xp[(j * M + m) * VL + l] = k < K ? x[m * K + k] : 0.0f;
      }
}

struct Work {  // shared by the calling thread and the tasks it schedules
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::vector<float> packed;
};

static ffi::Error Rows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("rows: x [M, K] and w [N, K] with one K");
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  // SHARES contiguous blocks of rows per thread, whole CHUNKs (fewer, longer streams than
  // CHUNK-row blocks: 8 rows 54 -> 49 ms on the Zen 4; a prefetch past a block's end is wasted)
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t share = (N / (SHARES * threads) + CHUNK - 1) / CHUNK * CHUNK;
  const int64_t rows = std::max<int64_t>(CHUNK, share);
  const int64_t blocks = (N + rows - 1) / rows;
  auto state = std::make_shared<Work>();
  state->packed.resize((K + VL - 1) / VL * VL * M);
  pack(x.typed_data(), state->packed.data(), M, K);
  const float* xp = state->packed.data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  auto work = [=](Work* s) {
    for (int64_t c; (c = s->next.fetch_add(1)) < blocks;) {
      chunk(xp, wp, yp, M, K, N, c * rows, std::min(N, (c + 1) * rows));
      s->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(threads, blocks) - 1;
  for (int64_t t = 0; t < helpers; t++) pool.Schedule([state, work] { work(state.get()); });
  work(state.get());
  while (state->done.load(std::memory_order_acquire) < blocks) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsF32, Rows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [N, K]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N]
);
