// Sparse attention by top-k selection (refmodel/attention/sparse.py, after DeepSeek Sparse
// Attention): each query scores every key it may see with the lightning indexer, keeps the top
// k, and attends over those keys only, read where they lie in the cache.
//
// q [B, T, K, G, H]: T queries per sequence (1 at decode, a chunk's tokens at prefill), G query
// heads per KV head. k, v [B, K, S, H]: the cache (or the chunk's own keys). q_idx [B, T, I, J],
// w_idx [B, T, I]: the indexer's query heads and their weights; k_idx [B, S, J]: the indexer
// keys. lens int32 [B, T]: query t sees the keys at positions < lens[b, t] (causal: its
// position + 1). out [B, T, K, G, H].
//
//   idx(s) = sum_i w_idx[i] relu(q_idx[i] . k_idx[s])                  for s < lens[b, t]
//   picks = the top_k visible s by idx(s), equal scores to the earlier position (as
//           jax.lax.top_k), in position order; every visible s if there are fewer
//   out   = softmax(scale q . k[picks]) v[picks]                        float32 throughout
//
// Three parallel passes: the indexer's scores per (query, block of keys); the selection per
// query (the k-th score, then the picks in position order); the attention per (query, KV
// head), each picked key row loaded once for the G query heads. A query is a row r = b T + t.
//
// Why: XLA:CPU runs the selection as top_k (a sort) and gathers of the picked keys and values
// into new arrays, most of a decode step's attention time for a few MB moved (`python -m
// microbench breakdown --phase decode_attention --attention sparse` shows it).
//
// The selection finds the k-th score among a copy of the scores (nth_element) and takes the
// picks in one pass in position order: no sort, no compares through an index. The indexer pass
// prefetches PFI keys ahead: its jobs stream a few tens of KiB each, too short for the
// hardware's prefetchers to get going.
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "common.h"

struct SparseArgs {
  const float *q, *k, *v, *qi, *wi, *ki;
  const int32_t* lens;
  float* out;
  int64_t B, T, K, G, H, S, I, J, top;
  float scale;
};

constexpr int64_t SB = 256;  // keys per block of the indexer pass
constexpr int64_t PF = 8;    // picked rows ahead to prefetch (every line of the row)
constexpr int64_t PFI = 64;  // indexer keys ahead to prefetch

// idx(s) of query r's keys s0 .. s1, into sc [B T, S].
static void index_scores(const SparseArgs& a, int64_t r, int64_t s0, int64_t s1, float* sc) {
  const int64_t b = r / a.T;
  const float* qi = a.qi + r * a.I * a.J;
  const float* wi = a.wi + r * a.I;
  int64_t s = s0;
#if defined(__AVX512F__)
  // VL keys at a time: per indexer head their VL dot products side by side, then one
  // transpose-sum (a horizontal sum per key and head would cost more than the FMAs)
  const int64_t JV = a.J / VL * VL;
  for (; s + VL <= s1; s += VL) {
    const float* keys = a.ki + (b * a.S + s) * a.J;
    if (s + PFI + VL <= s1)  // the block PFI keys ahead, a line at a time
      for (int64_t l = 0; l < VL * a.J; l += 64 / 4) __builtin_prefetch(keys + PFI * a.J + l);
    vec total = {};
    for (int64_t i = 0; i < a.I; i++) {
      const float* q = qi + i * a.J;
      vec d[VL];
      for (int t = 0; t < VL; t++) d[t] = vec{};
      for (int64_t h = 0; h < JV; h += VL) {
        const vec qh = *(const vec*)(q + h);
        for (int t = 0; t < VL; t++) d[t] += qh * *(const vec*)(keys + t * a.J + h);
      }
      vec dots = sums16(d);
      for (int64_t h = JV; h < a.J; h++)
        for (int t = 0; t < VL; t++) dots[t] += q[h] * keys[t * a.J + h];
      total += wi[i] * (dots > 0.0f ? dots : vec{});
    }
    *(vec*)(sc + r * a.S + s) = total;
  }
#endif
  for (; s < s1; s++) {
    const float* key = a.ki + (b * a.S + s) * a.J;
    float total = 0.0f;
    for (int64_t i = 0; i < a.I; i++) total += wi[i] * std::max(0.0f, dot(qi + i * a.J, key, a.J));
    sc[r * a.S + s] = total;
  }
}

