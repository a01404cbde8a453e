// Paged decode attention: one query per sequence attends over its keys and values where they
// lie, in the serving engine's pages, with no contiguous copy (vLLM's PagedAttention, for a
// CPU). The engine's other path gathers the pages into a view first (pages.cc), a write and a
// read of every cached byte more than a contiguous cache's decode.
//
// q [B, K, G, H]: the step's query, G query heads per KV head (GQA; MHA G = 1, MQA K = 1).
// k, v [pages, K, page, H]: pages of keys and values, head-major as the engine stores GQA's
// cache.
// tables int32 [B, n]: each sequence's pages in token order. lens int32 [B]: keys at positions
// < lens[b] are seen (the query's own position + 1: causal). out [B, K, G, H].
// scores = scale q.k over the keys, softmax, times v: float32 throughout.
//
// The general path, any head size: per (sequence, KV head), page by page, an online softmax
// (Milakov & Gimelshein 2018, as FlashAttention): the page's scores for the G heads (each key
// row loaded once for all G), their running max, and the accumulators rescaled when it grows;
// then each value row, loaded once, added into the G accumulators. Keys and values are read
// once, as they lie. exp is a vectorised polynomial (Cephes' expf: range reduction by ln 2,
// degree-6 polynomial, ~1e-7 relative): scalar expf per score costs more than the whole
// attention's reads. Its accumulators live in memory (a store-to-load chain per key and head),
// so it is compute-bound from a few query heads per KV head: head sizes of whole vectors take
// the fast path (`chunked`) instead.
#include <cmath>
#include <cstring>

#include "common.h"

static inline void axpy(float* y, float a, const float* x, int64_t H) {  // y += a x
  int64_t h = 0;
  for (; h + VL <= H; h += VL) *(vec*)(y + h) += a * *(const vec*)(x + h);
  for (; h < H; h++) y[h] += a * x[h];
}

// The G scores of one key: its H numbers loaded once for all G query heads of its KV head.
static inline void scores(const float* q, const float* key, int64_t G, int64_t H, float scale,
                          float* out, int64_t stride) {
  for (int64_t g = 0; g < G; g++) {
    const float* qg = q + g * H;
    vec acc = {};
    int64_t h = 0;
    for (; h + VL <= H; h += VL) acc += *(const vec*)(qg + h) * *(const vec*)(key + h);
    float s = hsum(acc);
    for (; h < H; h++) s += qg[h] * key[h];
    out[g * stride] = scale * s;
  }
}

// The fast path, for head sizes of 1, 2, 4 or 8 whole vectors (H = 16, 32, 64, 128 with
// AVX-512; other sizes take the general path, one job per sequence and KV head): the keys are
// cut into chunks per (sequence, KV head), so that even one sequence of an MQA layer (B K = 1)
// keeps every core busy (flash-decoding's split over the keys); the calling thread combines
// the chunks' maxima, sums and outputs (the online softmax's rescaling, once per chunk). The
// accumulators are held in registers. Chunks are as long as CH_MAX while every thread still
// gets JOBS_PER_THREAD jobs: fewer, longer chunks stream better.
//
// One query head per KV head (MHA): within a chunk, blocks of VL keys in one pass (`chunk`):
// the block's scores (a transpose-sum of VL dot products), its max, the accumulators rescaled
// when the running max grows (rarely after the first blocks), its exps, then its value rows
// into the accumulators, keys and values read together; PFK rows ahead are prefetched into L2
// (into L1, more lines would be in flight than a core's L1 can track).
// Two or more (GQA, MQA): the chunk in two passes (`chunk_plain`): every score, one softmax,
// every value. The one-pass loop puts a block's rescale, exps and value updates between one
// block's key loads and the next, so out of cache a core runs out of loads to start and reads
// below the memory's speed; the two passes' loops carry little but loads and FMAs and stream,
// and the hardware's prefetchers keep up with them (software prefetch there only adds loads).
// With one query head a key's work is too small for that to matter, and the single pass over
// keys and values together wins. Each key's offset is made page by page, not by a division
// per key (`offsets`). `python -m microbench breakdown --phase decode_attention` times the
// kernel in a decode step.
struct Args {
  const float *q, *k, *v;
  const int32_t *tables, *lens;
  float* out;
  int64_t B, K, G, H, PS, n;
  float scale;
};

constexpr int64_t CH_MAX = 1024, CH_MIN = 64;  // keys per chunk
constexpr int64_t JOBS_PER_THREAD = 4;
constexpr int64_t PFK = 16;  // key and value rows ahead to prefetch

