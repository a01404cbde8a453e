// Absorbed MLA decode (DeepSeek-V2/V3's latent attention, refmodel/attention/mla.py): one query
// per sequence, N heads, over the sequence's cached latents, with W_UK folded into the query
// and W_UV into the output, read from wkv_b where it lies.
//
// q_nope [B, N, P], q_rope [B, N, Q]: the step's query halves (RoPE already applied).
// w [R, N, P + U]: wkv_b = [W_UK | W_UV] as the model stores it. latent [B, S, R] and
// k_rope [B, S, Q]: the cache (the latent after its norm, the shared RoPE key). lens int32
// [B]: keys at positions < lens[b] are seen. out [B, N, U]. float32 throughout:
//
//   q_lat[b, n, :] = q_nope[b, n, :] W_UK[:, n, :]^T               absorb  (2 B N P R FLOPs)
//   s[b, n, t]     = scale (q_lat[b, n] . latent[b, t] + q_rope[b, n] . k_rope[b, t])
//   o_lat[b, n, :] = softmax_t(s[b, n, :]) latent[b, :, :]            (2 B N S (R + Q) + 2 B N S R)
//   out[b, n, :]   = o_lat[b, n, :] W_UV[:, n, :]                     absorb  (2 B N R U)
//
// All N heads share one latent per key, so each key row is loaded once for all of them (MQA
// with G = N and head sizes R + Q and R): the cache is read once, wkv_b once. Three parallel
// passes: the query absorb per head; the attention per (sequence, chunk of CH keys), each
// chunk a plain softmax with its own max (flash-decoding's split over the keys, as attend.cc);
// the chunks combined and the output absorb per head.
//
// Why: XLA:CPU runs this (the same einsums, `MultiHeadLatentAttention.absorbed`) far below the
// memory's speed in the scores and the absorbs, and copies and transposes the sliced wkv_b on
// every call (`python -m microbench breakdown --phase decode_attention --attention mla
// --mla-absorb` shows it beside the counted cost).
//
// The scores take 4 keys by 4 heads at a time, 16 dot products in registers and one
// transpose-sum (`scores4x4`); the values VH heads per pass over the chunk's latents, so each
// latent row is walked from L2 N / VH times. A chunk's scores read its rows from memory, then
// its values re-read them from L2, which would leave memory idle during the values: each thread
// takes a run of adjacent chunks and, during one chunk's values, prefetches the next one's rows
// into L2, its lines shared out evenly over the value passes' keys (`Pace`), so the next scores
// read from L2 while memory streams under the values. With one chunk per run (batch 1, short
// sequences) there is nothing to prefetch.
#include <cmath>
#include <cstring>

#include "common.h"

struct LatentArgs {
  const float *qn, *qr, *w, *lat, *rope;
  const int32_t* lens;
  float* out;
  int64_t B, N, P, Q, U, R, S, C;  // C: chunks of CH keys in the longest sequence
  float scale;
};

constexpr int64_t CH = 256;  // keys per chunk
constexpr int64_t PFK = 16;  // keys ahead to prefetch

// Rows r0 .. r1 of wkv_b, read in order: ql[b, n, r] = scale q_nope[b, n] . w[r, n, :P] for
// every sequence and head; the scale is folded into the latent query here and into the rope
// query in `chunk`. (Per head, the rows' W_UK parts lie N (P + U) floats apart: walked head
// by head, from main memory, this pass would take longer than the attention.)
static void absorb_in(const LatentArgs& a, int64_t r0, int64_t r1, float* ql) {
  const int64_t N = a.N, P = a.P, stride = N * (P + a.U);
#if defined(__AVX512F__)
  if (r1 - r0 == VL) {  // VL rows' dot products side by side, then one transpose-sum
    const int64_t PV = P / VL * VL;
    for (int64_t n = 0; n < N; n++)
      for (int64_t b = 0; b < a.B; b++) {
        const float* q = a.qn + (b * N + n) * P;
        const float* w = a.w + r0 * stride + n * (P + a.U);
        vec d[VL];
        for (int i = 0; i < VL; i++) d[i] = vec{};
        for (int64_t h = 0; h < PV; h += VL) {
          const vec qh = *(const vec*)(q + h);
          for (int i = 0; i < VL; i++) d[i] += qh * *(const vec*)(w + i * stride + h);
        }
        vec s = sums16(d);
        for (int64_t h = PV; h < P; h++)
          for (int i = 0; i < VL; i++) s[i] += q[h] * w[i * stride + h];
        *(vec*)(ql + (b * N + n) * a.R + r0) = a.scale * s;
      }
    return;
  }
#endif
  for (int64_t r = r0; r < r1; r++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t b = 0; b < a.B; b++)
        ql[(b * N + n) * a.R + r] =
            a.scale * dot(a.qn + (b * N + n) * P, a.w + r * stride + n * (P + a.U), P);
}