// Query r's picks, in position order, into idx [B T, top]; returns how many (<= top).
static int64_t pick(const SparseArgs& a, int64_t r, const float* sc, int32_t* idx) {
  const int64_t n = a.lens[r], m = std::min(a.top, n);
  int32_t* out = idx + r * a.top;
  if (n <= a.top) {
    std::iota(out, out + n, 0);
    return n;
  }
  // the m-th largest score (a selection over a copy of the scores, contiguous floats), then
  // one pass in position order: every score above it, and of those equal to it the earliest
  // (as jax.lax.top_k), already sorted by position
  // (a NaN score, from NaN or infinite inputs, ranks below every number: the comparisons
  // stay a strict weak order and exactly m picks are written)
  auto key = [](float x) { return x != x ? -INFINITY : x; };
  const float* s = sc + r * a.S;
  std::vector<float> tmp(n);
  for (int64_t i = 0; i < n; i++) tmp[i] = key(s[i]);
  std::nth_element(tmp.begin(), tmp.begin() + (m - 1), tmp.end(), std::greater<float>());
  const float thr = tmp[m - 1];
  int64_t ties = m;
  for (int64_t i = 0; i < n; i++) ties -= key(s[i]) > thr;
  for (int64_t i = 0, c = 0; i < n && c < m; i++)
    if (key(s[i]) > thr || (key(s[i]) == thr && ties-- > 0)) out[c++] = int32_t(i);
  return m;
}

// out[g] = sum over the m picks j of p[g, j] v[picks[j]] for GB heads, head sizes of NH whole
// vectors: the GB x NH sums in registers (summed in memory, each value row added into G rows
// of H floats is a store-to-load chain per key and head, as in attend.cc's general path). What
// remains is the gather's latency: the picked rows lie anywhere in the cache, so the kernel
// reads its bytes well below the memory's streaming speed.
template <int NH, int GB>
static void values_picks(const float* vb, const int32_t* picks, int64_t m, const float* p,
                         int64_t pstride, float* out) {
  constexpr int64_t H = NH * VL;
  vec acc[GB][NH];
  for (int g = 0; g < GB; g++)
    for (int h = 0; h < NH; h++) acc[g][h] = vec{};
  for (int64_t j = 0; j < m; j++) {
    const float* val = vb + int64_t(picks[j]) * H;
    if (j + PF < m)
      for (int64_t h = 0; h < H; h += 16) __builtin_prefetch(vb + int64_t(picks[j + PF]) * H + h);
    vec v[NH];
    for (int h = 0; h < NH; h++) v[h] = *(const vec*)(val + h * VL);
    for (int g = 0; g < GB; g++) {
      const vec e = bcast(p[g * pstride + j]);
      for (int h = 0; h < NH; h++) acc[g][h] += e * v[h];
    }
  }
  for (int g = 0; g < GB; g++)
    for (int h = 0; h < NH; h++) *(vec*)(out + g * H + h * VL) = acc[g][h];
}

template <int NH>
static void value_heads(const float* vb, const int32_t* picks, int64_t m, const float* p,
                        int64_t pstride, int64_t G, float* out) {
  constexpr int GMAX = NH <= 4 ? 4 : 2;  // GB x NH <= 16 accumulators
  for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
    const float* pg = p + g0 * pstride;
    float* og = out + g0 * NH * VL;
    switch (std::min<int64_t>(GMAX, G - g0)) {
      case 1: values_picks<NH, 1>(vb, picks, m, pg, pstride, og); break;
      case 2: values_picks<NH, 2>(vb, picks, m, pg, pstride, og); break;
      case 3: values_picks<NH, (GMAX >= 3 ? 3 : 2)>(vb, picks, m, pg, pstride, og); break;
      default: values_picks<NH, GMAX>(vb, picks, m, pg, pstride, og); break;
    }
  }
}

