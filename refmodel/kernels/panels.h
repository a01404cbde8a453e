// The inner product of the weight kernels (rows.cc) and of prefill attention (attend_rows.cc):
// y [M, n_out] = x [M, n_in] times a matrix stored in panels [ceil(n_out / PANEL), n_in,
// PANEL], PANEL = 32 outputs side by side per input. `pack` lays x out in blocks of MB rows,
// each transposed ([n_in, rows]); `panel` computes one panel's PANEL outputs for every row of
// x; `tile` is its register-blocked inner loop. Why the layout: rows.cc's header.
//
// Names: M rows of x (the alphabet's M, refmodel/shapes.py), n_in inputs and n_out outputs of
// the product (no letter: they are D, F, N H, ... as the weight is); ROWS / rows the rows of x
// in one tile or block, SIDE / side the panels read side by side, SUMS the partial sums per
// output.
#pragma once

#include "common.h"

constexpr int64_t PANEL = 32;            // outputs per panel: rows.py's PANEL, the stored layout
constexpr int NV = PANEL / VL;           // vectors per panel row
constexpr int CV = NV < 2 ? NV : 2;      // of them per tile
constexpr int MB = REGS >= 32 ? 12 : 6;  // rows of x per pass over a panel
constexpr int64_t PF = 4096;             // bytes of the panel ahead to prefetch

// The weight's stored numbers: float32, or int8 with one float32 scale per output (y = scale
// times the sum over the int8 values, as refmodel/quant.py's "int8" format stores them).
// An int8 vector of VL lanes is converted to VL floats as it is loaded (AVX-512: one
// sign-extend and one convert per 16 weights), a quarter of the bytes for the same FMAs.
// (GCC 12 turns __builtin_convertvector from int8 into one scalar sign-extend per lane, so
// the x86 widths use the sign-extending loads' intrinsics.)
static inline vec load(const float* w) { return *(const vec*)w; }
static inline vec load(const int8_t* w) {
#if defined(__AVX512F__)
  return (vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)w)));
#elif defined(__AVX2__)
  return (vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)w)));
#else
  vec v;
  for (int64_t l = 0; l < VL; l++) v[l] = w[l];
  return v;
#endif
}

// Rows m0 .. m0 + ROWS of x against vectors c0 .. c0 + CV of the rows of SIDE adjacent panels
// (pw and the SIDE - 1 after it), over all n_in inputs. xb is x's block of rows m0 .. m0 +
// ROWS, transposed ([n_in, ROWS], `pack`): the ROWS inputs of a step are adjacent. SUMS partial
// sums per output so that at least 8 independent FMA chains hide the FMA latency even for one
// row of x. SIDE > 1 reads SIDE panels side by side, SIDE streams in flight per core
// (`streams`); KS > 1 reads one panel's inputs as KS parts side by side (k, k + n_in / KS,
// ...), KS streams into the same accumulators (`panel`'s first pass of 7 or more rows of
// float32 weights). `scale`: one per output (int8), or null.
template <int ROWS, int SIDE, typename T, int KS = 1, int CV = ::CV>
static void tile(const float* xb, int64_t m0, const T* pw, const float* scale, int c0,
                 int64_t n_in, float* y, int64_t n_out, int64_t n0) {
  constexpr int SUMS = (ROWS * CV * SIDE >= 8) ? 1 : (ROWS * CV * SIDE >= 4 ? 2 : 4);
  vec acc[SUMS][SIDE][ROWS][CV];
  for (int u = 0; u < SUMS; u++)
    for (int s = 0; s < SIDE; s++)
      for (int b = 0; b < ROWS; b++)
        for (int v = 0; v < CV; v++) acc[u][s][b][v] = vec{};
  const T* w = pw + c0 * VL;
  const int64_t kq = n_in / KS;  // inputs per part
  const int64_t ku = kq / SUMS * SUMS;
  for (int64_t k = 0; k < ku; k += SUMS) {
    for (int u = 0; u < SUMS; u++) {
      for (int q = 0; q < KS; q++) {
        const int64_t kk = q * kq + k + u;
        const float* xk = xb + kk * ROWS;
        for (int s = 0; s < SIDE; s++) {
          const T* wk = w + s * n_in * PANEL + kk * PANEL;
          // every line of the row PF bytes ahead (past the panel's end: the next panel)
          for (int64_t l = 0; l < int64_t(PANEL * sizeof(T)); l += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(wk) + PF + l, 0, 2);
          vec wv[CV];
          for (int v = 0; v < CV; v++) {
            wv[v] = load(wk + v * VL);
            PIN(wv[v]);
          }
          for (int b = 0; b < ROWS; b++) {
            const vec xv = bcast(xk[b]);
            for (int v = 0; v < CV; v++) acc[u][s][b][v] += xv * wv[v];
          }
        }
      }
    }
  }
  // the inputs outside the unrolled loop: each part's last kq - ku, then the last n_in - KS kq
  // (a loop, not a lambda: one capturing acc by reference kept it in memory, not registers)
  for (int q = 0; q <= KS; q++) {
    const int64_t lo = q < KS ? q * kq + ku : KS * kq, hi = q < KS ? (q + 1) * kq : n_in;
    for (int64_t k = lo; k < hi; k++)
      for (int s = 0; s < SIDE; s++)
        for (int b = 0; b < ROWS; b++)
          for (int v = 0; v < CV; v++)
            acc[0][s][b][v] +=
                bcast(xb[k * ROWS + b]) * load(w + s * n_in * PANEL + k * PANEL + v * VL);
  }
  for (int s = 0; s < SIDE; s++)
    for (int b = 0; b < ROWS; b++)
      for (int v = 0; v < CV; v++) {
        vec a = acc[0][s][b][v];
        for (int u = 1; u < SUMS; u++) a += acc[u][s][b][v];
        const int64_t n = n0 + s * PANEL + (c0 + v) * VL;
        float* yr = y + (m0 + b) * n_out + n;
        if (n + VL <= n_out) {
          if (scale) a *= *(const vec*)(scale + n);
          *(vec*)yr = a;
        } else {
          for (int64_t l = 0; l < n_out - n; l++) yr[l] = scale ? a[l] * scale[n + l] : a[l];
        }
      }
}

