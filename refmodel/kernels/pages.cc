// Gather a paged KV cache into the contiguous view a model's attention reads: the serving
// engine's one copy per step (refmodel/serving/engine.py), as a row of memcpys.
//
// pages [pages, runs, bytes]: the pages of one cache leaf, each `runs` runs of `bytes` bytes
// (GQA's key pages [pages, K, page, H] are K runs of page x H numbers; MLA's latent pages
// [pages, page, R] one run). tables int32 [B, n]: the pages of B sequences in token order.
// out [B, runs, n, bytes]: out[b, r, i] = pages[tables[b, i], r], i.e. [B, K, n x page, H],
// the layout the variant's own cache has, so the model runs on it unchanged. Any element
// type: only bytes move.
//
// Why a kernel: XLA:CPU emits a gather as a loop over output elements with the index
// arithmetic per element, slower than the attention that reads the view; runs of a few KiB
// copy at the memory's speed (`python -m microbench serve` runs the engine both ways).
//
// Work: the B x runs (sequence, run) pairs, taken by the calling thread and XLA's intra-op
// pool (common.h's parallel_for). A page id outside [0, pages) is an error, not a read out of
// bounds.
#include <cstring>

#include "common.h"

static ffi::Error GatherPages(ffi::ThreadPool pool, ffi::AnyBuffer pages,
                              ffi::Buffer<ffi::S32> tables, ffi::Result<ffi::AnyBuffer> out,
                              int64_t runs) {
  const auto pd = pages.dimensions();
  const auto td = tables.dimensions();
  if (pd.size() < 2 || td.size() != 2 || runs < 1 || pages.element_type() != out->element_type())
    return ffi::Error::InvalidArgument(
        "gather_pages: pages [pages, ...] and out of one dtype, tables int32 [B, n], runs >= 1");
  const int64_t n_pages = pd[0], B = td[0], n = td[1];
  const int64_t page_bytes =
      n_pages ? static_cast<int64_t>(pages.size_bytes()) / n_pages : 0;
  if (n_pages < 1 || page_bytes % runs ||
      static_cast<int64_t>(out->size_bytes()) != B * n * page_bytes)
    return ffi::Error::InvalidArgument(
        "gather_pages: out must hold B x n pages and each page `runs` equal runs");
  const int32_t* t = tables.typed_data();
  for (int64_t k = 0; k < B * n; k++)
    if (t[k] < 0 || t[k] >= n_pages)
      return ffi::Error::InvalidArgument(
          "gather_pages: a page id in tables is outside [0, pages)");
  const int64_t bytes = page_bytes / runs;  // per run
  const char* src = static_cast<const char*>(pages.untyped_data());
  char* dst = static_cast<char*>(out->untyped_data());
  parallel_for(pool, B * runs, [=](int64_t job) {
    const int64_t b = job / runs, r = job % runs;
    char* o = dst + job * n * bytes;  // out[b, r, 0]
    for (int64_t i = 0; i < n; i++)
      std::memcpy(o + i * bytes, src + t[b * n + i] * page_bytes + r * bytes, bytes);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GatherPagesAny, GatherPages,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // pages [pages, runs, bytes]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // tables [B, n]
                                  .Ret<ffi::AnyBuffer>()          // out [B, runs, n, bytes]
                                  .Attr<int64_t>("runs")          // runs
);
