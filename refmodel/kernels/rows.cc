// y = x w: the weight products of a model's step, on the CPU's cores; built for the few rows of
// a decode step, and a GEMM for the many of a prefill.
//
// x [M, K] (M = the step's tokens: 1 at batch 1, a few more at small batch or in a
// speculative verify, the prompt's tokens in a prefill). w [K, N] stored in panels, wp [N / P,
// K, P]: P = 32 outputs side by side for every input k, each panel contiguous (the layout of a
// BLAS GEMM's packed B operand, kept for good instead of packed per call). A panel is read
// once, front to back, and each 128-byte row of it meets M inputs: y[m, panel] += x[m, k] *
// wp[panel, k, :], x[m, k] broadcast to every lane, so the M x P outputs stay in registers
// over all of K and no horizontal sum is ever needed. y [M, N]; outputs past N in the last
// panel are zero weights.
//
// Work: the panels are cut into SHARES blocks per thread, taken from a shared counter by the
// calling thread and by tasks scheduled on XLA's own intra-op thread pool (the FFI's ThreadPool
// context), so the kernel uses the cores XLA uses and never oversubscribes them. A task that
// starts after every block is taken finds none and returns.
//
// Inner loop (`tile`, in panels.h with `panel` and `pack`, shared with attend_rows.cc): B rows of x
// against CV vectors of a panel row (AVX-512: the whole row, 2 vectors; AVX2 2 of 4, or the whole
// row for a block of 1-2 rows; SSE 2 of 8), B x CV accumulators; per input k, CV loads of w, B
// broadcasts of x, B x CV fused multiply-adds. B <= MB rows per pass (12 with AVX-512's 32
// registers: 24 accumulators, 2 weight vectors, a broadcast; 6 with 16: 12, 2 and 1); more rows
// re-read the panel from L2, which holds it (K x 128 bytes). 12 rows instead of 8, on a 2-core Zen
// 5 (full 512-bit FMAs: 8 rows no longer filled them), 12 chained [768, 2048] products, 3
// alternations of the two builds, median of 15 calls each: 16 / 32 / 64 / 256 rows 133-164 /
// 177-196 / 218-238 / 275-283 GFLOP/s against 106-129 / 148-182 / 201-213 / 191-235; 8 rows the
// same. 6 rows instead of 4 with AVX2 (the 6 x 16 of BLIS's Haswell kernel), a 2-core Zen 3 (EPYC,
// KVM), 2026-12-04, 32 pairs of [1024, 4096] and [4096, 1024] products through JAX, best of 5
// calls, 6 rounds in 2 alternations of the builds: 512 / 64 / 32 / 6 rows 122-145 / 103-135 /
// 105-123 / 51-63 -> 139-176 / 137-160 / 107-137 / 60-71 GFLOP/s (numpy's 2048^3 GEMM 175-192); 8
// rows the same.
// Every line of the weight row PF bytes ahead is prefetched into L2. With 1-6 rows, 2 or 4
// panels are read side by side (`streams` in panels.h; with 3-6 rows of float32 weights each
// of the 2 in 2 parts, `KS3`), and from 7 rows of float32 weights the first pass over a panel
// reads its inputs in 4 parts side by side (`KSPLIT`): more reads in flight per core. x's
// inputs are broadcast by load (`bcast`, common.h), not through port 5, which Intel's FMAs
// use.
//
// On a 2-core Xeon (KVM, AMX), 2026-12-03, a harness of this tile (OpenMP threads, the same
// blocks) against the C read in alternation, 11 rounds: the prefetch of both lines of a row
// 4 KiB ahead (was one line, 2 KiB) and the broadcast loads took a product over 1 GiB at 1 / 2
// / 4 / 8 rows from 0.95 / 0.92 / 0.77 / 0.62 of the read to 0.97 / 1.00 / 0.83 / 0.72, and
// the GEMM of [512, 1024] x [1024, 4096] from 110 to 156 GFLOP/s (128 rows 108 -> 140).
// Tried there and dropped: 2 panels side by side for 7-12 rows in passes of 3, 4 or 6 (0.55-
// 0.66 at 8 rows, not better); prefetch distances 2, 8 and 16 KiB (8 rows: within 3% of 4).
//
// Measured on a 2-core Zen 4 (AVX-512), 2026-12-02. 113 chained products of llama-309m's
// shapes (1.10 GB), interleaved in one process (OpenMP threads, the same blocks of work) with
// the kernel this one replaced (the weight as [N, K] rows, R rows of w x B rows of x as dot
// products, a horizontal sum per output), median ratio new / old over 11 rounds at 1 / 2 / 3
// / 8 / 17 rows: 0.91 / 0.91 / 0.93 / 0.68 / 0.71 (8 rows: 32.9 ms, 134 GFLOP/s). With the
// weight in L2 (512 KiB per core), 1 / 4 / 8 / 16 rows: 74 / 180 / 204 / 202 GFLOP/s on both
// cores against 63 / 136 / 150 / 139 (numpy's 2048^3 GEMM: 185-189). Through JAX, chained as
// above, against XLA's GEMM over [K, N] in the same rounds: 128 rows 410 vs 534 ms, 512 rows
// 1642 vs 1725 ms. Tried and dropped: the prefetch off, or 64 or 128 inputs ahead, or as a
// non-temporal hint (up to 2x slower at 1 row), panels of 48 or 64 outputs (no better), 16 or
// 64 blocks per thread instead of 4 (8 rows 0.76 -> 0.82-0.85 of the old kernel's time), x
// blocks padded to 8 rows (1 row 4% slower than the old kernel: x no longer fit L1).
// refmodel/kernels/rows.py's `Panels` sends every `x @ w` of a model here. Vectors are GCC
// vector extensions of the widest native width (the idiom of microbench/native.py's STREAM
// kernels); -march=native picks AVX-512, AVX2 or SSE at build time; -ffp-contract=fast makes
// `a += v * x` one FMA.
#include "panels.h"