#if defined(__AVX512F__)
// The scores of keys j .. j + 4 for heads g .. g + 4 as 16 dot products side by side (a step
// loads 4 key and 4 query vectors for 16 FMAs), then one transpose-sum: lane 4 g + i is head
// g's score of key i. (16 keys' dot products per head would need a load per FMA.)
// d[4 g + i] += q[g] . k[i] over the whole vectors of n channels (q rows and k rows n apart),
// each step's 4 key and 4 query vectors pinned in registers for the 16 FMAs.
__attribute__((always_inline)) static inline void dots4x4(const float* q, const float* k,
                                                          int64_t n, vec* d) {
  for (int64_t h = 0; h + VL <= n; h += VL) {
    vec kv[4];
    for (int i = 0; i < 4; i++) {
      kv[i] = *(const vec*)(k + i * n + h);
      PIN(kv[i]);
    }
    for (int g = 0; g < 4; g++) {
      vec qv = *(const vec*)(q + g * n + h);
      PIN(qv);
      for (int i = 0; i < 4; i++) d[g * 4 + i] += qv * kv[i];
    }
  }
}

__attribute__((always_inline)) static inline void scores4x4(const LatentArgs& a, const float* ql,
                                                            const float* qr, const float* lat,
                                                            const float* rope, float* s,
                                                            int64_t sstride) {
  const int64_t R = a.R, Q = a.Q, RV = R / VL * VL, QV = Q / VL * VL;
  vec d[16];
  for (int i = 0; i < 16; i++) d[i] = vec{};
  dots4x4(ql, lat, R, d);  // the latent channels
  dots4x4(qr, rope, Q, d);  // the rope key's
  const vec t = sums16(d);
  for (int g = 0; g < 4; g++) std::memcpy(s + g * sstride, &t[g * 4], 4 * sizeof(float));
  if (RV < R || QV < Q)  // channels past the last whole vector
    for (int g = 0; g < 4; g++)
      for (int i = 0; i < 4; i++) {
        float x = 0.0f;
        for (int64_t h = RV; h < R; h++) x += ql[g * R + h] * lat[i * R + h];
        for (int64_t h = QV; h < Q; h++) x += qr[g * Q + h] * rope[i * Q + h];
        s[g * sstride + i] += x;
      }
}
#endif

// A chunk's rows as cache lines, numbered 0 .. lat_lines + rope_lines: its latent rows' lines,
// then its RoPE keys'.
struct Rows {
  const char *lat = nullptr, *rope = nullptr;
  int64_t lat_lines = 0, rope_lines = 0;
  int64_t lines() const { return lat_lines + rope_lines; }
  const char* line(int64_t i) const {
    return i < lat_lines ? lat + i * 64 : rope + (i - lat_lines) * 64;
  }
};

// Lines lo .. hi of a chunk's rows, to prefetch into L2 over a pass of `steps` steps.
struct Pace {
  const Rows* rows = nullptr;
  int64_t lo = 0, hi = 0, owed = 0;
  void step(int64_t steps) {  // this step's share: (hi - lo) / steps lines on average
    for (owed += hi - lo; rows && owed >= steps; owed -= steps)
      __builtin_prefetch(rows->line(lo++), 0, 2);
  }
};

// acc[g, h] += sum over the chunk's keys j of p[g, j] latent[j, h] for NG heads from g0 and HB
// vectors of channels from h0, the NG x HB sums in registers. `pace`: lines of the next chunk
// prefetched into L2 along the way, spread evenly over the keys (memory streams while this
// pass computes from L2).
template <int NG, int HB>
static void values(const float* p, int64_t pstride, const float* lat, int64_t R, int64_t cnt,
                   int64_t h0, float* acc, int64_t astride, Pace pace = {}) {
  vec sum[NG][HB];
  for (int g = 0; g < NG; g++)
    for (int h = 0; h < HB; h++) sum[g][h] = vec{};
  for (int64_t j = 0; j < cnt; j++) {
    pace.step(cnt);
    vec v[HB];
    for (int h = 0; h < HB; h++) v[h] = *(const vec*)(lat + j * R + h0 + h * VL);
    for (int g = 0; g < NG; g++) {
      const vec pg = bcast(p[g * pstride + j]);
      for (int h = 0; h < HB; h++) sum[g][h] += pg * v[h];
    }
  }
  for (int g = 0; g < NG; g++)
    for (int h = 0; h < HB; h++) *(vec*)(acc + g * astride + h0 + h * VL) += sum[g][h];
}

