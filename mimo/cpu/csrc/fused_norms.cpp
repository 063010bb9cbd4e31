// Norms fused with the op that reads their output, for the plain layers on CPU: one pass
// over the rows where the modules make three to six (each a tensor written and read back).
// Both round exactly where the modules round (the unfused calls are their tests'
// reference): the norm in float32, rounded once to the dtype; RoPE's two products and
// their sum each rounded to it; the residual sum in float32.
#include "kernels.h"
#include "rows_io.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>
#include <vector>

namespace {

using mimo_rows::as_dtype;
using mimo_rows::load8;
using mimo_rows::one_lane;
using mimo_rows::store8;
using mimo_rows::tail_load;
using mimo_rows::tail_store;

// buf[0, n) = dtype((x * inv) * w), or x itself without a scale.
template <typename T>
void normed(const T* x, const float* w, int64_t n, float eps, bool bf16, float* buf) {
    if (w != nullptr) return mimo_rows::norm_row(x, w, n, eps, bf16, buf);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buf + i, load8(x + i));
    for (; i < n; ++i) buf[i] = tail_load(x + i);
}

// Rotate-half RoPE of buf [d] into y: x * cos + flip_halves(x) * sin, sin with the sign
// folded in (Rotary's tables), each product and the sum rounded to the dtype.
template <typename T>
void rotated(const float* buf, const T* cos, const T* sin, int64_t d, bool bf16, T* y) {
    const int64_t h = d / 2;
    auto r = [bf16](auto v) { return as_dtype(v, bf16); };     // 8 or 16 lanes
    int64_t i = 0;
#ifdef __AVX512F__
    // 16 lanes where the build has them: the same products, sums and roundings per element.
    using mimo_rows::load16;
    using mimo_rows::store16;
    for (; i + 16 <= h; i += 16) {
        const __m512 a = _mm512_loadu_ps(buf + i), b = _mm512_loadu_ps(buf + i + h);
        store16(y + i, r(_mm512_add_ps(r(_mm512_mul_ps(a, load16(cos + i))),
                                       r(_mm512_mul_ps(b, load16(sin + i))))));
        store16(y + i + h, r(_mm512_add_ps(r(_mm512_mul_ps(b, load16(cos + i + h))),
                                           r(_mm512_mul_ps(a, load16(sin + i + h))))));
    }
#endif
    for (; i + 8 <= h; i += 8) {
        const __m256 a = _mm256_loadu_ps(buf + i), b = _mm256_loadu_ps(buf + i + h);
        store8(y + i, r(_mm256_add_ps(r(_mm256_mul_ps(a, load8(cos + i))),
                                      r(_mm256_mul_ps(b, load8(sin + i))))));
        store8(y + i + h, r(_mm256_add_ps(r(_mm256_mul_ps(b, load8(cos + i + h))),
                                          r(_mm256_mul_ps(a, load8(sin + i + h))))));
    }
    for (; i < h; ++i) {
        const __m256 a = one_lane(buf[i]), b = one_lane(buf[i + h]);
        tail_store(y + i, r(_mm256_add_ps(r(_mm256_mul_ps(a, one_lane(tail_load(cos + i)))),
                                          r(_mm256_mul_ps(b, one_lane(tail_load(sin + i)))))));
        tail_store(y + i + h, r(_mm256_add_ps(r(_mm256_mul_ps(b, one_lane(tail_load(cos + i + h)))),
                                              r(_mm256_mul_ps(a, one_lane(tail_load(sin + i + h)))))));
    }
}

template <typename T>
void qk_rows(const T* qkv, int64_t ld, int64_t rows, int64_t heads, int64_t d, const float* scale,
             float eps, const T* cos, const T* sin, T* y, bool bf16) {
    at::parallel_for(0, rows * heads, 16, [&](int64_t r0, int64_t r1) {
        std::vector<float> buf(d);
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = r / heads, j = r % heads;
            normed(qkv + t * ld + j * d, scale == nullptr ? nullptr : scale + j * d, d, eps, bf16,
                   buf.data());
            rotated(buf.data(), cos + t * d, sin + t * d, d, bf16, y + r * d);
        }
    });
}

