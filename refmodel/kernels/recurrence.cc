// One decode step of a linear-attention layer's recurrence (refmodel/attention/linear_scan.py's
// `recurrent` at one token): the state read once from memory and written once, in place.
//
// state [B, N, H, U] float32 (N = K G value heads: K key heads, G value heads per key head;
// an H x U matrix each, as the layer's cache holds it), q and k [B, K, H], v [B, K, G, U], g
// and beta [B, K, G]. Per value head, with a = exp(g) and st its H x U state matrix:
//
//   v'   = v - a k st           (the gated delta rule; Mamba-2 keeps v)
//   u    = beta v'
//   st'  = a st + k u^T         (decay, rank-1 write)
//   o    = q st'                -> out [B, K, G, U]
//
// Per block of channels (64 at a time with AVX-512), two passes over the head's H rows: k st
// (the delta rule only) reads the state from memory; the update reads it again from L1,
// writes st' where st was and sums q st' as it goes, every sum in registers. Runs of adjacent
// heads are the parallel jobs, so each thread streams long stretches of the state.
//
// Why: XLA:CPU runs this step as batched matrix-vector products of one row each, far below the
// memory's speed (`python -m microbench breakdown --phase decode_attention --attention linear`
// shows the step beside its read roof).
#include <cmath>

#include "common.h"

struct StepArgs {
  const float *q, *k, *v, *g, *beta, *state;
  float *state_out, *out;
  int64_t K, G, H, U;
  bool delta;
};

// Channels u0 .. u0 + UB VL of value head j's H x U state st (st_out: where st' goes; may be
// st): the UB vectors of k st, then of st' and q st', in registers over the H rows.
template <int UB>
static void channels(const StepArgs& a, const float* st, float* st_out, const float* q,
                     const float* k, const float* v, float decay, float beta, int64_t u0,
                     float* o) {
  const int64_t H = a.H, U = a.U;
  vec w[UB];  // u = beta (v - decay k st)
  for (int i = 0; i < UB; i++) w[i] = vec{};
  if (a.delta)
    for (int64_t h = 0; h < H; h++) {
      const vec kv = bcast(k[h]);
      for (int i = 0; i < UB; i++) w[i] += kv * *(const vec*)(st + h * U + u0 + i * VL);
    }
  for (int i = 0; i < UB; i++) w[i] = beta * (*(const vec*)(v + u0 + i * VL) - decay * w[i]);
  vec acc[UB];
  for (int i = 0; i < UB; i++) acc[i] = vec{};
  for (int64_t h = 0; h < H; h++) {
    const vec kv = bcast(k[h]), qv = bcast(q[h]);
    for (int i = 0; i < UB; i++) {
      const vec x = decay * *(const vec*)(st + h * U + u0 + i * VL) + kv * w[i];
      *(vec*)(st_out + h * U + u0 + i * VL) = x;
      acc[i] += qv * x;
    }
  }
  for (int i = 0; i < UB; i++) *(vec*)(o + u0 + i * VL) = acc[i];
}

// Value head j = b N + n = (b K + kh) G + gh: its state st [H, U] at state + j H U.
static void head(const StepArgs& a, int64_t j) {
  const int64_t H = a.H, U = a.U, kh = j / a.G;  // kh: (b K + key head), q and k's row
  const float* st = a.state + j * H * U;
  float* st_out = a.state_out + j * H * U;  // may be st itself: each element read, then written
  const float* q = a.q + kh * H;
  const float* k = a.k + kh * H;
  const float* v = a.v + j * U;
  float* o = a.out + j * U;
  const float decay = std::exp(a.g[j]), beta = a.beta[j];
  int64_t u = 0;
  for (; u + 4 * VL <= U; u += 4 * VL) channels<4>(a, st, st_out, q, k, v, decay, beta, u, o);
  for (; u + VL <= U; u += VL) channels<1>(a, st, st_out, q, k, v, decay, beta, u, o);
  for (; u < U; u++) {  // channels past the last whole vector
    float ks = 0.0f;
    if (a.delta)
      for (int64_t h = 0; h < H; h++) ks += k[h] * st[h * U + u];
    const float w = beta * (v[u] - decay * ks);
    float acc = 0.0f;
    for (int64_t h = 0; h < H; h++) {
      const float x = decay * st[h * U + u] + k[h] * w;
      st_out[h * U + u] = x;
      acc += q[h] * x;
    }
    o[u] = acc;
  }
}

static ffi::Error StateStep(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> state,
                            ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> g,
                            ffi::Buffer<ffi::F32> beta, ffi::ResultBuffer<ffi::F32> out,
                            ffi::ResultBuffer<ffi::F32> state_out, int64_t delta) {
  const auto sd = state.dimensions(), qd = q.dimensions(), vd = v.dimensions();
  if (sd.size() != 4 || qd.size() != 3 || k.dimensions().size() != 3 || vd.size() != 4 ||
      g.dimensions().size() != 3 || beta.dimensions().size() != 3)
    return ffi::Error::InvalidArgument(
        "state_step: state [B, K G, H, U], q and k [B, K, H], v [B, K, G, U], g and beta "
        "[B, K, G]");
  const int64_t B = sd[0], K = qd[1], G = vd[2], H = sd[2], U = sd[3];
  bool ok = sd[1] == K * G && qd[0] == B && qd[2] == H && vd[0] == B && vd[1] == K &&
            vd[3] == U;
  for (int i = 0; i < 3; i++)
    ok = ok && k.dimensions()[i] == qd[i] && g.dimensions()[i] == vd[i] &&
         beta.dimensions()[i] == vd[i];
  if (!ok)
    return ffi::Error::InvalidArgument(
        "state_step: shapes disagree (state [B, K G, H, U], q and k [B, K, H], v [B, K, G, "
        "U], g and beta [B, K, G])");
  const StepArgs a{q.typed_data(), k.typed_data(), v.typed_data(), g.typed_data(),
                   beta.typed_data(), state.typed_data(), state_out->typed_data(),
                   out->typed_data(), K, G, H, U, delta != 0};
  // jobs of whole runs of adjacent heads, 4 per thread: each thread streams long stretches of
  // the state, not one head's few KiB here and there
  const int64_t heads = B * K * G, threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per = std::max<int64_t>(1, heads / (4 * threads));
  parallel_for(pool, (heads + per - 1) / per, [a, per, heads](int64_t c) {
    for (int64_t j = c * per; j < std::min(heads, (c + 1) * per); j++) head(a, j);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(StateStepF32, StateStep,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state [B, K G, H, U]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, K, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B, K, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, K, G, U]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g [B, K, G]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta [B, K, G]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, K, G, U]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // state after, in place
                                  .Attr<int64_t>("delta"));