// Heads per pass of `values`: VH x 4 sums, 4 latent vectors and a broadcast in registers.
constexpr int64_t VH = REGS >= 32 ? 6 : 2;

// `values` for ng (1 .. VH) heads.
template <int HB>
static void values_heads(int64_t ng, const float* p, int64_t pstride, const float* lat,
                         int64_t R, int64_t cnt, int64_t h0, float* acc, Pace pace) {
  switch (ng) {
    case 1: values<1, HB>(p, pstride, lat, R, cnt, h0, acc, R, pace); break;
    case 2: values<2, HB>(p, pstride, lat, R, cnt, h0, acc, R, pace); break;
    case 3: values<3, HB>(p, pstride, lat, R, cnt, h0, acc, R, pace); break;
    case 4: values<4, HB>(p, pstride, lat, R, cnt, h0, acc, R, pace); break;
    case 5: values<5, HB>(p, pstride, lat, R, cnt, h0, acc, R, pace); break;
    default: values<6, HB>(p, pstride, lat, R, cnt, h0, acc, R, pace); break;
  }
}

// Chunk c of sequence b's rows (none past the sequence's keys).
static Rows rows_of(const LatentArgs& a, int64_t b, int64_t c) {
  const int64_t t0 = c * CH, cnt = std::min<int64_t>(a.lens[b], t0 + CH) - t0;
  if (cnt <= 0) return {};
  return {reinterpret_cast<const char*>(a.lat + (b * a.S + t0) * a.R),
          reinterpret_cast<const char*>(a.rope + (b * a.S + t0) * a.Q),
          (cnt * a.R * 4 + 63) / 64, (cnt * a.Q * 4 + 63) / 64};
}

