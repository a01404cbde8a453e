// y = x w: the weight products of a model's step, on the CPU's cores; built for the few rows of
// a decode step, and a GEMM for the many of a prefill.
//
// x [M, n_in] (M = the step's tokens: 1 at batch 1, a few more at small batch or in a
// speculative verify, the prompt's tokens in a prefill; n_in inputs, n_out outputs: panels.h's
// names). w [n_in, n_out] stored in panels, wp [n_out / PANEL, n_in, PANEL]: PANEL = 32 outputs
// side by side for every input k, each panel contiguous (the layout of a BLAS GEMM's packed B
// operand, kept for good instead of packed per call). A panel is read once, front to back, and
// each 128-byte row of it meets M inputs: y[m, panel] += x[m, k] * wp[panel, k, :], x[m, k]
// broadcast to every lane, so the M x PANEL outputs stay in registers over all the inputs and
// no horizontal sum is ever needed (a weight stored as [n_out, n_in] rows needs one per output
// and per row of x). y [M, n_out]; outputs past n_out in the last panel are zero weights.
//
// Work: the panels are cut into SHARES blocks per thread, taken from a shared counter by the
// calling thread and by tasks scheduled on XLA's own intra-op thread pool (common.h's
// parallel_for), so the kernel uses the cores XLA uses and never oversubscribes them.
//
// Inner loop (`tile`, in panels.h with `panel` and `pack`, shared with attend_rows.cc): a block
// of rows of x against CV vectors of a panel row (AVX-512: the whole row, 2 vectors; AVX2 2 of
// 4, or the whole row for a block of 1-2 rows; SSE 2 of 8); per input k, CV loads of w, one
// broadcast of x per row, rows x CV fused multiply-adds. At most MB rows per pass, as many as
// the registers hold: 12 with AVX-512's 32 (24 accumulators, 2 weight vectors, a broadcast;
// fewer rows leave a core with full 512-bit FMAs idle), 6 with 16 (12, 2 and 1: the 6 x 16 of
// BLIS's Haswell kernel). More rows re-read the panel from L2, which holds it (n_in x 128
// bytes). Every line of the weight row PF bytes ahead is prefetched into L2 (a non-temporal
// hint, or none, leaves 1 row far below the memory's speed). With 1-6 rows, 2 or 4 panels are
// read side by side (`streams` in panels.h) and from 7 rows of float32 weights the first pass
// over a panel reads its inputs in 4 parts side by side (`KSPLIT`): more reads in flight per
// core. x's inputs are broadcast by load (`bcast`, common.h), not through port 5, which
// Intel's FMAs use. Panels of 32 outputs: 48 or 64 are no better and leave more zero padding.
//
// `python -m microbench decode` times the kernel against XLA's products and the memory's read
// speed (figures/decode.md). refmodel/kernels/rows.py's `Panels` sends every `x @ w` of a model
// here. Vectors are GCC vector extensions of the widest native width (the idiom of
// microbench/roofs/native.py's STREAM kernels); -march=native picks AVX-512, AVX2 or SSE at build
// time; -ffp-contract=fast makes `a += v * x` one FMA.
#include "panels.h"

constexpr int64_t SHARES = 4;  // blocks of work per thread: a late or slowed thread is covered

// The product on the calling thread and XLA's pool: blocks of whole panels.
template <typename T>
static void run(ffi::ThreadPool& pool, const float* x, const T* wp, const float* scale,
                float* yp, int64_t M, int64_t n_in, int64_t n_out, int64_t panels) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t side = streams(M);  // blocks of whole groups of `side` panels
  const int64_t per = std::max<int64_t>(1, panels / (SHARES * threads * side)) * side;
  const int64_t blocks = (panels + per - 1) / per;
  auto xs = std::make_shared<std::vector<float>>(M * n_in);
  pack(x, xs->data(), M, n_in);
  const float* xp = xs->data();
  parallel_for(pool, blocks, [=](int64_t c) {
    panel_range(xp, wp, scale, yp, M, n_in, n_out, c * per, std::min(panels, (c + 1) * per));
  });
}

// w in panels [*stack, n_out / PANEL, n_in, PANEL] (stack: 0 or 1 leading axes) against x
// [M, n_in], y [M, n_out].
template <typename W>
static bool shapes_ok(const W& w, ffi::Span<const int64_t> xd, ffi::Span<const int64_t> yd,
                      size_t stack = 0) {
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 3 + stack || yd.size() != 2) return false;
  const int64_t n = wd[stack], k = wd[stack + 1], p = wd[stack + 2];
  return p == PANEL && xd[1] == k && yd[0] == xd[0] && yd[1] <= n * PANEL &&
         yd[1] > (n - 1) * PANEL;
}

static ffi::Error Rows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> y) {
  if (!shapes_ok(w, x.dimensions(), y->dimensions()))
    return ffi::Error::InvalidArgument(
        "rows: x [M, n_in], w in panels [ceil(n_out / 32), n_in, 32] with one n_in, "
        "y [M, n_out]");
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
        "rows_int8: x [M, n_in], w int8 in panels [ceil(n_out / 32), n_in, 32] with one n_in, "
        "scale [n_out], y [M, n_out]");
  const auto xd = x.dimensions();
  run(pool, x.typed_data(), w.typed_data(), scale.typed_data(), y->typed_data(), xd[0], xd[1],
      y->dimensions()[1], w.dimensions()[0]);
  return ffi::Error::Success();
}