// Rows m0 .. m0 + rows of x (rows <= MB) against panel pw's vectors c0 .. c0 + CV: tile<rows, 1,
// T, KS>. (With MB = 6 the cases past 6 never run; they name tile<1> only so that no tile is
// instantiated that the registers cannot hold.)
template <int KS, typename T>
static void pass(int64_t rows, const float* xb, int64_t m0, const T* pw, const float* scale,
                 int c0, int64_t n_in, float* y, int64_t n_out, int64_t n0) {
  switch (rows) {
    case 1: tile<1, 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 2: tile<2, 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 3: tile<3, 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 4: tile<4, 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 5: tile<(MB >= 5 ? 5 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 6: tile<(MB >= 6 ? 6 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 7: tile<(MB >= 7 ? 7 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 8: tile<(MB >= 8 ? 8 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 9: tile<(MB >= 9 ? 9 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
    case 10:
      tile<(MB >= 10 ? 10 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0);
      break;
    case 11:
      tile<(MB >= 11 ? 11 : 1), 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0);
      break;
    default: tile<MB, 1, T, KS>(xb, m0, pw, scale, c0, n_in, y, n_out, n0); break;
  }
}

// Panel p for every row of x: MB rows of x per pass, CV vectors of the panel per tile. The
// first pass reads the panel from memory, later ones (more rows, other vectors) from L2, which
// holds it (n_in x 128 bytes). The first pass of 7 or more rows of float32 weights (one panel
// at a time: `streams`) reads its inputs as KSPLIT parts side by side: with one stream per core
// an Intel core computing this many rows ran short of reads in flight. int8 weights, whose
// tile is compute-bound from 4 rows, keep one part; a GEMM of hundreds of rows is the same
// either way (the later passes are most of it).
constexpr int KSPLIT = 4;

template <typename T>
static void panel(const float* xp, const T* wp, const float* scale, float* y, int64_t M,
                  int64_t n_in, int64_t n_out, int64_t p) {
  const T* pw = wp + p * n_in * PANEL;
  const int64_t n0 = p * PANEL;
  for (int c0 = 0; c0 < NV; c0 += CV) {
    if (n0 + c0 * VL >= n_out) break;  // vectors wholly past n_out: zero weights, no output
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t rows = std::min<int64_t>(MB, M - m0);
      const float* xb = xp + m0 * n_in;
      // AVX2 (16 registers, 4 vectors per panel row): a block of 1-2 rows (all of x, or the
      // rows past the passes of 6) takes the whole row in one pass. Two passes of 2 vectors
      // each would read every other line of the panel from memory and the rest from L2 or L3
      // (a panel of 4096 inputs is 512 KiB, a whole L2 on some cores).
      if constexpr (NV > CV && NV <= 4) {
        if (rows <= 2) {
          if (c0 > 0) continue;  // done in the first
          if (rows == 1) tile<1, 1, T, 1, NV>(xb, m0, pw, scale, 0, n_in, y, n_out, n0);
          else tile<2, 1, T, 1, NV>(xb, m0, pw, scale, 0, n_in, y, n_out, n0);
          continue;
        }
      }
      if constexpr (sizeof(T) == 4) {
        if (m0 == 0 && rows >= 7) {
          pass<KSPLIT>(rows, xb, m0, pw, scale, c0, n_in, y, n_out, n0);
          continue;
        }
      }
      pass<1>(rows, xb, m0, pw, scale, c0, n_in, y, n_out, n0);
    }
  }
}

// How many panels to read side by side for M rows of x: with AVX-512's 32 registers, 4 for 1-2
// rows (8-16 accumulators) and 2 for 3-6, when all rows fit one pass; else 1. With AVX2's 16,
// 2 for 1 row (2 x 4 accumulators, each panel's 4 weight vectors in turn). More streams per
// core keep more reads in flight: one panel at a time, a core's GEMV stays below the memory's
// speed.
static int64_t streams(int64_t M) {
  if (REGS < 32 || CV != NV) return NV == 4 && M == 1 ? 2 : 1;
  return M <= 2 ? 4 : (M <= 6 ? 2 : 1);
}

// Panels p .. p + SIDE for every row of x (M <= 6, one pass; the SIDE panels wholly inside
// n_out). Only as `streams` picks SIDE: 4 for M <= 2, AVX2 2 for M = 1 (the cases past 2 name
// tile<1, 4> only so that no tile the registers cannot hold is instantiated; they never run,
// nor do AVX2's instances of 4 panels). 3-6 rows of float32 weights also read each of the 2
// panels' inputs in 2 parts side by side (KS3): 4 streams per core, as 1-2 rows get from 4
// panels. int8, compute-bound from 4 rows, keeps one part.
template <int SIDE, typename T>
static void panels(const float* xp, const T* wp, const float* scale, float* y, int64_t M,
                   int64_t n_in, int64_t n_out, int64_t p) {
  constexpr int KS3 = sizeof(T) == 4 ? 2 : 1;
  const T* pw = wp + p * n_in * PANEL;
  const int64_t n0 = p * PANEL;
  switch (M) {
    case 1: tile<1, SIDE, T, 1, (NV <= 4 ? NV : CV)>(xp, 0, pw, scale, 0, n_in, y, n_out, n0);
      break;
    case 2: tile<2, SIDE>(xp, 0, pw, scale, 0, n_in, y, n_out, n0); break;
    case 3: tile<(SIDE <= 2 ? 3 : 1), SIDE, T, KS3>(xp, 0, pw, scale, 0, n_in, y, n_out, n0);
      break;
    case 4: tile<(SIDE <= 2 ? 4 : 1), SIDE, T, KS3>(xp, 0, pw, scale, 0, n_in, y, n_out, n0);
      break;
    case 5: tile<(SIDE <= 2 ? 5 : 1), SIDE, T, KS3>(xp, 0, pw, scale, 0, n_in, y, n_out, n0);
      break;
    default: tile<(SIDE <= 2 ? 6 : 1), SIDE, T, KS3>(xp, 0, pw, scale, 0, n_in, y, n_out, n0);
      break;
  }
}

// Panels lo .. hi for every row of x: `side` side by side while that many whole panels remain
// inside n_out, the rest one at a time.
template <typename T>
static void panel_range(const float* xp, const T* wp, const float* scale, float* y, int64_t M,
                        int64_t n_in, int64_t n_out, int64_t lo, int64_t hi) {
  const int64_t side = streams(M);
  int64_t p = lo;
  for (; side > 1 && p + side <= hi && (p + side) * PANEL <= n_out; p += side) {
    if (side == 4) panels<4>(xp, wp, scale, y, M, n_in, n_out, p);
    else panels<2>(xp, wp, scale, y, M, n_in, n_out, p);
  }
  for (; p < hi; p++) panel(xp, wp, scale, y, M, n_in, n_out, p);
}

// x [M, n_in] packed in blocks of MB rows (the last block: the rest), each transposed: block m0
// is [n_in, rows] at xp + m0 n_in. A pass reads its block front to back beside the panel, and
// one row of x stays one row (n_in floats: in L1, as it must be; padded to MB rows it would
// spill to L2).
static void pack(const float* x, float* xp, int64_t M, int64_t n_in) {
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t rows = std::min<int64_t>(MB, M - m0);
    for (int64_t k = 0; k < n_in; k++)
      for (int64_t b = 0; b < rows; b++) xp[m0 * n_in + k * rows + b] = x[(m0 + b) * n_in + k];
  }
}