// Chunk c of sequence b: m [N] (each head's max score), l [N] (its sum of exp) and acc [N, R]
// (the exp-weighted latents, not yet divided by l).
// `next`: the rows of the chunk this thread takes next, prefetched into L2 during the values.
static void chunk(const LatentArgs& a, const float* ql, int64_t b, int64_t c, float* m,
                  float* l, float* acc, Rows next = {}) {
  const int64_t N = a.N, R = a.R, Q = a.Q;
  const int64_t t0 = c * CH, t1 = std::min<int64_t>(a.lens[b], t0 + CH), cnt = t1 - t0;
  std::memset(acc, 0, sizeof(float) * N * R);
  if (cnt <= 0) {
    for (int64_t n = 0; n < N; n++) m[n] = -INFINITY, l[n] = 0.0f;
    return;
  }
  const int64_t cntv = (cnt + VL - 1) / VL * VL;
  const float* lat = a.lat + (b * a.S + t0) * R;
  const float* rope = a.rope + (b * a.S + t0) * Q;
  std::vector<float> qr(N * Q), s(N * cntv);
  for (int64_t i = 0; i < N * Q; i++) qr[i] = a.scale * a.qr[b * N * Q + i];
  // scores, 4 keys by 4 heads at a time: the keys' rows (4 (R + Q) floats) stay in L1
  const float* qb = ql + b * N * R;
  int64_t j = 0;
#if defined(__AVX512F__)
  for (; j + 4 <= cnt; j += 4) {
    if (j + PFK + 4 <= cnt)  // the rows PFK keys ahead, a line at a time
      for (int64_t x = 0; x < 4 * R; x += 64 / 4) __builtin_prefetch(lat + (j + PFK) * R + x);
    for (int64_t n = 0; n + 4 <= N; n += 4)
      scores4x4(a, qb + n * R, qr.data() + n * Q, lat + j * R, rope + j * Q,
                s.data() + n * cntv + j, cntv);
  }
#endif
  for (int64_t n = 0; n < N; n++)  // what the blocks left: heads past N / 4 x 4, last keys
    for (int64_t i = (n < N / 4 * 4 ? j : 0); i < cnt; i++)
      s[n * cntv + i] =
          dot(qb + n * R, lat + i * R, R) + dot(qr.data() + n * Q, rope + i * Q, Q);
  for (int64_t n = 0; n < N; n++) {  // each head's softmax over the chunk
    float* sn = s.data() + n * cntv;
    for (int64_t j = cnt; j < cntv; j++) sn[j] = -INFINITY;  // exp -> ~0
    vec vmx = vec{} - INFINITY;
    for (int64_t j = 0; j < cntv; j += VL) {
      const vec x = *(vec*)(sn + j);
      vmx = x > vmx ? x : vmx;
    }
    float mx = -INFINITY;
    for (int64_t l = 0; l < VL; l++) mx = std::max(mx, vmx[l]);
    vec sum = {};
    for (int64_t j = 0; j < cntv; j += VL) {
      const vec e = vexp(*(vec*)(sn + j) - mx);
      *(vec*)(sn + j) = e;
      sum += e;
    }
    m[n] = mx;
    l[n] = hsum(sum);
  }
  // values: VH heads x 4 vectors of channels in registers per pass over the chunk's rows
  const int64_t RV = R / VL * VL;
  // the passes over the chunk's rows below, the next chunk's lines shared out among them
  const int64_t passes = std::max<int64_t>(
      1, (N + VH - 1) / VH * (RV / (4 * VL) + RV % (4 * VL) / VL));
  int64_t pass = 0;
  auto share = [&] {  // the next pass's lines of the next chunk
    const int64_t lo = pass * next.lines() / passes, hi = ++pass * next.lines() / passes;
    return Pace{next.lines() ? &next : nullptr, lo, hi};
  };
  for (int64_t g = 0; g < N; g += VH) {
    const int64_t ng = std::min<int64_t>(VH, N - g);
    const float* p = s.data() + g * cntv;
    float* ag = acc + g * R;
    int64_t h = 0;
    for (; h + 4 * VL <= RV; h += 4 * VL)
      values_heads<4>(ng, p, cntv, lat, R, cnt, h, ag, share());
    for (; h < RV; h += VL) values_heads<1>(ng, p, cntv, lat, R, cnt, h, ag, share());
    for (; h < R; h++)  // channels past the last whole vector
      for (int64_t i = 0; i < ng; i++)
        for (int64_t j = 0; j < cnt; j++) ag[i * R + h] += p[i * cntv + j] * lat[j * R + h];
  }
}

// Each chunk's weight in its sequence's softmax: cw[b, c, n] = exp(m_c - max_c m) / sum, the
// chunks' maxima and sums rescaled to one (the online softmax's combine).
static void chunk_weights(const LatentArgs& a, const float* parts, int64_t b, float* cw) {
  const int64_t N = a.N, per = N * (a.R + 2);
  for (int64_t n = 0; n < N; n++) {
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t c = 0; c < a.C; c++) mx = std::max(mx, parts[(b * a.C + c) * per + n]);
    for (int64_t c = 0; c < a.C; c++) {
      const float* part = parts + (b * a.C + c) * per;
      const float wgt = part[N + n] == 0.0f ? 0.0f : std::exp(part[n] - mx);  // 0: empty
      cw[(b * a.C + c) * N + n] = wgt;
      sum += part[N + n] * wgt;
    }
    for (int64_t c = 0; c < a.C; c++) cw[(b * a.C + c) * N + n] /= sum;
  }
}

// Sequence b's attention output: o_lat[b, n, :] = the sum over its chunks of their weights
// (chunk_weights) times their exp-weighted latents.
static void combine(const LatentArgs& a, const float* parts, const float* cw, int64_t b,
                    float* ol) {
  const int64_t N = a.N, R = a.R, per = N * (R + 2);
  for (int64_t n = 0; n < N; n++) {
    float* o = ol + (b * N + n) * R;
    std::memset(o, 0, sizeof(float) * R);
    for (int64_t c = 0; c < a.C; c++) {
      const float wgt = cw[(b * a.C + c) * N + n];
      const float* acc = parts + (b * a.C + c) * per + 2 * N + n * R;
      if (wgt != 0.0f)
        for (int64_t r = 0; r < R; r++) o[r] += wgt * acc[r];
    }
  }
}

