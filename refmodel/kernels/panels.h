// The inner product of the weight kernels (rows.cc) and of prefill attention (rows_attend.cc):
// y [M, N] = x [M, K] times a matrix stored in panels [ceil(N / P), K, P], P = 32 outputs side
// by side per input. `pack` lays x out in blocks of MB rows, each transposed ([K, B]); `panel`
// computes one panel's P outputs for every row of x; `tile` is its register-blocked inner loop.
// The layout, the tile and what was measured choosing them: rows.cc's header.
#pragma once

#include "common.h"

constexpr int64_t P = 32;  // outputs per panel: rows.py's PANEL, the stored layout
constexpr int NV = P / VL;               // vectors per panel row
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

// Rows m0 .. m0 + B of x against vectors c0 .. c0 + CV of the rows of S adjacent panels (pw
// and the S - 1 after it), over all K inputs. xb is x's block of rows m0 .. m0 + B, transposed
// ([K, B], `pack`): the B inputs of a step are adjacent. U partial sums per output so that at
// least 8 independent FMA chains hide the FMA latency even for one row of x. S > 1 reads S
// panels side by side, S streams in flight per core (`streams`); KS > 1 reads one panel's K
// inputs as KS parts side by side (k, k + K / KS, ...), KS streams into the same accumulators
// (`panel`'s first pass of 7 or more rows of float32 weights). `scale`: one per output
// (int8), or null.
template <int B, int S, typename T, int KS = 1, int CV = ::CV>
static void tile(const float* xb, int64_t m0, const T* pw, const float* scale, int c0,
                 int64_t K, float* y, int64_t N, int64_t n0) {
  constexpr int U = (B * CV * S >= 8) ? 1 : (B * CV * S >= 4 ? 2 : 4);
  vec acc[U][S][B][CV];
  for (int u = 0; u < U; u++)
    for (int s = 0; s < S; s++)
      for (int b = 0; b < B; b++)
        for (int v = 0; v < CV; v++) acc[u][s][b][v] = vec{};
  const T* w = pw + c0 * VL;
  const int64_t kq = K / KS;  // inputs per part
  const int64_t ku = kq / U * U;
  for (int64_t k = 0; k < ku; k += U) {
    for (int u = 0; u < U; u++) {
      for (int q = 0; q < KS; q++) {
        const int64_t kk = q * kq + k + u;
        const float* xk = xb + kk * B;
        for (int s = 0; s < S; s++) {
          const T* wk = w + s * K * P + kk * P;
          // every line of the row PF bytes ahead (past the panel's end: the next panel)
          for (int64_t l = 0; l < int64_t(P * sizeof(T)); l += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(wk) + PF + l, 0, 2);
          vec wv[CV];
          for (int v = 0; v < CV; v++) {
            wv[v] = load(wk + v * VL);
            PIN(wv[v]);
          }
          for (int b = 0; b < B; b++) {
            const vec xv = bcast(xk[b]);
            for (int v = 0; v < CV; v++) acc[u][s][b][v] += xv * wv[v];
          }
        }
      }
    }
  }
  // the inputs outside the unrolled loop: each part's last kq - ku, then K's last K - KS kq
  // (a loop, not a lambda: one capturing acc by reference kept it in memory, not registers)
  for (int q = 0; q <= KS; q++) {
    const int64_t lo = q < KS ? q * kq + ku : KS * kq, hi = q < KS ? (q + 1) * kq : K;
    for (int64_t k = lo; k < hi; k++)
      for (int s = 0; s < S; s++)
        for (int b = 0; b < B; b++)
          for (int v = 0; v < CV; v++)
            acc[0][s][b][v] += bcast(xb[k * B + b]) * load(w + s * K * P + k * P + v * VL);
  }
  for (int s = 0; s < S; s++)
    for (int b = 0; b < B; b++)
      for (int v = 0; v < CV; v++) {
        vec a = acc[0][s][b][v];
        for (int u = 1; u < U; u++) a += acc[u][s][b][v];
        const int64_t n = n0 + s * P + (c0 + v) * VL;
        float* yr = y + (m0 + b) * N + n;
        if (n + VL <= N) {
          if (scale) a *= *(const vec*)(scale + n);
          *(vec*)yr = a;
        } else {
          for (int64_t l = 0; l < N - n; l++) yr[l] = scale ? a[l] * scale[n + l] : a[l];
        }
      }
}

