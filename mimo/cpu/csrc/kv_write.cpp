// A step's new keys or values into their cache slots: cache[slots[i]] = src[i]. One
// thread, a memcpy per row: a prefill chunk's rows are a few hundred KB, which one core
// copies in microseconds, while torch's index_copy_ opens a parallel region whose sleeping
// worker this project's VM wakes in tens of microseconds (measured 80 us a call in a
// 256-token prefill against 15 us back to back).
#include "kernels.h"
#include <cstring>

void write_rows(torch::Tensor& cache, const torch::Tensor& slots, const torch::Tensor& src) {
    TORCH_CHECK(!cache.is_cuda() && cache.is_contiguous() && cache.dim() >= 2,
                "cache must be a contiguous CPU tensor [slots, ...]");
    TORCH_CHECK(src.scalar_type() == cache.scalar_type() && src.dim() == cache.dim(),
                "src must have the cache's dtype and rank");
    TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.dim() == 1 && slots.is_contiguous() &&
                slots.numel() == src.size(0), "slots must be contiguous int64 [src rows]");
    // Each row of src must lie as one block, like a cache row (the first dim may be strided:
    // a view of a few heads of a wider projection's rows).
    int64_t inner = 1;
    for (int64_t d = src.dim() - 1; d >= 1; --d) {
        TORCH_CHECK(src.size(d) == cache.size(d), "src rows must have the cache's row shape");
        TORCH_CHECK(src.size(d) == 1 || src.stride(d) == inner, "src rows must be contiguous");
        inner *= src.size(d);
    }
    const int64_t n = slots.numel(), S = cache.size(0);
    const int64_t bytes = inner * cache.element_size();
    const int64_t* s = slots.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
        TORCH_CHECK(s[i] >= 0 && s[i] < S, "slot ", s[i], " out of the cache's ", S, " rows");
    char* dst = static_cast<char*>(cache.data_ptr());
    const char* from = static_cast<const char*>(src.data_ptr());
    const int64_t step = src.stride(0) * src.element_size();
    for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + s[i] * bytes, from + i * step, bytes);
}
