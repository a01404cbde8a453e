// Prefill attention: T queries per sequence over its contiguous keys and values, the scores
// and the softmax of each block of query rows kept in the core's L2 instead of going through
// memory, and both products in `panels.h`'s GEMM tile.
//
// q [B, T, K, G, H] (G query heads per KV head), k, v [B, K, S, H] (the cache, or the chunk's
// own keys), lens int32 [B, T]: query t of sequence b sees keys at positions < lens[b, t]
// (causal: its position + 1). out [B, T, K, G, H] = softmax(scale q.k over the seen keys) v,
// float32 throughout. Every key's score is computed, seen or not (masked ones are then set
// to -inf), as XLA's attention does and as the cost model counts (refmodel/counting.py:
// masked pairs counted): skipping the blocks above the causal diagonal would halve a
// prefill's attention work, and the count would have to say so.
//
// Per (sequence, KV head) the M = T G query rows (row t G + g) share the head's keys, so
// attention is two GEMMs per block of rows: scores [rows, S] = Q [rows, H] K^T, then out
// [rows, H] = softmax(scores) [rows, S] V. Keys are packed once per (sequence, KV head) as the
// scores' weight in panels, kt [ceil(S / 32), H, 32] (32 keys side by side per dimension h),
// values as the output product's, vt [ceil(H / 32), S, 32]; keys past S and dimensions past H
// are zeros. A job is a block of rows of one (sequence, KV head): its scores (rows x S floats)
// stay in L2 between the two products, its softmax runs over each row's own seen keys (exp:
// common.h's `vexp`).
//
// Why: XLA:CPU runs the same attention (common.py's `attend_rows`: batched einsums over blocks
// of 256 queries) by writing the [B, K, G, 256, S] scores to memory, masking, soft-maxing and
// reading them back, at a fraction of the speed its own einsums reach alone (`python -m
// microbench breakdown --phase prefill` shows the attention's share of a prefill).
//
// A job's buffers are the thread's scratch, kept between calls (`scratch`), and a row's masked
// keys get exp 0 without computing it.
#include <cmath>
#include <cstring>

#include "panels.h"

struct RowsArgs {
  const float *q, *k, *v;
  const int32_t* lens;
  float* out;
  int64_t B, T, K, G, H, S, SP, HP;  // SP, HP: S and H rounded up to whole panels
  float scale;
};

// Keys and values of (b, kh) into panels: kt [SP / PANEL, H, PANEL], vt [HP / PANEL, SP, PANEL].
static void pack_kv(const RowsArgs& a, int64_t b, int64_t kh, float* kt, float* vt) {
  const float* kb = a.k + (b * a.K + kh) * a.S * a.H;
  const float* vb = a.v + (b * a.K + kh) * a.S * a.H;
  std::memset(kt, 0, sizeof(float) * a.SP * a.H);
  std::memset(vt, 0, sizeof(float) * a.HP * a.SP);
  for (int64_t s = 0; s < a.S; s++)
    for (int64_t h = 0; h < a.H; h++) {
      kt[((s / PANEL) * a.H + h) * PANEL + s % PANEL] = kb[s * a.H + h];
      vt[((h / PANEL) * a.SP + s) * PANEL + h % PANEL] = vb[s * a.H + h];
    }
}