// The same products with w one of a stack, w_all [E, n_out / PANEL, n_in, PANEL] (a MoE
// layer's experts) and e = index[] (clamped to [0, E)): the kernel reads matrix e where it
// lies. Indexing the stack in XLA first (w_all[e]) copies the matrix before every product:
// three passes over its bytes instead of one.
static int64_t which(ffi::Buffer<ffi::S32>& index, int64_t E) {
  return std::clamp<int64_t>(index.typed_data()[0], 0, E - 1);
}

static ffi::Error RowsAt(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                         ffi::Buffer<ffi::S32> index, ffi::ResultBuffer<ffi::F32> y) {
  if (!shapes_ok(w, x.dimensions(), y->dimensions(), 1) || index.element_count() != 1)
    return ffi::Error::InvalidArgument(
        "rows_at: x [M, n_in], w in panels [E, ceil(n_out / 32), n_in, 32] with one n_in, "
        "index [], y [M, n_out]");
  const auto xd = x.dimensions(), wd = w.dimensions();
  const int64_t e = which(index, wd[0]);
  run(pool, x.typed_data(), w.typed_data() + e * wd[1] * wd[2] * PANEL, nullptr, y->typed_data(),
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
        "rows_at_int8: x [M, n_in], w int8 in panels [E, ceil(n_out / 32), n_in, 32] with one "
        "n_in, scale [E, n_out], index [], y [M, n_out]");
  const auto xd = x.dimensions();
  const int64_t e = which(index, wd[0]);
  run(pool, x.typed_data(), w.typed_data() + e * wd[1] * wd[2] * PANEL,
      scale.typed_data() + e * sd[1], y->typed_data(), xd[0], xd[1], y->dimensions()[1], wd[1]);
  return ffi::Error::Success();
}

// A grouped product (a MoE layer's experts; `jax.lax.ragged_dot`'s contract): x [M, n_in] holds
// the rows of E groups one after another, sizes[e] of group e (in order; rows past their sum
// are not any group's and get zeros), and group e's rows run against matrix e of the stack
// w_all [E, n_out / PANEL, n_in, PANEL]. Every group's blocks of panels are jobs of one
// parallel region, so each matrix with rows is read once, whatever its rows, and one with none
// not at all. (A loop of `RowsAt` over tiles of a fixed number of rows would read an expert
// once per tile.)
template <typename T>
static void run_groups(ffi::ThreadPool& pool, const float* x, const T* w_all, const float* scale,
                       const int32_t* sizes, float* yp, int64_t M, int64_t n_in, int64_t n_out,
                       int64_t E, int64_t panels) {
  struct Job {
    int64_t e, m0, rows, lo, hi;
  };
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  auto xs = std::make_shared<std::vector<float>>(M * n_in);
  auto jobs = std::make_shared<std::vector<Job>>();
  int64_t m0 = 0;
  for (int64_t e = 0; e < E && m0 < M; e++) {
    const int64_t rows = std::min<int64_t>(std::max<int32_t>(sizes[e], 0), M - m0);
    if (rows == 0) continue;
    pack(x + m0 * n_in, xs->data() + m0 * n_in, rows, n_in);  // as `run` packs its rows
    const int64_t side = streams(rows);
    const int64_t per = std::max<int64_t>(1, panels / (SHARES * threads * side)) * side;
    for (int64_t lo = 0; lo < panels; lo += per)
      jobs->push_back({e, m0, rows, lo, std::min(panels, lo + per)});
    m0 += rows;
  }
  std::fill(yp + m0 * n_out, yp + M * n_out, 0.0f);  // rows of no group
  const float* xp = xs->data();
  const int64_t stride = panels * n_in * PANEL;
  parallel_for(pool, int64_t(jobs->size()), [=](int64_t j) {
    const Job& b = (*jobs)[j];
    panel_range(xp + b.m0 * n_in, w_all + b.e * stride, scale ? scale + b.e * n_out : nullptr,
                yp + b.m0 * n_out, b.rows, n_in, n_out, b.lo, b.hi);
  });
}

static ffi::Error RowsGroups(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::S32> sizes,
                             ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (!shapes_ok(w, xd, y->dimensions(), 1) || sizes.dimensions().size() != 1 ||
      sizes.dimensions()[0] != wd[0])
    return ffi::Error::InvalidArgument(
        "rows_groups: x [M, n_in], w in panels [E, ceil(n_out / 32), n_in, 32] with one n_in, "
        "sizes [E], y [M, n_out]");
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
        "rows_groups_int8: x [M, n_in], w int8 in panels [E, ceil(n_out / 32), n_in, 32] with "
        "one n_in, scale [E, n_out], sizes [E], y [M, n_out]");
  run_groups(pool, x.typed_data(), w.typed_data(), scale.typed_data(), sizes.typed_data(),
             y->typed_data(), xd[0], xd[1], y->dimensions()[1], wd[0], wd[1]);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsF32, Rows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [n_out / 32, n_in, 32]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsI8, RowsInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // w [n_out / 32, n_in, 32], int8
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [n_out]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsAtF32, RowsAt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_all [E, n_out / 32, n_in, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // index []
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsAtI8, RowsAtInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // int8 [E, n_out / 32, n_in, 32]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [E, n_out]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // index []
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsGroupsF32, RowsGroups,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_all [E, n_out / 32, n_in, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // sizes [E]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsGroupsI8, RowsGroupsInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // int8 [E, n_out / 32, n_in, 32]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [E, n_out]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // sizes [E]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);