// Each key's row in [t0, t1) of sequence b's KV head kh, page by page (a division per key
// would cost a large share of the in-cache time).
static void offsets(const Args& a, int64_t b, int64_t kh, int64_t t0, int64_t t1, int64_t* off) {
  const int32_t* table = a.tables + b * a.n;
  const int64_t cnt = t1 - t0;
  for (int64_t j = 0, tok = t0; j < cnt;) {
    const int64_t p = tok / a.PS, in = tok - p * a.PS, run = std::min(cnt - j, a.PS - in);
    const int64_t base = ((table[p] * a.K + kh) * a.PS + in) * a.H;
    for (int64_t i = 0; i < run; i++) off[j + i] = base + i * a.H;
    j += run, tok += run;
  }
}

// The GB query heads from g0 of (sequence b, KV head kh), scaled, in registers.
template <int NH, int GB>
static inline void load_queries(const Args& a, int64_t b, int64_t kh, int64_t g0,
                                vec (&qv)[GB][NH]) {
  for (int g = 0; g < GB; g++)
    for (int h = 0; h < NH; h++)
      qv[g][h] = *(const vec*)(a.q + ((b * a.K + kh) * a.G + g0 + g) * NH * VL + h * VL) *
                 a.scale;
}

#if defined(__AVX512F__)
// One query head's scores of the VL keys at off[0 .. VL): their dot products side by side
// (q [NH] vectors), then one transpose-sum: lane i is key i's score.
template <int NH>
static inline vec block_scores(const float* k, const int64_t* off, const vec* q) {
  vec d[VL];
  for (int i = 0; i < VL; i++) {
    const float* kr = k + off[i];
    d[i] = q[0] * *(const vec*)kr;
    for (int h = 1; h < NH; h++) d[i] += q[h] * *(const vec*)(kr + h * VL);
  }
  return sums16(d);
}
#endif

// acc[g] += p[g, i] v[off[i]] over n keys: each value row loaded once for the GB heads.
template <int NH, int GB>
static inline void add_values(const float* v, const int64_t* off, int64_t n, const float* p,
                              int64_t pstride, vec (&acc)[GB][NH]) {
  for (int64_t i = 0; i < n; i++) {
    const float* vr = v + off[i];
    vec vv[NH];
    for (int h = 0; h < NH; h++) vv[h] = *(const vec*)(vr + h * VL);
    for (int g = 0; g < GB; g++) {
      const vec e = bcast(p[g * pstride + i]);
      for (int h = 0; h < NH; h++) acc[g][h] += e * vv[h];
    }
  }
}

// One chunk [t0, t1) of sequence b's keys (at most CH_MAX) for KV head kh and query heads
// g0 .. g0 + GB: writes m, l [GB] (the chunk's max score and sum of exp) and acc [GB, H] (not
// yet divided by l). `chunk_plain` has the same contract.
template <int NH, int GB>
static void chunk(const Args& a, int64_t b, int64_t kh, int64_t g0, int64_t t0, int64_t t1,
                  float* m_out, float* l_out, float* acc_out) {
  const int64_t H = NH * VL, cnt = t1 - t0;
  vec qv[GB][NH];
  load_queries(a, b, kh, g0, qv);
  int64_t off[CH_MAX];
  offsets(a, b, kh, t0, t1, off);
  auto fetch = [&](int64_t i) {  // key and value row i into L2
    for (int h = 0; h < NH; h++) {
      __builtin_prefetch(a.k + off[i] + h * VL, 0, 2);
      __builtin_prefetch(a.v + off[i] + h * VL, 0, 2);
    }
  };
  for (int64_t i = 0; i < std::min<int64_t>(PFK, cnt); i++) fetch(i);
  vec acc[GB][NH], lsum[GB];
  float m[GB];
  for (int g = 0; g < GB; g++) {
    m[g] = -INFINITY;
    lsum[g] = vec{};
    for (int h = 0; h < NH; h++) acc[g][h] = vec{};
  }
  alignas(64) float p[GB][VL];  // the block's scores, then their exps
  for (int64_t j = 0; j < cnt; j += VL) {
    const int64_t r = std::min<int64_t>(VL, cnt - j);
    for (int64_t i = j + PFK; i < std::min(j + r + PFK, cnt); i++) fetch(i);
    vec sv[GB];
#if defined(__AVX512F__)
    if (r == VL) {  // a whole block: per head, VL dot products and one transpose-sum
      for (int g = 0; g < GB; g++) sv[g] = block_scores<NH>(a.k, off + j, qv[g]);
    } else
#endif
    {  // the last, partial block (or no AVX-512): each key row loaded once for the heads
      for (int g = 0; g < GB; g++)
        for (int i = r; i < VL; i++) p[g][i] = -INFINITY;  // exp -> ~0
      for (int i = 0; i < r; i++) {
        const float* kr = a.k + off[j + i];
        vec kv[NH];
        for (int h = 0; h < NH; h++) kv[h] = *(const vec*)(kr + h * VL);
        for (int g = 0; g < GB; g++) {
          vec d = qv[g][0] * kv[0];
          for (int h = 1; h < NH; h++) d += qv[g][h] * kv[h];
          p[g][i] = hsum(d);
        }
      }
      for (int g = 0; g < GB; g++) std::memcpy(&sv[g], p[g], sizeof(vec));
    }
    for (int g = 0; g < GB; g++) {
      float bm = sv[g][0];
      for (int i = 1; i < VL; i++) bm = std::max(bm, sv[g][i]);
      if (bm > m[g]) {  // the running max grows: rescale what is summed so far
        const float c = std::exp(m[g] - bm);  // 0 on the first block (m = -inf)
        for (int h = 0; h < NH; h++) acc[g][h] *= c;
        lsum[g] *= c;
        m[g] = bm;
      }
      sv[g] = vexp(sv[g] - m[g]);
      lsum[g] += sv[g];
      std::memcpy(p[g], &sv[g], sizeof(vec));
    }
    add_values(a.v, off + j, r, &p[0][0], VL, acc);
  }
  for (int g = 0; g < GB; g++) {
    m_out[g] = m[g];
    l_out[g] = hsum(lsum[g]);
    for (int h = 0; h < NH; h++) *(vec*)(acc_out + g * H + h * VL) = acc[g][h];
  }
}