// y[b0 .. b0 + NB, n, u0 .. u0 + UB VL] += sum over rows r0 .. r1 of o_lat[b, n, r] w[r, n,
// P + u]: NB sequences x UB vectors of outputs in registers, each weight vector loaded once
// for the NB sequences.
template <int NB, int UB>
static void out_block(const LatentArgs& a, const float* ol, int64_t n, int64_t b0, int64_t u0,
                      int64_t r0, int64_t r1, float* y) {
  const int64_t N = a.N, R = a.R, U = a.U, stride = N * (a.P + U);
  vec acc[NB][UB];
  for (int i = 0; i < NB; i++)
    for (int h = 0; h < UB; h++) acc[i][h] = vec{};
  for (int64_t r = r0; r < r1; r++) {
    const float* wr = a.w + r * stride + n * (a.P + U) + a.P + u0;
    vec wv[UB];
    for (int h = 0; h < UB; h++) wv[h] = *(const vec*)(wr + h * VL);
    for (int i = 0; i < NB; i++) {
      const vec x = bcast(ol[((b0 + i) * N + n) * R + r]);
      for (int h = 0; h < UB; h++) acc[i][h] += x * wv[h];
    }
  }
  for (int i = 0; i < NB; i++)
    for (int h = 0; h < UB; h++) *(vec*)(y + ((b0 + i) * N + n) * U + u0 + h * VL) += acc[i][h];
}

// Rows r0 .. r1 of wkv_b: this block's partial output absorb y [B, N, U] = o_lat[:, :, r0:r1]
// w[r0:r1, :, P:] (the rows' W_UV parts, N (P + U) floats apart, stay in L2 for every
// sequence).
static void absorb_out(const LatentArgs& a, const float* ol, int64_t r0, int64_t r1, float* y) {
  const int64_t N = a.N, R = a.R, U = a.U, UV = U / VL * VL, stride = N * (a.P + U);
  std::memset(y, 0, sizeof(float) * a.B * N * U);
  for (int64_t n = 0; n < N; n++) {
    for (int64_t b = 0; b < a.B; b += 4) {
      const int64_t nb = std::min<int64_t>(4, a.B - b);
      int64_t u = 0;
      for (; u + 4 * VL <= UV; u += 4 * VL) {
        if (nb == 4) out_block<4, 4>(a, ol, n, b, u, r0, r1, y);
        else for (int64_t i = 0; i < nb; i++) out_block<1, 4>(a, ol, n, b + i, u, r0, r1, y);
      }
      for (; u < UV; u += VL) {
        if (nb == 4) out_block<4, 1>(a, ol, n, b, u, r0, r1, y);
        else for (int64_t i = 0; i < nb; i++) out_block<1, 1>(a, ol, n, b + i, u, r0, r1, y);
      }
      for (int64_t i = b; i < b + nb; i++)  // outputs past the last whole vector
        for (int64_t r = r0; r < r1; r++) {
          const float x = ol[(i * N + n) * R + r];
          const float* wr = a.w + r * stride + n * (a.P + U) + a.P;
          for (int64_t v = UV; v < U; v++) y[(i * N + n) * U + v] += x * wr[v];
        }
    }
  }
}