constexpr int64_t SHARES = 4;  // blocks of work per thread: a late or slowed thread is covered

// The product on the calling thread and XLA's pool: blocks of whole panels.
template <typename T>
static void run(ffi::ThreadPool& pool, const float* x, const T* wp, const float* scale,
                float* yp, int64_t M, int64_t K, int64_t N, int64_t panels) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t S = streams(M);  // blocks of whole groups of S panels
  const int64_t per = std::max<int64_t>(1, panels / (SHARES * threads * S)) * S;
  const int64_t blocks = (panels + per - 1) / per;
  auto xs = std::make_shared<std::vector<float>>(M * K);
  pack(x, xs->data(), M, K);
  const float* xp = xs->data();
  parallel_for(pool, blocks, [=](int64_t c) {
    panel_range(xp, wp, scale, yp, M, K, N, c * per, std::min(panels, (c + 1) * per));
  });
}

// w in panels [*stack, N / P, K, P] (stack: 0 or 1 leading axes) against x [M, K], y [M, N].
template <typename W>
static bool shapes_ok(const W& w, ffi::Span<const int64_t> xd, ffi::Span<const int64_t> yd,
                      size_t stack = 0) {
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 3 + stack || yd.size() != 2) return false;
  const int64_t n = wd[stack], k = wd[stack + 1], p = wd[stack + 2];
  return p == P && xd[1] == k && yd[0] == xd[0] && yd[1] <= n * P && yd[1] > (n - 1) * P;
}

static ffi::Error Rows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> y) {
  if (!shapes_ok(w, x.dimensions(), y->dimensions()))
    return ffi::Error::InvalidArgument(
        "rows: x [M, K], w in panels [ceil(N / 32), K, 32] with one K, y [M, N]");
  const auto xd = x.dimensions();
  run(pool, x.typed_data(), w.typed_data(), nullptr, y->typed_data(), xd[0], xd[1],
      y->dimensions()[1], w.dimensions()[0]);
  return ffi::Error::Success();
}

static ffi::Error RowsInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w,
                         ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> y) {
  if (!shapes_ok(w, x.dimensions(), y->dimensions()) || scale.dimensions().size() != 1 ||
      scale.dimensions()[0] != y->dimensions()[1])
    return ffi::Error::InvalidArgument(
        "rows_int8: x [M, K], w int8 in panels [ceil(N / 32), K, 32] with one K, scale [N], "
        "y [M, N]");
  const auto xd = x.dimensions();
  run(pool, x.typed_data(), w.typed_data(), scale.typed_data(), y->typed_data(), xd[0], xd[1],
      y->dimensions()[1], w.dimensions()[0]);
  return ffi::Error::Success();
}

// The same products with w one of a stack, w_all [E, N / P, K, P] (a MoE layer's experts)
// and e = index[] (clamped to [0, E)): the kernel reads matrix e where it lies. Indexing the
// stack in XLA first (w_all[e]) copies the matrix before every product: three passes over its
// bytes instead of one (the MoE decode step ran at 10-16 GB/s that way).
static int64_t which(ffi::Buffer<ffi::S32>& index, int64_t E) {
  return std::clamp<int64_t>(index.typed_data()[0], 0, E - 1);
}

static ffi::Error RowsAt(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                         ffi::Buffer<ffi::S32> index, ffi::ResultBuffer<ffi::F32> y) {
  if (!shapes_ok(w, x.dimensions(), y->dimensions(), 1) || index.element_count() != 1)
    return ffi::Error::InvalidArgument(
        "rows_at: x [M, K], w in panels [E, ceil(N / 32), K, 32] with one K, index [], "
        "y [M, N]");
  const auto xd = x.dimensions(), wd = w.dimensions();
  const int64_t e = which(index, wd[0]);
  run(pool, x.typed_data(), w.typed_data() + e * wd[1] * wd[2] * P, nullptr, y->typed_data(),
      xd[0], xd[1], y->dimensions()[1], wd[1]);
  return ffi::Error::Success();
}