// The chunk in two passes, for GB >= 2 query heads: every score of the chunk (the key rows
// alone: a block's transpose-sums per head, kept with their lane-wise max), one softmax over
// them (the max, then the exps in whole vectors), then every value row, loaded once for the GB
// heads. Against `chunk` its loop carries no rescale and no exp between the loads, so the core
// runs further ahead over the rows; it reads the chunk's keys, then its values.
template <int NH, int GB>
static void chunk_plain(const Args& a, int64_t b, int64_t kh, int64_t g0, int64_t t0,
                        int64_t t1, float* m_out, float* l_out, float* acc_out) {
  const int64_t H = NH * VL, cnt = t1 - t0, full = cnt / VL * VL;
  vec qv[GB][NH];
  load_queries(a, b, kh, g0, qv);
  int64_t off[CH_MAX];
  offsets(a, b, kh, t0, t1, off);
  alignas(64) float s[GB][CH_MAX + VL];  // the scores, then their exps; padded to whole vectors
  vec mx[GB];  // lane-wise running max of the whole blocks' scores
  for (int g = 0; g < GB; g++) mx[g] = vec{} - INFINITY;
#if defined(__AVX512F__)
  for (int64_t j = 0; j < full; j += VL)
    for (int g = 0; g < GB; g++) {
      const vec sv = block_scores<NH>(a.k, off + j, qv[g]);
      mx[g] = mx[g] > sv ? mx[g] : sv;
      std::memcpy(&s[g][j], &sv, sizeof(vec));
    }
  const int64_t rest = full;
#else
  const int64_t rest = 0;
#endif
  for (int64_t i = rest; i < cnt; i++) {  // the last, partial block (or no AVX-512)
    const float* kr = a.k + off[i];
    for (int g = 0; g < GB; g++) {
      vec d = qv[g][0] * *(const vec*)kr;
      for (int h = 1; h < NH; h++) d += qv[g][h] * *(const vec*)(kr + h * VL);
      s[g][i] = hsum(d);
    }
  }
  vec lsum[GB];
  for (int g = 0; g < GB; g++) {
    float m = mx[g][0];
    for (int i = 1; i < VL; i++) m = std::max(m, mx[g][i]);
    for (int64_t i = rest; i < cnt; i++) m = std::max(m, s[g][i]);
    for (int64_t i = cnt; i < full + VL; i++) s[g][i] = -INFINITY;  // exp -> ~0
    lsum[g] = vec{};
    for (int64_t j = 0; j < cnt; j += VL) {
      vec e;
      std::memcpy(&e, &s[g][j], sizeof(vec));
      e = vexp(e - m);
      lsum[g] += e;
      std::memcpy(&s[g][j], &e, sizeof(vec));
    }
    m_out[g] = m;
  }
  vec acc[GB][NH];
  for (int g = 0; g < GB; g++)
    for (int h = 0; h < NH; h++) acc[g][h] = vec{};
  add_values(a.v, off, cnt, &s[0][0], CH_MAX + VL, acc);
  for (int g = 0; g < GB; g++) {
    l_out[g] = hsum(lsum[g]);
    for (int h = 0; h < NH; h++) *(vec*)(acc_out + g * H + h * VL) = acc[g][h];
  }
}