// This thread's scratch of at least n floats, kept between calls: allocated per job, a block's
// buffers (hundreds of KiB at a thousand keys) would go back to the OS and be faulted in again
// (mmap, page faults, zeroing) every job.
static float* scratch(int64_t n) {
  static thread_local std::vector<float> buf;
  if (int64_t(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// Rows r0 .. r0 + rows of (b, kh) (row t G + g): scores, softmax, values, into out.
static void rows_job(const RowsArgs& a, int64_t b, int64_t kh, int64_t r0, int64_t rows,
                     const float* kt, const float* vt) {
  const int64_t H = a.H, SP = a.SP, HP = a.HP, G = a.G;
  float* x = scratch(rows * (std::max(H, SP) + SP + HP + H + 1));  // x, s, o, qr, sum
  float* s = x + rows * std::max(H, SP);
  float* o = s + rows * SP;
  float* qr = o + rows * HP;
  float* sum = qr + rows * H;
  // the rows' queries, scaled, as x [rows, H]; packed in blocks of MB rows
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = (r0 + r) / G, g = (r0 + r) % G;
    const float* qs = a.q + (((b * a.T + t) * a.K + kh) * G + g) * H;
    for (int64_t h = 0; h < H; h++) qr[r * H + h] = qs[h] * a.scale;
  }
  pack(qr, x, rows, H);
  for (int64_t p = 0; p < SP / PANEL; p++) panel(x, kt, (const float*)nullptr, s, rows, H, SP, p);
  // Each row over its own seen keys n: their max and exps, the rest 0 (exp(-inf)): the exps
  // of the masked keys are not computed (their scores were, as counted).
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = (r0 + r) / G;
    const int64_t n = std::clamp<int64_t>(a.lens[b * a.T + t], 1, a.S);
    const int64_t nv = (n + VL - 1) / VL * VL;  // whole vectors: SP is a multiple of VL
    float* sr = s + r * SP;
    for (int64_t j = n; j < nv; j++) sr[j] = -INFINITY;
    vec mv = bcast(sr[0]);
    for (int64_t j = 0; j < nv; j += VL) {
      const vec v = *(vec*)(sr + j);
      mv = v > mv ? v : mv;
    }
    float mx = mv[0];
    for (int64_t l = 1; l < VL; l++) mx = std::max(mx, mv[l]);
    const vec m = bcast(mx);
    vec acc = {};
    for (int64_t j = 0; j < nv; j += VL) {
      const vec e = vexp(*(vec*)(sr + j) - m);
      *(vec*)(sr + j) = e;
      acc += e;
    }
    std::memset(sr + nv, 0, sizeof(float) * (SP - nv));
    sum[r] = hsum(acc);
  }
  pack(s, x, rows, SP);
  for (int64_t c = 0; c < HP / PANEL; c++) panel(x, vt, (const float*)nullptr, o, rows, SP, HP, c);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = (r0 + r) / G, g = (r0 + r) % G;
    float* dst = a.out + (((b * a.T + t) * a.K + kh) * G + g) * H;
    const float inv = 1.0f / sum[r];
    for (int64_t h = 0; h < H; h++) dst[h] = o[r * HP + h] * inv;
  }
}

static ffi::Error AttendRows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                             ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                             ffi::Buffer<ffi::S32> lens, ffi::ResultBuffer<ffi::F32> out,
                             float scale) {
  const auto qd = q.dimensions(), kd = k.dimensions(), ld = lens.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || ld.size() != 2 || v.dimensions().size() != 4)
    return ffi::Error::InvalidArgument(
        "attend_rows: q [B, T, K, G, H], k and v [B, K, S, H], lens [B, T]");
  const int64_t B = qd[0], T = qd[1], K = qd[2], G = qd[3], H = qd[4], S = kd[2];
  for (int i = 0; i < 4; i++)
    if (v.dimensions()[i] != kd[i])
      return ffi::Error::InvalidArgument("attend_rows: k and v of one shape");
  if (kd[0] != B || kd[1] != K || kd[3] != H || ld[0] != B || ld[1] != T || S < 1)
    return ffi::Error::InvalidArgument(
        "attend_rows: k and v [B, K, S, H] with q's B, K and H; lens [B, T] with q's B, T");
  const int64_t SP = (S + PANEL - 1) / PANEL * PANEL, HP = (H + PANEL - 1) / PANEL * PANEL;
  const RowsArgs a{q.typed_data(), k.typed_data(), v.typed_data(), lens.typed_data(),
                   out->typed_data(), B, T, K, G, H, S, SP, HP, scale};
  // every (b, kh)'s keys and values in panels, then the row blocks: `rows` rows of scores in
  // ~256 KiB (at least one tile of MB rows, at most 4)
  auto packed = std::make_shared<std::vector<float>>(B * K * (SP * H + HP * SP));
  float* kv = packed->data();
  const int64_t per = SP * H + HP * SP;
  parallel_for(pool, B * K, [=](int64_t bk) {
    pack_kv(a, bk / K, bk % K, kv + bk * per, kv + bk * per + SP * H);
  });
  const int64_t M = T * G;
  const int64_t rows = std::clamp<int64_t>((65536 / SP) / MB * MB, MB, 4 * MB);
  const int64_t blocks = (M + rows - 1) / rows;
  parallel_for(pool, B * K * blocks, [=](int64_t job) {
    const int64_t bk = job / blocks, r0 = job % blocks * rows;
    const float* kt = kv + bk * per;
    rows_job(a, bk / K, bk % K, r0, std::min(rows, M - r0), kt, kt + SP * H);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttendRowsF32, AttendRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, K, G, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B, K, S, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, K, S, H]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lens [B, T]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, K, G, H]
                                  .Attr<float>("scale"));
