// What the native kernels share: the widest native float32 vector, a register pin, a vectorised
// exp, lane sums (one vector, or 16 at once), and a parallel loop on XLA's own intra-op pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(__AVX512F__)
constexpr int64_t VL = 16;  // float32 lanes of the widest native vector
constexpr int REGS = 32;    // vector registers
#elif defined(__AVX__)
constexpr int64_t VL = 8;
constexpr int REGS = 16;
#else
constexpr int64_t VL = 4;
constexpr int REGS = 16;
#endif
typedef float vec __attribute__((vector_size(4 * VL), aligned(4)));  // unaligned loads allowed

typedef int32_t ivec __attribute__((vector_size(4 * VL), aligned(4)));

// x in every lane, as one broadcast load. Written x - 0, exact for every x; 0 + x differs
// from x for x = -0, so GCC keeps that add: a scalar add and a register-to-register
// broadcast, which on Intel takes port 5, one of the two 512-bit FMA ports: a tile with a
// broadcast per row of x would lose a third of its FMAs to it.
static inline vec bcast(const float& x) { return x - vec{}; }

// e^x for x <= 0 (scores minus their max), VL lanes; below -87 it is ~0 (2^-126 scale):
// Cephes' expf (range reduction by ln 2, degree-6 polynomial, ~1e-7 relative), vectorised.
static inline vec vexp(vec x) {
  const vec lo = vec{} - 87.0f;
  x = x < lo ? lo : x;
  const vec t = x * 1.44269504088896341f - 0.5f;  // log2(e) x, rounded below by truncation
  const ivec n = __builtin_convertvector(t, ivec);  // toward zero: round(x log2 e) for x <= 0
  const vec nf = __builtin_convertvector(n, vec);
  const vec r = x - nf * 0.693359375f + nf * 2.12194440e-4f;  // x - n ln 2, in two parts
  vec p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const ivec scale = (n + 127) << 23;  // 2^n as a float's bits
  vec s;
  std::memcpy(&s, &scale, sizeof(s));
  return p * s;
}

// The sum of a vector's lanes, as a tree of halves.
static inline float hsum(vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s[VL];
  std::memcpy(s, &v, sizeof(s));
  for (int w = VL / 2; w > 0; w /= 2)
    for (int i = 0; i < w; i++) s[i] += s[i + w];
  return s[0];
#endif
}

// The largest lane, and the sum of an integer vector's lanes.
static inline float hmax(vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps((__m512)v);
#else
  float m = v[0];
  for (int64_t l = 1; l < VL; l++) m = std::max(m, v[l]);
  return m;
#endif
}

static inline int32_t hsum_int(ivec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_epi32((__m512i)v);
#else
  int32_t s = 0;
  for (int64_t l = 0; l < VL; l++) s += v[l];
  return s;
#endif
}

#if defined(__AVX512F__)
// The lane sums of 16 vectors, as one vector (lane i: the sum of d[i]'s lanes): a tree of
// 15 pairings, each two shuffles and an add, where 16 separate sums take 16 x 4 of each.
// Level by level the pairs' halves are added side by side: 16 vectors of 16 partial sums,
// then 8 of 8 (two vectors' halves per vector), 4 of 4, 2 of 2, and one of 16 totals.
static inline vec sums16(vec* d) {
  vec a[8], b[4], c[2];
  for (int i = 0; i < 8; i++)
    a[i] = __builtin_shufflevector(d[2 * i], d[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17,
                                   18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(d[2 * i], d[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24,
                                   25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; i++)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17,
                                   18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21,
                                   22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; i++)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17,
                                   20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19,
                                   22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                 26, 28, 30) +
         __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                 29, 31);
}
#endif

// a . b over n floats: whole vectors summed lane-wise, then the tail.
static inline float dot(const float* a, const float* b, int64_t n) {
  vec acc = {};
  int64_t i = 0;
  for (; i + VL <= n; i += VL) acc += *(const vec*)(a + i) * *(const vec*)(b + i);
  float s = hsum(acc);
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

// Keep a loaded vector in a register: without it GCC 12 folds a load into every FMA that uses
// it, one load per FMA instead of one per vector.
#if defined(__AVX512F__)
#define PIN(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define PIN(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define PIN(v) __asm__("" : "+w"(v))
#else
#define PIN(v) (void)0
#endif

// fn(0) .. fn(n - 1), each once, taken from a shared counter by the calling thread and by one
// task per other thread of XLA's intra-op pool (the FFI's ThreadPool context): the kernels use
// the cores XLA uses and never oversubscribe them. A task that starts after every item is
// taken finds none and returns; the caller returns when every item is done.
template <typename F>
static void parallel_for(ffi::ThreadPool& pool, int64_t n, F fn) {
  struct Work {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<Work>();
  auto work = [n, fn](Work* s) {
    for (int64_t i; (i = s->next.fetch_add(1)) < n;) {
      fn(i);
      s->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t helpers = std::min<int64_t>(threads, n) - 1;
  for (int64_t t = 0; t < helpers; t++) pool.Schedule([state, work] { work(state.get()); });
  work(state.get());
  while (state->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}