template <int NH>
static void chunk_heads(const Args& a, int64_t b, int64_t kh, int64_t t0, int64_t t1, float* m,
                        float* l, float* acc) {
  constexpr int GMAX = NH <= 4 ? 4 : 2;  // GB x NH <= 16 accumulators, 16 query vectors
  for (int64_t g0 = 0; g0 < a.G; g0 += GMAX) {
    float* mg = m + g0;
    float* lg = l + g0;
    float* ag = acc + g0 * NH * VL;
    switch (std::min<int64_t>(GMAX, a.G - g0)) {
      case 1: chunk<NH, 1>(a, b, kh, g0, t0, t1, mg, lg, ag); break;
      case 2: chunk_plain<NH, 2>(a, b, kh, g0, t0, t1, mg, lg, ag); break;
      case 3: chunk_plain<NH, (GMAX >= 3 ? 3 : 2)>(a, b, kh, g0, t0, t1, mg, lg, ag); break;
      default: chunk_plain<NH, GMAX>(a, b, kh, g0, t0, t1, mg, lg, ag); break;
    }
  }
}

static void chunked(const Args& a, ffi::ThreadPool& pool) {
  int64_t longest = 0;
  for (int64_t b = 0; b < a.B; b++) longest = std::max<int64_t>(longest, a.lens[b]);
  // the longest chunks that still give every thread JOBS_PER_THREAD jobs
  const int64_t want = JOBS_PER_THREAD * std::max<int64_t>(1, pool.num_threads());
  int64_t CH = CH_MAX;
  while (CH > CH_MIN && a.B * a.K * ((longest + CH - 1) / CH) < want) CH /= 2;
  const int64_t C = (longest + CH - 1) / CH, G = a.G, H = a.H;  // C chunks
  // per (b, kh, c): m [G], l [G], acc [G, H]
  auto part = std::make_shared<std::vector<float>>(a.B * a.K * C * G * (H + 2));
  float* pp = part->data();
  const Args args = a;
  parallel_for(pool, a.B * a.K * C, [=](int64_t job) {
    const int64_t c = job % C, bk = job / C, b = bk / args.K, kh = bk % args.K;
    const int64_t t0 = c * CH, t1 = std::min<int64_t>(args.lens[b], t0 + CH);
    float* m = pp + job * G * (H + 2);
    float* l = m + G;
    float* acc = l + G;
    if (t0 >= t1) {
      for (int64_t g = 0; g < G; g++) m[g] = -INFINITY, l[g] = 0.0f;
      return;
    }
    switch (H / VL) {
      case 1: chunk_heads<1>(args, b, kh, t0, t1, m, l, acc); break;
      case 2: chunk_heads<2>(args, b, kh, t0, t1, m, l, acc); break;
      case 4: chunk_heads<4>(args, b, kh, t0, t1, m, l, acc); break;
      default: chunk_heads<8>(args, b, kh, t0, t1, m, l, acc); break;
    }
  });
  for (int64_t bk = 0; bk < a.B * a.K; bk++)  // combine the chunks: rescale to one max
    for (int64_t g = 0; g < G; g++) {
      float mx = -INFINITY, sum = 0.0f;
      for (int64_t c = 0; c < C; c++) mx = std::max(mx, pp[(bk * C + c) * G * (H + 2) + g]);
      float* o = a.out + (bk * G + g) * H;
      for (int64_t h = 0; h < H; h++) o[h] = 0.0f;
      for (int64_t c = 0; c < C; c++) {
        const float* m = pp + (bk * C + c) * G * (H + 2);
        if (m[G + g] == 0.0f) continue;  // an empty chunk
        const float w = std::exp(m[g] - mx);
        sum += m[G + g] * w;
        const float* acc = m + 2 * G + g * H;
        for (int64_t h = 0; h < H; h++) o[h] += w * acc[h];
      }
      for (int64_t h = 0; h < H; h++) o[h] /= sum;
    }
}

static ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                                 ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                                 ffi::Buffer<ffi::S32> tables, ffi::Buffer<ffi::S32> lens,
                                 ffi::ResultBuffer<ffi::F32> out, float scale) {
  const auto qd = q.dimensions(), kd = k.dimensions(), td = tables.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || td.size() != 2 || v.dimensions().size() != 4 ||
      lens.dimensions().size() != 1)
    return ffi::Error::InvalidArgument(
        "paged_attention: q [B, K, G, H], k and v pages [pages, K, page, H], tables [B, n], "
        "lens [B]");
  const int64_t B = qd[0], K = qd[1], G = qd[2], H = qd[3];
  const int64_t pages = kd[0], PS = kd[2], n = td[1];
  for (int i = 0; i < 4; i++)
    if (v.dimensions()[i] != kd[i])
      return ffi::Error::InvalidArgument("paged_attention: k and v pages of one shape");
  if (kd[1] != K || kd[3] != H || td[0] != B || lens.dimensions()[0] != B || pages < 1 ||
      PS < 1)
    return ffi::Error::InvalidArgument(
        "paged_attention: q's K and H must be the pages' and tables and lens one row per "
        "sequence");
  const int32_t* t = tables.typed_data();
  const int32_t* len = lens.typed_data();
  for (int64_t b = 0; b < B; b++) {
    if (len[b] < 1 || len[b] > n * PS)
      return ffi::Error::InvalidArgument("paged_attention: lens[b] must be in [1, n x page]");
    for (int64_t i = 0; i < (len[b] + PS - 1) / PS; i++)
      if (t[b * n + i] < 0 || t[b * n + i] >= pages)
        return ffi::Error::InvalidArgument(
            "paged_attention: a page id in tables is outside [0, pages)");
  }
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  float* op = out->typed_data();
  const int64_t NH = H / VL;
  if (H % VL == 0 && (NH == 1 || NH == 2 || NH == 4 || NH == 8)) {
    chunked({qp, kp, vp, t, len, op, B, K, G, H, PS, n, scale}, pool);
    return ffi::Error::Success();
  }
  const int64_t PSV = (PS + VL - 1) / VL * VL;  // a page's scores, padded to whole vectors
  parallel_for(pool, B * K, [=](int64_t job) {
    const int64_t b = job / K, kh = job % K;
    const float* qj = qp + job * G * H;  // q[b, kh]: G rows of H
    std::vector<float> acc(G * H, 0.0f), s(G * PSV), m(G, -INFINITY), l(G, 0.0f);
    for (int64_t i = 0; i * PS < len[b]; i++) {
      const int64_t page = t[b * n + i], cnt = std::min<int64_t>(PS, len[b] - i * PS);
      const float* kpg = kp + (page * K + kh) * PS * H;  // k[page, kh]: PS rows of H
      const float* vpg = vp + (page * K + kh) * PS * H;
      for (int64_t p = 0; p < cnt; p++) scores(qj, kpg + p * H, G, H, scale, s.data() + p, PSV);
      for (int64_t g = 0; g < G; g++) {  // the softmax's running max, sum and rescale
        float* sg = s.data() + g * PSV;
        float mx = m[g];
        for (int64_t p = 0; p < cnt; p++) mx = std::max(mx, sg[p]);
        for (int64_t p = cnt; p < PSV; p++) sg[p] = -INFINITY;  // exp -> ~0
        const float corr = std::exp(m[g] - mx);  // 0 on the first page (m = -inf)
        m[g] = mx;
        vec sum = {};
        for (int64_t p = 0; p < PSV; p += VL) {
          const vec e = vexp(*(vec*)(sg + p) - mx);
          *(vec*)(sg + p) = e;
          sum += e;
        }
        l[g] = l[g] * corr + hsum(sum);
        if (corr != 1.0f)
          for (int64_t h = 0; h < H; h++) acc[g * H + h] *= corr;
      }
      for (int64_t p = 0; p < cnt; p++)  // each value row loaded once for the G heads
        for (int64_t g = 0; g < G; g++) axpy(acc.data() + g * H, s[g * PSV + p], vpg + p * H, H);
    }
    float* oj = op + job * G * H;
    for (int64_t g = 0; g < G; g++)
      for (int64_t h = 0; h < H; h++) oj[g * H + h] = acc[g * H + h] / l[g];
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedAttentionF32, PagedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, K, G, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [pages, K, page, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [pages, K, page, H]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // tables [B, n]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lens [B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, K, G, H]
                                  .Attr<float>("scale"));