static ffi::Error RowsAtInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::S8> w, ffi::Buffer<ffi::F32> scale,
                             ffi::Buffer<ffi::S32> index, ffi::ResultBuffer<ffi::F32> y) {
  const auto wd = w.dimensions(), sd = scale.dimensions();
  if (!shapes_ok(w, x.dimensions(), y->dimensions(), 1) || index.element_count() != 1 ||
      sd.size() != 2 || sd[0] != wd[0] || sd[1] != y->dimensions()[1])
    return ffi::Error::InvalidArgument(
        "rows_at_int8: x [M, K], w int8 in panels [E, ceil(N / 32), K, 32] with one K, scale "
        "[E, N], index [], y [M, N]");
  const auto xd = x.dimensions();
  const int64_t e = which(index, wd[0]);
  run(pool, x.typed_data(), w.typed_data() + e * wd[1] * wd[2] * P,
      scale.typed_data() + e * sd[1], y->typed_data(), xd[0], xd[1], y->dimensions()[1], wd[1]);
  return ffi::Error::Success();
}

// A grouped product (a MoE layer's experts; `jax.lax.ragged_dot`'s contract): x [R, K] holds
// the rows of E groups one after another, sizes[e] of group e (in order; rows past their sum
// are not any group's and get zeros), and group e's rows run against matrix e of the stack
// w_all [E, N / P, K, P]. Every group's blocks of panels are jobs of one parallel region, so
// each matrix with rows is read once, whatever its rows, and one with none not at all. (A
// loop of `RowsAt` over tiles of a fixed number of rows read an expert once per tile: at a
// decode step's few rows per expert, 1.4x the bytes of the experts touched.)
template <typename T>
static void run_groups(ffi::ThreadPool& pool, const float* x, const T* w_all, const float* scale,
                       const int32_t* sizes, float* yp, int64_t R, int64_t K, int64_t N,
                       int64_t E, int64_t panels) {
  struct Job {
    int64_t e, m0, M, lo, hi;
  };
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  auto xs = std::make_shared<std::vector<float>>(R * K);
  auto jobs = std::make_shared<std::vector<Job>>();
  int64_t m0 = 0;
  for (int64_t e = 0; e < E && m0 < R; e++) {
    const int64_t M = std::min<int64_t>(std::max<int32_t>(sizes[e], 0), R - m0);
    if (M == 0) continue;
    pack(x + m0 * K, xs->data() + m0 * K, M, K);  // each group's rows packed as `run` packs
    const int64_t S = streams(M);
    const int64_t per = std::max<int64_t>(1, panels / (SHARES * threads * S)) * S;
    for (int64_t lo = 0; lo < panels; lo += per)
      jobs->push_back({e, m0, M, lo, std::min(panels, lo + per)});
    m0 += M;
  }
  std::fill(yp + m0 * N, yp + R * N, 0.0f);  // rows of no group
  const float* xp = xs->data();
  const int64_t stride = panels * K * P;
  parallel_for(pool, int64_t(jobs->size()), [=](int64_t j) {
    const Job& b = (*jobs)[j];
    panel_range(xp + b.m0 * K, w_all + b.e * stride, scale ? scale + b.e * N : nullptr,
                yp + b.m0 * N, b.M, K, N, b.lo, b.hi);
  });
}

static ffi::Error RowsGroups(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::S32> sizes,
                             ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (!shapes_ok(w, xd, y->dimensions(), 1) || sizes.dimensions().size() != 1 ||
      sizes.dimensions()[0] != wd[0])
    return ffi::Error::InvalidArgument(
        "rows_groups: x [R, K], w in panels [E, ceil(N / 32), K, 32] with one K, sizes [E], "
        "y [R, N]");
  run_groups(pool, x.typed_data(), w.typed_data(), nullptr, sizes.typed_data(),
             y->typed_data(), xd[0], xd[1], y->dimensions()[1], wd[0], wd[1]);
  return ffi::Error::Success();
}

static ffi::Error RowsGroupsInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                 ffi::Buffer<ffi::S8> w, ffi::Buffer<ffi::F32> scale,
                                 ffi::Buffer<ffi::S32> sizes, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), sd = scale.dimensions();
  if (!shapes_ok(w, xd, y->dimensions(), 1) || sizes.dimensions().size() != 1 ||
      sizes.dimensions()[0] != wd[0] || sd.size() != 2 || sd[0] != wd[0] ||
      sd[1] != y->dimensions()[1])
    return ffi::Error::InvalidArgument(
        "rows_groups_int8: x [R, K], w int8 in panels [E, ceil(N / 32), K, 32] with one K, "
        "scale [E, N], sizes [E], y [R, N]");
  run_groups(pool, x.typed_data(), w.typed_data(), scale.typed_data(), sizes.typed_data(),
             y->typed_data(), xd[0], xd[1], y->dimensions()[1], wd[0], wd[1]);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsF32, Rows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [N / P, K, P]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsI8, RowsInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // w [N / P, K, P], int8
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [N]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsAtF32, RowsAt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_all [E, N / P, K, P]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // index []
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsAtI8, RowsAtInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // w_all [E, N / P, K, P], int8
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [E, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // index []
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsGroupsF32, RowsGroups,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_all [E, N / P, K, P]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // sizes [E]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [R, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsGroupsI8, RowsGroupsInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // w_all [E, N / P, K, P], int8
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [E, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // sizes [E]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [R, N]
);
