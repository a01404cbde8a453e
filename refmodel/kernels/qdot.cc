// y = x w with int8 or int4 weights and x rounded to int8 per block of 32 inputs: the integer
// dot products of llama.cpp's Q8_0 and Q4_0 (a block's 32 products summed in int32, then
// scaled by the block's two scales), in the weight layout an int8 dot instruction wants.
//
// x [M, n_in] float32 is rounded here, row by row: per block of QB = 32 inputs (the last one
// zero-padded to n_pad), s = max|x| / 127 and x_q = round(x / s), exactly as
// refmodel/quant.py's `round_activations`. The weights are stored unsigned, int8 w + 128 and
// int4 q + 8, because the instruction multiplies an unsigned byte by a signed one (x86's
// VPDPBUSD: per 32-bit lane, 4 unsigned bytes of one operand times 4 signed bytes of the
// other, summed into the lane); the offset comes back out as off * sum(x_q) over the block,
// one integer per row and block, subtracted before the block's sum is scaled.
//
// Layout (qdot.py packs it once at load time), PANEL = 32 outputs per panel as in rows.cc:
//   int8: wp [n_out / 32, n_pad / 4, 32, 4]: for each 4 inputs, the 32 outputs' 4 bytes side
//         by side, so one 32-bit lane holds one output's 4 inputs and 4 x's broadcast to every
//         lane meet them in one instruction; scale [n_out / 32 * 32], one per output.
//   int4: wp [n_out / 32, n_pad / 32, 576] bytes: per panel and block of 32 inputs, 4 rows of
//         [32 outputs, 4 bytes] (byte j of output o holds input 8c + j in its low nibble and
//         8c + 4 + j in its high one: one load, a mask and a shift give the two quads), then
//         the block's 32 float16 scales, one per output: Q4_0's numbers (4.5 bits per weight)
//         with each block's scales beside its weights, in the one stream the panel is read as
//         (in an array of their own they were a second stream per panel, not prefetched).
// Per block of 32 inputs and vector of outputs: 8 integer dot instructions, then one convert
// and one FMA into float accumulators. With AVX-512 VNNI or AVX-VNNI one instruction does 64
// (or 32) byte products; elsewhere `dpbusd` below computes the same with plain integer vector
// arithmetic (correct, several times slower: `int8_dot()` in qdot.py reports which).
//
// Work is split as in rows.cc: blocks of panels from a shared counter on XLA's pool; 1-3 rows
// read 4 or 2 panels side by side (more reads in flight per core), more rows pass over one
// panel in blocks of up to QMB rows (the panel stays in L2 between blocks). One call may take
// several weights of one x (`qrows_many`: q, k and v; gate and up): x is rounded once and
// every weight's panels come from the same counter, one parallel region instead of three.
#include <cmath>

#include "common.h"

constexpr int64_t QP = 32;   // outputs per panel
constexpr int64_t QB = 32;   // inputs per activation block (quant.ACT_BLOCK) and int4 group
constexpr int QNV = QP / VL;  // vectors of 32-bit lanes per panel quad
constexpr int QMB = REGS >= 32 ? 6 : 1;  // rows per pass: 2 x QNV x rows accumulators
// Bytes ahead of each panel read to prefetch: 8 KiB in flight per core, shared by the panels
// read side by side (a lone panel with only 2 KiB ahead, as 4 side by side take, read slower).
template <int SIDE>
constexpr int64_t QPF = 8192 / SIDE;
constexpr int64_t QBLOCK4 = 4 * 128 + 2 * QP;  // bytes of an int4 block: weights and scales
constexpr int64_t QSHARES = 4;  // blocks of work per thread

typedef uint32_t uvec __attribute__((vector_size(4 * VL), aligned(4)));

// acc + per lane the sum of its 4 unsigned bytes of w times the 4 signed bytes of x.
static inline ivec dpbusd(ivec acc, ivec w, ivec x) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  return (ivec)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)w, (__m512i)x);
#elif defined(__AVXVNNI__) && !defined(__AVX512F__)
  return (ivec)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)w, (__m256i)x);
#else
  for (int j = 0; j < 4; j++) {
    const ivec wj = (ivec)(((uvec)w >> (8 * j)) & 0xFF);
    const ivec xj = (x << (24 - 8 * j)) >> 24;  // arithmetic: sign-extended
    acc += wj * xj;
  }
  return acc;