template <typename T, typename Y>
void add_norm_rows(const float* x, const T* h, const float* w1, const float* w2, int64_t rows,
                   int64_t n, float eps, bool bf16, float* xn, Y* y) {
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
        std::vector<float> buf(n);
        for (int64_t r = r0; r < r1; ++r) {
            normed(h + r * n, w1, n, eps, bf16, buf.data());
            const float* xr = x + r * n;
            float* xo = xn + r * n;
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(xo + i, _mm256_add_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(buf.data() + i)));
            for (; i < n; ++i) xo[i] = xr[i] + buf[i];
            if (w2 == nullptr) continue;
            // The next norm on the float32 sum, as rms_norm_rows computes it (no rounding but
            // the store's, where y is bf16: the same bits as float32 y cast after).
            mimo_rows::norm_row(xo, w2, n, eps, false, y + r * n);
        }
    });
}

const float* scale_or_null(const torch::Tensor& s, int64_t numel, const char* name) {
    if (s.numel() == 0) return nullptr;
    TORCH_CHECK(s.scalar_type() == torch::kFloat32 && s.is_contiguous() && s.numel() == numel,
                name, " must be contiguous float32 with ", numel, " values (or empty: no norm)");
    return s.data_ptr<float>();
}

}  // namespace

torch::Tensor qk_norm_rope_rows(const torch::Tensor& qkv, int64_t heads, int64_t d,
                                const torch::Tensor& scale, double eps, const torch::Tensor& cos,
                                const torch::Tensor& sin) {
    check_rows(qkv, "qkv");
    TORCH_CHECK(heads > 0 && d > 0 && d % 2 == 0 && heads * d <= qkv.size(1),
                "heads * d (d even) must fit in qkv's columns");
    const int64_t T = qkv.size(0);
    for (const torch::Tensor* tab : {&cos, &sin})
        TORCH_CHECK(tab->scalar_type() == qkv.scalar_type() && tab->is_contiguous() &&
                    tab->dim() == 2 && tab->size(0) == T && tab->size(1) == d,
                    "cos and sin must be contiguous [T, d] in qkv's dtype");
    const float* w = scale_or_null(scale, heads * d, "scale");
    torch::Tensor y = torch::empty({T, heads, d}, qkv.options());
    const float e = static_cast<float>(eps);
    if (qkv.scalar_type() == torch::kBFloat16)
        qk_rows(qkv.data_ptr<at::BFloat16>(), qkv.size(1), T, heads, d, w, e,
                cos.data_ptr<at::BFloat16>(), sin.data_ptr<at::BFloat16>(),
                y.data_ptr<at::BFloat16>(), true);
    else
        qk_rows(qkv.data_ptr<float>(), qkv.size(1), T, heads, d, w, e, cos.data_ptr<float>(),
                sin.data_ptr<float>(), y.data_ptr<float>(), false);
    return y;
}

std::vector<torch::Tensor> add_rms_norm_rows(const torch::Tensor& x, const torch::Tensor& h,
                                             const torch::Tensor& w1, const torch::Tensor& w2,
                                             double eps, bool y_bf16) {
    check_rows(x, "x");
    check_rows(h, "h");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32 (the residual stream)");
    TORCH_CHECK(h.sizes() == x.sizes(), "h must have x's shape");
    const int64_t rows = x.size(0), n = x.size(1);
    const float* a = scale_or_null(w1, n, "w1");
    const float* b = scale_or_null(w2, n, "w2");
    torch::Tensor xn = torch::empty_like(x);
    const auto ydt = y_bf16 ? torch::kBFloat16 : torch::kFloat32;
    torch::Tensor y = b == nullptr ? torch::empty({0}, x.options().dtype(ydt))
                                   : torch::empty(x.sizes(), x.options().dtype(ydt));
    const float e = static_cast<float>(eps);
    auto run = [&](auto* yp) {
        if (h.scalar_type() == torch::kBFloat16)
            add_norm_rows(x.data_ptr<float>(), h.data_ptr<at::BFloat16>(), a, b, rows, n, e,
                          true, xn.data_ptr<float>(), yp);
        else
            add_norm_rows(x.data_ptr<float>(), h.data_ptr<float>(), a, b, rows, n, e, false,
                          xn.data_ptr<float>(), yp);
    };
    if (y_bf16)
        run(b == nullptr ? nullptr : y.data_ptr<at::BFloat16>());
    else
        run(b == nullptr ? nullptr : y.data_ptr<float>());
    return {xn, y};
}
