// Gather a paged KV cache into the contiguous view a model's attention reads: the serving
// engine's one copy per step (refmodel/serving/engine.py), as a row of memcpys.
//
// pages [P, R, C]: P pages of one cache leaf, each R runs of C bytes (GQA's key pages
// [P, K, page, H] are R = K runs of page x H numbers; MLA's latent pages [P, page, L] one run).
// tables int32 [B, n]: the pages of B sequences in token order. out [B, R, n, C]:
// out[b, r, i] = pages[tables[b, i], r], i.e. [B, K, n x page, H], the layout the variant's
// own cache has, so the model runs on it unchanged. Any element type: only bytes move.
//
// Why a kernel: XLA:CPU (jax 0.10.2) emits a gather as a loop over output elements with the
// index arithmetic per element; on a 2-core Zen 4 the engine's view of `small` at batch 8 and
// 512 tokens (8 leaves, 8.4 MB) took 1.8-4 ms to gather, 2-5 GB/s, slower than the attention
// that reads it. Runs of C bytes (2 KiB there) copy at the memory's speed.
//
// Work: the B x R (sequence, run) pairs, taken by the calling thread and XLA's intra-op pool
// (common.h's parallel_for). A page id outside [0, P) is an error, not a read out of bounds.
#include <cstring>

#include "common.h"

static ffi::Error GatherPages(ffi::ThreadPool pool, ffi::AnyBuffer pages,
                              ffi::Buffer<ffi::S32> tables, ffi::Result<ffi::AnyBuffer> out,
                              int64_t runs) {
  const auto pd = pages.dimensions();
  const auto td = tables.dimensions();
  if (pd.size() < 2 || td.size() != 2 || runs < 1 || pages.element_type() != out->element_type())
    return ffi::Error::InvalidArgument(
        "gather_pages: pages [P, ...] and out of one dtype, tables int32 [B, n], runs >= 1");
  const int64_t P = pd[0], B = td[0], n = td[1];
  const int64_t page_bytes = P ? static_cast<int64_t>(pages.size_bytes()) / P : 0;
  if (P < 1 || page_bytes % runs ||
      static_cast<int64_t>(out->size_bytes()) != B * n * page_bytes)
    return ffi::Error::InvalidArgument(
        "gather_pages: out must hold B x n pages and each page `runs` equal runs");
  const int32_t* t = tables.typed_data();
  for (int64_t k = 0; k < B * n; k++)
    if (t[k] < 0 || t[k] >= P)
      return ffi::Error::InvalidArgument("gather_pages: a page id in tables is outside [0, P)");
  const int64_t C = page_bytes / runs;
  const char* src = static_cast<const char*>(pages.untyped_data());
  char* dst = static_cast<char*>(out->untyped_data());
  parallel_for(pool, B * runs, [=](int64_t job) {
    const int64_t b = job / runs, r = job % runs;
    char* o = dst + job * n * C;  // out[b, r, 0]
    for (int64_t i = 0; i < n; i++)
      std::memcpy(o + i * C, src + t[b * n + i] * page_bytes + r * C, C);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GatherPagesAny, GatherPages,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // pages [P, R, C]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // tables [B, n]
                                  .Ret<ffi::AnyBuffer>()          // out [B, R, n, C]
                                  .Attr<int64_t>("runs")          // R
);