// Query r, KV head kh: the G heads' softmax over the m picked keys, times their values.
static void attend_picks(const SparseArgs& a, int64_t r, int64_t kh, const int32_t* picks,
                         int64_t m) {
  const int64_t G = a.G, H = a.H, b = r / a.T;
  const float* q = a.q + (r * a.K + kh) * G * H;
  const float* kb = a.k + (b * a.K + kh) * a.S * H;
  const float* vb = a.v + (b * a.K + kh) * a.S * H;
  const int64_t mv = (m + VL - 1) / VL * VL;  // a head's scores, padded to whole vectors
  std::vector<float> s(G * mv);
  for (int64_t j = 0; j < std::min<int64_t>(PF, m); j++)
    for (int64_t h = 0; h < H; h += 16) __builtin_prefetch(kb + int64_t(picks[j]) * H + h);
  int64_t j = 0;
#if defined(__AVX512F__)
  // VL picked keys at a time: per head their VL dot products side by side, then one
  // transpose-sum (the rows stay in L1 for the G heads)
  const int64_t HV = H / VL * VL;
  for (; j + VL <= m; j += VL) {
    const float* rows[VL];
    for (int t = 0; t < VL; t++) {
      rows[t] = kb + int64_t(picks[j + t]) * H;
      if (j + t + PF < m)
        for (int64_t h = 0; h < H; h += 16)
          __builtin_prefetch(kb + int64_t(picks[j + t + PF]) * H + h);
    }
    for (int64_t g = 0; g < G; g++) {
      const float* qg = q + g * H;
      vec d[VL];
      for (int t = 0; t < VL; t++) d[t] = vec{};
      for (int64_t h = 0; h < HV; h += VL) {
        const vec qh = *(const vec*)(qg + h);
        for (int t = 0; t < VL; t++) d[t] += qh * *(const vec*)(rows[t] + h);
      }
      vec sg = sums16(d);
      for (int64_t h = HV; h < H; h++)
        for (int t = 0; t < VL; t++) sg[t] += qg[h] * rows[t][h];
      *(vec*)(s.data() + g * mv + j) = a.scale * sg;
    }
  }
#endif
  for (; j < m; j++) {  // the last picks, one at a time
    const float* key = kb + int64_t(picks[j]) * H;
    for (int64_t g = 0; g < G; g++) s[g * mv + j] = a.scale * dot(q + g * H, key, H);
  }
  for (int64_t g = 0; g < G; g++) {  // each head's softmax over the picks
    float* sg = s.data() + g * mv;
    for (int64_t t = m; t < mv; t++) sg[t] = -INFINITY;  // exp -> ~0
    const float mx = *std::max_element(sg, sg + m);
    vec sum = {};
    for (int64_t t = 0; t < mv; t += VL) {
      const vec e = vexp(*(vec*)(sg + t) - mx);
      *(vec*)(sg + t) = e;
      sum += e;
    }
    const float inv = 1.0f / hsum(sum);
    for (int64_t t = 0; t < m; t++) sg[t] *= inv;
  }
  float* out = a.out + (r * a.K + kh) * G * H;
  const int64_t NH = H / VL;
  if (H % VL == 0 && (NH == 1 || NH == 2 || NH == 4 || NH == 8)) {
    switch (NH) {  // the accumulators in registers, heads in groups
      case 1: value_heads<1>(vb, picks, m, s.data(), mv, G, out); break;
      case 2: value_heads<2>(vb, picks, m, s.data(), mv, G, out); break;
      case 4: value_heads<4>(vb, picks, m, s.data(), mv, G, out); break;
      default: value_heads<8>(vb, picks, m, s.data(), mv, G, out); break;
    }
    return;
  }
  std::vector<float> acc(G * H, 0.0f);  // other head sizes: the sums in memory
  for (int64_t j = 0; j < m; j++) {  // each picked value row loaded once for the G heads
    const float* val = vb + int64_t(picks[j]) * H;
    if (j + PF < m)
      for (int64_t h = 0; h < H; h += 16) __builtin_prefetch(vb + int64_t(picks[j + PF]) * H + h);
    for (int64_t g = 0; g < G; g++) {
      const float p = s[g * mv + j];
      float* o = acc.data() + g * H;
      int64_t h = 0;
      for (; h + VL <= H; h += VL) *(vec*)(o + h) += p * *(const vec*)(val + h);
      for (; h < H; h++) o[h] += p * val[h];
    }
  }
  std::memcpy(out, acc.data(), sizeof(float) * G * H);
}