#endif
}

static inline ivec iload(const uint8_t* p) { return *(const ivec*)p; }

// VL float16 numbers (IEEE half, as uint16) as floats: F16C's convert where there is one.
static inline float half_to_float(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const float f = e == 0    ? std::ldexp(float(m), -24)  // zero or subnormal
                  : e == 31 ? (m ? NAN : INFINITY)
                            : std::ldexp(float(m | 0x400), e - 25);
  return (h & 0x8000) ? -f : f;
}
static inline vec hload(const uint16_t* p) {
#if defined(__AVX512F__)
  return (vec)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__F16C__) && defined(__AVX__)
  return (vec)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
  vec v;
  for (int64_t l = 0; l < VL; l++) v[l] = half_to_float(p[l]);
  return v;
#endif
}
static inline ivec ibcast(const int8_t* p) {  // 4 bytes of x in every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return ivec{} + v;
}

// Lanes rounded to the nearest integer, ties to even (std::nearbyint, jnp.round).
static inline vec vrint(vec v) {
#if defined(__AVX512F__)
  return (vec)_mm512_roundscale_ps((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
  return (vec)_mm256_round_ps((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  for (int64_t l = 0; l < VL; l++) v[l] = std::nearbyint(v[l]);
  return v;
#endif
}

// One row of x rounded to int8 per block: xq [n_pad], sx [G], corr [G] = off * sum(xq).
// Vectors of VL lanes (a scalar loop took 4.5 us for 4096 inputs, a sixtieth of the down
// projection it feeds); the numbers are round_activations' own: x / s, ties to even.
static void round_row(const float* x, int64_t n_in, int64_t n_pad, int32_t off, int8_t* xq,
                      float* sx, int32_t* corr) {
  typedef int8_t bvec __attribute__((vector_size(VL), aligned(1)));
  constexpr int64_t NV = QB / VL;
  for (int64_t g = 0; g < n_pad / QB; g++) {
    const int64_t lo = g * QB, n = std::min<int64_t>(n_in - lo, QB);
    vec b[NV];  // the block, zero-padded past n_in
    if (n == QB) {
      for (int64_t v = 0; v < NV; v++) b[v] = *(const vec*)(x + lo + v * VL);
    } else {
      for (int64_t k = 0; k < QB; k++) b[k / VL][k % VL] = k < n ? x[lo + k] : 0.0f;
    }
    vec m = vec{};
    for (int64_t v = 0; v < NV; v++) {
      const vec a = b[v] < 0 ? -b[v] : b[v];
      m = a > m ? a : m;
    }
    const float amax = hmax(m);
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    ivec sum = ivec{};
    for (int64_t v = 0; v < NV; v++) {
      vec r = vrint(b[v] / s);
      r = r > 127.0f ? vec{} + 127.0f : r;
      r = r < -127.0f ? vec{} - 127.0f : r;
      const ivec q = __builtin_convertvector(r, ivec);
      *(bvec*)(xq + lo + v * VL) = __builtin_convertvector(q, bvec);
      sum += q;
    }
    sx[g] = s;
    corr[g] = off * hsum_int(sum);
  }
}

struct Rounded {  // x rounded: what every tile reads
  const int8_t* xq;
  const float* sx;
  const int32_t* corr;
  int64_t n_pad, G;
};

// Rows m0 .. m0 + ROWS against SIDE adjacent panels (from panel p), all inputs. INT4 picks the
// int4 layout (2 quads per 128 bytes, each block's float16 scales after its weights); int8 has
// one float32 scale per output (`scale`).
template <int ROWS, int SIDE, bool INT4>
static void qtile(const Rounded& r, int64_t m0, const uint8_t* wp, const float* scale,
                  int64_t p, float* y, int64_t n_out) {
  const int64_t G = r.G, stride = INT4 ? G * QBLOCK4 : r.n_pad * QP;  // bytes per panel
  const uint8_t* w0 = wp + p * stride;
  vec f[SIDE][ROWS][QNV];
  for (int s = 0; s < SIDE; s++)
    for (int b = 0; b < ROWS; b++)
      for (int v = 0; v < QNV; v++) f[s][b][v] = vec{};
  for (int64_t g = 0; g < G; g++) {
    ivec a[SIDE][ROWS][QNV];
    for (int b = 0; b < ROWS; b++) {
      const ivec c = ivec{} - r.corr[(m0 + b) * G + g];  // the offset's products, taken back
      for (int s = 0; s < SIDE; s++)
        for (int v = 0; v < QNV; v++) a[s][b][v] = c;
    }
    const int8_t* xg = r.xq + m0 * r.n_pad + g * QB;
    for (int t = 0; t < (INT4 ? 4 : 8); t++) {  // 128-byte rows of the panel in this block
      for (int s = 0; s < SIDE; s++) {
        const uint8_t* wt = w0 + s * stride + (INT4 ? g * QBLOCK4 : g * 8 * 128) + t * 128;
        __builtin_prefetch(wt + QPF<SIDE>, 0, 2);
        __builtin_prefetch(wt + QPF<SIDE> + 64, 0, 2);
        if (INT4 && t == 3) __builtin_prefetch(wt + QPF<SIDE> + 128, 0, 2);  // 9 lines a block
        for (int v = 0; v < QNV; v++) {
          const ivec raw = iload(wt + v * VL * 4);
          if constexpr (INT4) {
            const ivec lo = raw & 0x0F0F0F0F, hi = (ivec)(((uvec)raw >> 4) & 0x0F0F0F0F);
            for (int b = 0; b < ROWS; b++) {
              a[s][b][v] = dpbusd(a[s][b][v], lo, ibcast(xg + b * r.n_pad + 8 * t));
              a[s][b][v] = dpbusd(a[s][b][v], hi, ibcast(xg + b * r.n_pad + 8 * t + 4));
            }
          } else {
            for (int b = 0; b < ROWS; b++)
              a[s][b][v] = dpbusd(a[s][b][v], raw, ibcast(xg + b * r.n_pad + 4 * t));
          }
        }
      }
    }
    for (int s = 0; s < SIDE; s++)
      for (int b = 0; b < ROWS; b++) {
        const vec sx = bcast(r.sx[(m0 + b) * G + g]);
        for (int v = 0; v < QNV; v++) {
          vec sc = sx;
          if constexpr (INT4)
            sc *= hload(reinterpret_cast<const uint16_t*>(w0 + s * stride + g * QBLOCK4 + 512) +
                        v * VL);
          f[s][b][v] += __builtin_convertvector(a[s][b][v], vec) * sc;
        }
      }
  }
  for (int s = 0; s < SIDE; s++)
    for (int b = 0; b < ROWS; b++)
      for (int v = 0; v < QNV; v++) {
        const int64_t n = (p + s) * QP + v * VL;
        vec out = f[s][b][v];
        if constexpr (!INT4) out *= *(const vec*)(scale + n);
        float* yr = y + (m0 + b) * n_out + n;
        for (int64_t l = 0; l < std::min<int64_t>(VL, n_out - n); l++) yr[l] = out[l];
      }
}

template <int SIDE, bool INT4>
static void rows_pass(const Rounded& r, int64_t m0, int64_t rows, const uint8_t* wp,
                      const float* scale, int64_t p, float* y, int64_t n_out) {
  switch (rows) {
    case 1: qtile<1, SIDE, INT4>(r, m0, wp, scale, p, y, n_out); break;
    case 2: qtile<(QMB >= 2 ? 2 : 1), SIDE, INT4>(r, m0, wp, scale, p, y, n_out); break;
    case 3: qtile<(QMB >= 3 ? 3 : 1), SIDE, INT4>(r, m0, wp, scale, p, y, n_out); break;
    case 4: qtile<(QMB >= 4 && SIDE == 1 ? 4 : 1), SIDE, INT4>(r, m0, wp, scale, p, y, n_out);
      break;
    case 5: qtile<(QMB >= 5 && SIDE == 1 ? 5 : 1), SIDE, INT4>(r, m0, wp, scale, p, y, n_out);
      break;
    default:
      qtile<(QMB >= 6 && SIDE == 1 ? 6 : 1), SIDE, INT4>(r, m0, wp, scale, p, y, n_out);
      break;
  }
}

// Panels read side by side for M rows (all in one pass): 4 for one row, 2 for 2-3, else 1.
static int64_t qstreams(int64_t M) {
  if (QMB < 6) return 1;
  return M == 1 ? 4 : (M <= 3 ? 2 : 1);
}

template <bool INT4>
static void panel_range(const Rounded& r, int64_t M, const uint8_t* wp, const float* scale,
                        float* y, int64_t n_out, int64_t lo, int64_t hi) {
  const int64_t side = qstreams(M);
  int64_t p = lo;
  for (; side > 1 && p + side <= hi; p += side) {
    if (side == 4) rows_pass<4, INT4>(r, 0, M, wp, scale, p, y, n_out);
    else rows_pass<2, INT4>(r, 0, M, wp, scale, p, y, n_out);
  }
  for (; p < hi; p++)
    for (int64_t m0 = 0; m0 < M; m0 += QMB)
      rows_pass<1, INT4>(r, m0, std::min<int64_t>(QMB, M - m0), wp, scale, p, y, n_out);
}

// One weight of a call: its panels and scales, its output y [M, n_out].
struct QMat {
  const uint8_t* wp;
  const float* scale;  // int8's, per output; int4's sit in wp
  float* y;
  int64_t n_out, panels;
};

// x rounded once, then every matrix's panels in blocks from one shared counter: a layer's
// products that share their input (q, k and v; gate and up) run as one parallel region, and
// the small ones (k and v are a quarter of q under GQA) no longer wait alone for the pool.
template <bool INT4>
static void run(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t n_in, int64_t n_pad,
                const std::vector<QMat>& mats) {
  const int64_t G = n_pad / QB;
  std::vector<int8_t> xq(M * n_pad);
  std::vector<float> sx(M * G);
  std::vector<int32_t> corr(M * G);
  const int32_t off = INT4 ? 8 : 128;
  auto round = [&](int64_t m) {
    round_row(x + m * n_in, n_in, n_pad, off, &xq[m * n_pad], &sx[m * G], &corr[m * G]);
  };
  if (M * n_in < (1 << 16)) {
    for (int64_t m = 0; m < M; m++) round(m);
  } else {
    parallel_for(pool, M, round);
  }
  const Rounded r{xq.data(), sx.data(), corr.data(), n_pad, G};
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t side = qstreams(M);
  int64_t panels = 0;
  for (const QMat& a : mats) panels += a.panels;
  const int64_t per = std::max<int64_t>(1, panels / (QSHARES * threads * side)) * side;
  struct Task {
    int64_t mat, lo, hi;
  };
  std::vector<Task> tasks;  // blocks of `per` panels, none across two matrices
  for (int64_t i = 0; i < (int64_t)mats.size(); i++)
    for (int64_t lo = 0; lo < mats[i].panels; lo += per)
      tasks.push_back({i, lo, std::min(mats[i].panels, lo + per)});
  parallel_for(pool, tasks.size(), [&](int64_t c) {
    const Task& t = tasks[c];
    const QMat& a = mats[t.mat];
    panel_range<INT4>(r, M, a.wp, a.scale, a.y, a.n_out, t.lo, t.hi);
  });
}

// The shapes both take: x [M, n_in], w uint8 [panels, rows, row bytes] with n_pad = rows *
// inputs per row the inputs rounded up to a whole block, y [M, n_out] inside the panels.
static bool shapes_ok(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> wd,
                      ffi::Span<const int64_t> yd, int64_t row_bytes, int64_t per_row) {
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != row_bytes) return false;
  const int64_t n_pad = wd[1] * per_row;
  return yd[0] == xd[0] && yd[1] <= wd[0] * QP && yd[1] > (wd[0] - 1) * QP &&
         n_pad % QB == 0 && n_pad >= xd[1] && n_pad - xd[1] < QB;
}

// int8: w [ceil(n_out / 32), n_pad / 4, 128], scale f32 [ceil(n_out / 32) * 32].
static ffi::Error QRowsInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::U8> w, ffi::Buffer<ffi::F32> scale,
                            ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (!shapes_ok(xd, wd, yd, 128, 4) || scale.dimensions().size() != 1 ||
      scale.dimensions()[0] != wd[0] * QP)
    return ffi::Error::InvalidArgument(
        "qrows_int8: x [M, n_in], w uint8 [ceil(n_out / 32), n_pad / 4, 128] with n_pad = n_in "
        "rounded up to 32, scale [ceil(n_out / 32) * 32], y [M, n_out]");
  run<false>(pool, x.typed_data(), xd[0], xd[1], wd[1] * 4,
             {{w.typed_data(), scale.typed_data(), y->typed_data(), yd[1], wd[0]}});
  return ffi::Error::Success();
}

// int4: w [ceil(n_out / 32), n_pad / 32, 576], each block's scales in it.
static ffi::Error QRowsInt4(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (!shapes_ok(xd, wd, yd, QBLOCK4, QB))
    return ffi::Error::InvalidArgument(
        "qrows_int4: x [M, n_in], w uint8 [ceil(n_out / 32), n_pad / 32, 576] with n_pad = "
        "n_in rounded up to 32, y [M, n_out]");
  run<true>(pool, x.typed_data(), xd[0], xd[1], wd[1] * QB,
            {{w.typed_data(), nullptr, y->typed_data(), yd[1], wd[0]}});
  return ffi::Error::Success();
}

// Several weights of one format times the same x, in one call: weights w_0 .. w_{n-1} (then,
// int8, their scales s_0 .. s_{n-1}) as the single-weight calls take them, y_i [M, n_out_i].
template <bool INT4>
static ffi::Error QRowsManyImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const int64_t n = rets.size();
  const auto xd = x.dimensions();
  const char* what = INT4 ? "qrows_many_int4: x [M, n_in], weights w_i uint8 [ceil(n_i / 32), "
                            "n_pad / 32, 576], y_i [M, n_i]"
                          : "qrows_many_int8: x [M, n_in], weights w_i uint8 [ceil(n_i / 32), "
                            "n_pad / 4, 128], then their scales s_i [ceil(n_i / 32) * 32], y_i "
                            "[M, n_i]";
  if (n < 1 || (int64_t)args.size() != (INT4 ? n : 2 * n)) return ffi::Error::InvalidArgument(what);
  std::vector<QMat> mats;
  int64_t n_pad = -1;
  for (int64_t i = 0; i < n; i++) {
    auto w = args.get<ffi::Buffer<ffi::U8>>(i);
    auto y = rets.get<ffi::Buffer<ffi::F32>>(i);
    if (!w.has_value() || !y.has_value()) return ffi::Error::InvalidArgument(what);
    const auto wd = w->dimensions(), yd = (*y)->dimensions();
    const int64_t per_row = INT4 ? QB : 4;
    if (!shapes_ok(xd, wd, yd, INT4 ? QBLOCK4 : 128, per_row) ||
        (n_pad >= 0 && n_pad != wd[1] * per_row))
      return ffi::Error::InvalidArgument(what);
    n_pad = wd[1] * per_row;
    const float* scale = nullptr;
    if (!INT4) {
      auto s = args.get<ffi::Buffer<ffi::F32>>(n + i);
      if (!s.has_value() || s->dimensions().size() != 1 || s->dimensions()[0] != wd[0] * QP)
        return ffi::Error::InvalidArgument(what);
      scale = s->typed_data();
    }
    mats.push_back({w->typed_data(), scale, (*y)->typed_data(), yd[1], wd[0]});
  }
  run<INT4>(pool, x.typed_data(), xd[0], xd[1], n_pad, mats);
  return ffi::Error::Success();
}

static ffi::Error QRowsManyInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return QRowsManyImpl<false>(pool, x, args, rets);
}

static ffi::Error QRowsManyInt4(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return QRowsManyImpl<true>(pool, x, args, rets);
}

// Which int8 dot instruction this build uses (qdot.py's `int8_dot`): 2 AVX-512 VNNI,
// 1 AVX-VNNI, 0 none (the portable integer arithmetic).
extern "C" int refmodel_int8_dot() {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  return 2;
#elif defined(__AVXVNNI__) && !defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(QRowsI8, QRowsInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // w [n_out / 32, n_pad / 4, 128]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [n_out / 32 * 32]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(QRowsI4, QRowsInt4,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // w [n_out / 32, n_pad / 32, 576]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, n_out]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(QRowsManyI8, QRowsManyInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .RemainingArgs()               // w_0 .. w_{n-1}, s_0 .. s_{n-1}
                                  .RemainingRets()               // y_0 .. y_{n-1}
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(QRowsManyI4, QRowsManyInt4,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, n_in]
                                  .RemainingArgs()               // w_0 .. w_{n-1}
                                  .RemainingRets()               // y_0 .. y_{n-1}
);