static ffi::Error AttendLatent(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q_nope,
                               ffi::Buffer<ffi::F32> q_rope, ffi::Buffer<ffi::F32> w,
                               ffi::Buffer<ffi::F32> latent, ffi::Buffer<ffi::F32> k_rope,
                               ffi::Buffer<ffi::S32> lens, ffi::ResultBuffer<ffi::F32> out,
                               float scale) {
  const auto qn = q_nope.dimensions(), qr = q_rope.dimensions(), wd = w.dimensions();
  const auto ld = latent.dimensions(), kd = k_rope.dimensions();
  if (qn.size() != 3 || qr.size() != 3 || wd.size() != 3 || ld.size() != 3 || kd.size() != 3 ||
      lens.dimensions().size() != 1)
    return ffi::Error::InvalidArgument(
        "attend_latent: q_nope [B, N, P], q_rope [B, N, Q], w [R, N, P + U], latent [B, S, "
        "R], k_rope [B, S, Q], lens [B]");
  const int64_t B = qn[0], N = qn[1], P = qn[2], Q = qr[2], R = wd[0], S = ld[1];
  const int64_t U = wd[2] - P;
  if (qr[0] != B || qr[1] != N || wd[1] != N || U < 1 || ld[0] != B || ld[2] != R ||
      kd[0] != B || kd[1] != S || kd[2] != Q || lens.dimensions()[0] != B || S < 1)
    return ffi::Error::InvalidArgument(
        "attend_latent: shapes disagree (q_nope [B, N, P], q_rope [B, N, Q], w [R, N, P + U], "
        "latent [B, S, R], k_rope [B, S, Q], lens [B])");
  const int32_t* len = lens.typed_data();
  int64_t longest = 0;
  for (int64_t b = 0; b < B; b++) {
    if (len[b] < 1 || len[b] > S)
      return ffi::Error::InvalidArgument("attend_latent: lens[b] must be in [1, S]");
    longest = std::max<int64_t>(longest, len[b]);
  }
  const int64_t C = (longest + CH - 1) / CH;
  const LatentArgs a{q_nope.typed_data(), q_rope.typed_data(), w.typed_data(),
                     latent.typed_data(), k_rope.typed_data(), len, out->typed_data(),
                     B, N, P, Q, U, R, S, C, scale};
  // scratch: the absorbed queries [B, N, R]; per (b, c) m [N], l [N], acc [N, R]; the chunks'
  // weights [B, C, N]; the attention's output o_lat [B, N, R]; a partial output [B, N, U] per
  // block of wkv_b's rows
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t blocks = std::min<int64_t>((R + 31) / 32, 2 * threads);
  const int64_t RB = (R + blocks - 1) / blocks;
  std::vector<float> ql(B * N * R), parts(B * C * N * (R + 2)), cw(B * C * N), ol(B * N * R),
      ys(blocks * B * N * U);
  float *qlp = ql.data(), *pp = parts.data(), *cwp = cw.data(), *olp = ol.data();
  float* yp = ys.data();
  parallel_for(pool, (R + VL - 1) / VL, [=](int64_t i) {
    absorb_in(a, i * VL, std::min<int64_t>(R, (i + 1) * VL), qlp);
  });
  // the chunks in 2 runs of adjacent jobs per thread, of about equal keys (the sequences'
  // lengths differ): each job prefetches its run's next job's rows
  const int64_t jobs = B * C, runs = std::min<int64_t>(jobs, 2 * threads);
  std::vector<int64_t> keys(jobs + 1, 0), cut(runs + 1, 0);  // keys before job j; run starts
  for (int64_t j = 0; j < jobs; j++)
    keys[j + 1] = keys[j] + std::clamp<int64_t>(len[j / C] - j % C * CH, 0, CH);
  for (int64_t r = 1; r < runs; r++) {  // run r: from the first job with r / runs of the keys
    const auto j = std::lower_bound(keys.begin(), keys.end(), r * keys[jobs] / runs);
    cut[r] = std::clamp<int64_t>(j - keys.begin(), cut[r - 1], jobs);
  }
  cut[runs] = jobs;
  const int64_t* cuts = cut.data();
  parallel_for(pool, runs, [=](int64_t r) {
    const int64_t lo = cuts[r], hi = cuts[r + 1];
    for (int64_t job = lo; job < hi; job++) {
      float* m = pp + job * N * (R + 2);
      chunk(a, qlp, job / C, job % C, m, m + N, m + 2 * N,
            job + 1 < hi ? rows_of(a, (job + 1) / C, (job + 1) % C) : Rows{});
    }
  });
  for (int64_t b = 0; b < B; b++) chunk_weights(a, pp, b, cwp);
  parallel_for(pool, B, [=](int64_t b) { combine(a, pp, cwp, b, olp); });
  parallel_for(pool, blocks, [=](int64_t i) {
    absorb_out(a, olp, std::min(R, i * RB), std::min(R, (i + 1) * RB), yp + i * B * N * U);
  });
  float* o = out->typed_data();
  parallel_for(pool, B, [=](int64_t b) {  // the blocks' partial outputs summed
    float* dst = o + b * N * U;
    std::memcpy(dst, yp + b * N * U, sizeof(float) * N * U);
    for (int64_t i = 1; i < blocks; i++) {
      const float* y = yp + (i * B + b) * N * U;
      for (int64_t k = 0; k < N * U; k++) dst[k] += y[k];
    }
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttendLatentF32, AttendLatent,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q_nope [B, N, P]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q_rope [B, N, Q]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [R, N, P + U]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // latent [B, S, R]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k_rope [B, S, Q]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lens [B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, N, U]
                                  .Attr<float>("scale"));