static ffi::Error SparseAttend(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                               ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                               ffi::Buffer<ffi::F32> q_idx, ffi::Buffer<ffi::F32> w_idx,
                               ffi::Buffer<ffi::F32> k_idx, ffi::Buffer<ffi::S32> lens,
                               ffi::ResultBuffer<ffi::F32> out, int64_t top_k, float scale) {
  const auto qd = q.dimensions(), kd = k.dimensions(), qi = q_idx.dimensions();
  const auto wi = w_idx.dimensions(), ki = k_idx.dimensions(), ld = lens.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || v.dimensions().size() != 4 || qi.size() != 4 ||
      wi.size() != 3 || ki.size() != 3 || ld.size() != 2)
    return ffi::Error::InvalidArgument(
        "sparse_attend: q [B, T, K, G, H], k and v [B, K, S, H], q_idx [B, T, I, J], w_idx "
        "[B, T, I], k_idx [B, S, J], lens [B, T]");
  const int64_t B = qd[0], T = qd[1], K = qd[2], G = qd[3], H = qd[4], S = kd[2];
  const int64_t I = qi[2], J = qi[3];
  bool ok = kd[0] == B && kd[1] == K && kd[3] == H && qi[0] == B && qi[1] == T &&
            wi[0] == B && wi[1] == T && wi[2] == I && ki[0] == B && ki[1] == S &&
            ki[2] == J && ld[0] == B && ld[1] == T && S >= 1 && top_k >= 1;
  for (int i = 0; i < 4; i++) ok = ok && v.dimensions()[i] == kd[i];
  if (!ok)
    return ffi::Error::InvalidArgument(
        "sparse_attend: shapes disagree (q [B, T, K, G, H], k and v [B, K, S, H], q_idx [B, T, "
        "I, J], w_idx [B, T, I], k_idx [B, S, J], lens [B, T]) or top_k < 1");
  const int32_t* len = lens.typed_data();
  const int64_t rows = B * T;
  for (int64_t r = 0; r < rows; r++)
    if (len[r] < 1 || len[r] > S)
      return ffi::Error::InvalidArgument("sparse_attend: lens[b, t] must be in [1, S]");
  const SparseArgs a{q.typed_data(), k.typed_data(), v.typed_data(), q_idx.typed_data(),
                     w_idx.typed_data(), k_idx.typed_data(), len, out->typed_data(),
                     B, T, K, G, H, S, I, J, top_k, scale};
  std::vector<float> sc(rows * S);
  std::vector<int32_t> idx(rows * top_k);
  std::vector<int64_t> count(rows);
  float* scp = sc.data();
  int32_t* idxp = idx.data();
  int64_t* cnt = count.data();
  const int64_t blocks = (S + SB - 1) / SB;
  parallel_for(pool, rows * blocks, [=](int64_t job) {
    const int64_t r = job / blocks, s0 = job % blocks * SB;
    const int64_t s1 = std::min<int64_t>(len[r], s0 + SB);
    if (s0 < s1) index_scores(a, r, s0, s1, scp);
  });
  parallel_for(pool, rows, [=](int64_t r) { cnt[r] = pick(a, r, scp, idxp); });
  parallel_for(pool, rows * K, [=](int64_t job) {
    const int64_t r = job / K;
    attend_picks(a, r, job % K, idxp + r * top_k, cnt[r]);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SparseAttendF32, SparseAttend,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, K, G, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B, K, S, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, K, S, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q_idx [B, T, I, J]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_idx [B, T, I]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k_idx [B, S, J]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lens [B, T]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, K, G, H]
                                  .Attr<int64_t>("top_k")
                                  .Attr<float>("scale"));