// Rows m0 .. m0 + B of x (B <= MB) against panel pw's vectors c0 .. c0 + CV: tile<B, 1, T,
// KS>. (With MB = 6 the cases past 6 never run; they name tile<1> only so that no tile is
// instantiated that the registers cannot hold.)
template <int KS, typename T>
static void pass(int64_t B, const float* xb, int64_t m0, const T* pw, const float* scale,
                 int c0, int64_t K, float* y, int64_t N, int64_t n0) {
  switch (B) {
    case 1: tile<1, 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 2: tile<2, 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 3: tile<3, 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 4: tile<4, 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 5: tile<(MB >= 5 ? 5 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 6: tile<(MB >= 6 ? 6 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 7: tile<(MB >= 7 ? 7 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 8: tile<(MB >= 8 ? 8 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 9: tile<(MB >= 9 ? 9 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 10: tile<(MB >= 10 ? 10 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    case 11: tile<(MB >= 11 ? 11 : 1), 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
    default: tile<MB, 1, T, KS>(xb, m0, pw, scale, c0, K, y, N, n0); break;
  }
}

// Panel p for every row of x: MB rows of x per pass, CV vectors of the panel per tile. The
// first pass reads the panel from memory, later ones (more rows, other vectors) from L2.
// Tried and dropped on a 2-core Zen 3 (AVX2), 2026-12-04, each against this in 2 alternations:
// passes of even rows (8 rows as 4 + 4, not 6 + 2: the same); every pass over chunks of 128
// inputs in turn (16 KiB of the panel in L1, partial sums in a buffer, the next chunk
// prefetched by the first pass, so that memory streams while the later passes compute): 4 /
// 8 / 16 / 64 rows 19-27 / 16-20 / 12-15 / 4-5 -> 17-20 / 14-17 / 8-11 / 3-4 GB/s of weights;
// the prefetch in the panel's first pass only (4 rows 21-28 -> 15-24 GB/s, 8-64 the same).
// The first pass of 7 or more rows of float32 weights (one panel at a time: `streams`) reads
// its K inputs as KSPLIT parts side by side: one stream per core left an Intel core short of
// reads in flight while it computed. A 2-core Xeon (KVM, AMX), 2026-12-03: a product over 1
// GiB of panels on both cores (OpenMP, the same blocks), three calls each, 8 rows 17.9-18.9 ->
// 26.4-27.5 GB/s, 12 rows 18.7-19.1 -> 23.5-24.5, 16 rows 15.2 -> 18.8-19.5, 7 rows
// 17.5-19.4 -> 20.8-22.9; through JAX, llama-309m's 113 products chained,
// median of 9, five alternations of the two builds: 8 rows 72-83 -> 62-67 ms (and once 114),
// 16 rows 98-122 -> 86-117 (two). Tried and dropped: parts for 3-6 rows instead of 2 panels
// side by side (float32 even through JAX; int8, compute-bound from 4 rows, 21-29 -> 31-32 ms
// at 4 rows) and for int8 at 7 or more (8 rows 34-51 -> 40-47, 16 rows 68-91 -> 76-96). A
// 512-row GEMM is the same either way (the later passes are most of it); 8 parts: even at 8
// rows, worse at 16 (16.6-16.8 GB/s).
constexpr int KSPLIT = 4;

template <typename T>
static void panel(const float* xp, const T* wp, const float* scale, float* y, int64_t M,
                  int64_t K, int64_t N, int64_t p) {
  const T* pw = wp + p * K * P;
  const int64_t n0 = p * P;
  for (int c0 = 0; c0 < NV; c0 += CV) {
    if (n0 + c0 * VL >= N) break;  // vectors wholly past N: zero weights, nothing to write
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t B = std::min<int64_t>(MB, M - m0);
      const float* xb = xp + m0 * K;
      // AVX2 (16 registers, 4 vectors per panel row): a block of 1-2 rows (all of x, or the
      // rows past the passes of 6) takes the whole row in one pass. Two passes of 2 vectors
      // each read every other line of the panel from memory and the rest from L2 or L3 (a
      // panel of K = 4096 inputs is 512 KiB, a Zen 3 core's whole L2). A 2-core Zen 3 (EPYC,
      // KVM, AVX2), 2026-12-03, 32 pairs of [4096, 1024] and [1024, 4096] products over 1 GiB
      // through JAX, best of 5 calls, 6 rounds in 2 alternations of the builds: 1 row
      // 17.0-22.8 -> 22.9-26.3 GB/s, 2 rows 18.5-21.8 -> 19.9-25.4 (the C read 27-40); the
      // rows past 6 so, 2026-12-04, [1024, 4096] and [4096, 1024] products over 1 GiB each: 8
      // rows 16-21 -> 21-22 GB/s, 7 rows 18-20 -> 19-22 (6 rounds, 2 alternations).
      if constexpr (NV > CV && NV <= 4) {
        if (B <= 2) {
          if (c0 > 0) continue;  // done in the first
          if (B == 1) tile<1, 1, T, 1, NV>(xb, m0, pw, scale, 0, K, y, N, n0);
          else tile<2, 1, T, 1, NV>(xb, m0, pw, scale, 0, K, y, N, n0);
          continue;
        }
      }
      if constexpr (sizeof(T) == 4) {
        if (m0 == 0 && B >= 7) {
          pass<KSPLIT>(B, xb, m0, pw, scale, c0, K, y, N, n0);
          continue;
        }
      }
      pass<1>(B, xb, m0, pw, scale, c0, K, y, N, n0);
    }
  }
}

// How many panels to read side by side for M rows of x: with AVX-512's 32 registers, 4 for 1-2
// rows (8-16 accumulators) and 2 for 3-6, when all rows fit one pass; else 1. One stream per
// core left Intel's cores short of reads in flight: a 2-core Xeon (KVM, AMX), a 1-row GEMV over
// 1 GiB of panels, 15.7 GB/s one panel at a time, 19.4 four side by side (the C read of one
// stream per thread 14.8, of four 20.7; medians of 7 alternations in one process).
// With AVX2's 16, 2 for 1 row (2 x 4 accumulators, each panel's 4 weight vectors in turn): the
// same Zen 3 and harness as `panel`'s, 1 row 21.8-25.5 -> 25.0-30.2 GB/s, 0.82-1.00 of the
// read in the same rounds (6 rounds, 2 alternations).
static int64_t streams(int64_t M) {
  if (REGS < 32 || CV != NV) return NV == 4 && M == 1 ? 2 : 1;
  return M <= 2 ? 4 : (M <= 6 ? 2 : 1);
}

// Panels p .. p + S for every row of x (M <= 6, one pass; the S panels wholly inside N).
// Only as `streams` picks S: 4 for M <= 2, AVX2 2 for M = 1 (the cases past 2 name tile<1, 4>
// only so that no tile the registers cannot hold is instantiated; they never run, nor do
// AVX2's instances of 4 panels). 3-6 rows of float32
// weights also read each of the 2 panels' K inputs in 2 parts side by side (KS3): 4 streams
// per core, as 1-2 rows get from 4 panels. A 2-core Xeon (KVM, AMX), 2026-12-03, 64 chained
// products over 1 GiB through JAX against the C read in the same process, four alternations
// of the builds: 3 / 4 / 6 rows 0.75-0.89 / 0.71-0.83 / 0.60-0.83 of the read -> 0.83-0.93 /
// 0.85-0.91 / 0.85-0.95. (Parts instead of the 2 panels had been even; int8, compute-bound
// from 4 rows, keeps one part.)
template <int S, typename T>
static void panels(const float* xp, const T* wp, const float* scale, float* y, int64_t M,
                   int64_t K, int64_t N, int64_t p) {
  constexpr int KS3 = sizeof(T) == 4 ? 2 : 1;
  const T* pw = wp + p * K * P;
  const int64_t n0 = p * P;
  switch (M) {
    case 1: tile<1, S, T, 1, (NV <= 4 ? NV : CV)>(xp, 0, pw, scale, 0, K, y, N, n0); break;
    case 2: tile<2, S>(xp, 0, pw, scale, 0, K, y, N, n0); break;
    case 3: tile<(S <= 2 ? 3 : 1), S, T, KS3>(xp, 0, pw, scale, 0, K, y, N, n0); break;
    case 4: tile<(S <= 2 ? 4 : 1), S, T, KS3>(xp, 0, pw, scale, 0, K, y, N, n0); break;
    case 5: tile<(S <= 2 ? 5 : 1), S, T, KS3>(xp, 0, pw, scale, 0, K, y, N, n0); break;
    default: tile<(S <= 2 ? 6 : 1), S, T, KS3>(xp, 0, pw, scale, 0, K, y, N, n0); break;
  }
}

// Panels lo .. hi for every row of x: S side by side while S whole panels remain inside N, the
// rest one at a time.
template <typename T>
static void panel_range(const float* xp, const T* wp, const float* scale, float* y, int64_t M,
                        int64_t K, int64_t N, int64_t lo, int64_t hi) {
  const int64_t S = streams(M);
  int64_t p = lo;
  for (; S > 1 && p + S <= hi && (p + S) * P <= N; p += S) {
    if (S == 4) panels<4>(xp, wp, scale, y, M, K, N, p);
    else panels<2>(xp, wp, scale, y, M, K, N, p);
  }
  for (; p < hi; p++) panel(xp, wp, scale, y, M, K, N, p);
}

// x [M, K] packed in blocks of MB rows (the last block: the rest), each transposed: block m0 is
// [K, B] at xp + m0 K. A pass reads its block front to back beside the panel, and one row of x
// stays one row (K floats: in L1 at one row, as it must be; padded to MB rows it spilled to L2
// and 1 row ran 4% slower than the dot-product kernel instead of 6% faster).
static void pack(const float* x, float* xp, int64_t M, int64_t K) {
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t B = std::min<int64_t>(MB, M - m0);
    for (int64_t k = 0; k < K; k++)
      for (int64_t b = 0; b < B; b++) xp[m0 * K + k * B + b] = x[(m0 + b) * K + k];
  }
}
