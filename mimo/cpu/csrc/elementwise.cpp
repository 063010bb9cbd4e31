// Elementwise ops of the plain layers on CPU (prefill-sized steps above all), in the
// activation dtype (bfloat16 or float32) and parallel over rows: one pass each where torch's bfloat16 path makes several (rms_norm: a
// float32 copy, the square, the mean, rsqrt, two products and the cast back; the gated MLP:
// the activation, then its product with up, each written out).
//
// The plain layers are the reference and these round where they round: the norm in float32
// ((x * rrms) * w) rounded once to the dtype; the activation rounded to the dtype, then its
// product with up rounded again. They differ from torch only by the order of the float32
// sum of squares and by a few ulp of tanh/exp before rounding.
#include "kernels.h"
#include "vec_math.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>

namespace {

using mimo_vec::act8;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// Rounded to nearest even, as c10::BFloat16 rounds finite values.
inline void store8(at::BFloat16* p, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// One value through the same vector code (tails), so tails round exactly as the body.
template <typename T>
inline float tail_load(const T* p) { return static_cast<float>(*p); }
inline __m256 one_lane(float x) { return _mm256_set_ps(0, 0, 0, 0, 0, 0, 0, x); }
template <typename T>
inline void tail_store(T* p, __m256 v) { *p = static_cast<T>(_mm256_cvtss_f32(v)); }

inline __m256 as_dtype(__m256 v, bool bf16) {
    if (!bf16) return v;
    alignas(32) at::BFloat16 b[8];
    store8(b, v);
    return load8(b);
}

template <typename T>
void rms_rows(const T* x, const float* scale, int64_t scale_rows, T* y, int64_t rows,
              int64_t n, float eps) {
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* xr = x + r * n;
            const float* w = scale + (r % scale_rows) * n;
            T* yr = y + r * n;
            __m256 acc = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i + 8 <= n; i += 8) {
                const __m256 v = load8(xr + i);
                acc = _mm256_fmadd_ps(v, v, acc);
            }
            alignas(32) float part[8];
            _mm256_store_ps(part, acc);
            float ss = 0.f;
            for (float p : part) ss += p;
            for (; i < n; ++i) ss += tail_load(xr + i) * tail_load(xr + i);
            const __m256 inv = _mm256_set1_ps(1.f / std::sqrt(ss / n + eps));
            for (i = 0; i + 8 <= n; i += 8)
                store8(yr + i, _mm256_mul_ps(_mm256_mul_ps(load8(xr + i), inv), load8(w + i)));
            for (; i < n; ++i)
                tail_store(yr + i, _mm256_mul_ps(_mm256_mul_ps(one_lane(tail_load(xr + i)), inv),
                                                 one_lane(w[i])));
        }
    });
}

template <typename T>
void act_rows(const T* gu, T* m, int64_t rows, int64_t I, bool gelu, bool bf16) {
    at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* g = gu + r * 2 * I;
            const T* u = g + I;
            T* mr = m + r * I;
            int64_t i = 0;
            for (; i + 8 <= I; i += 8)
                store8(mr + i, _mm256_mul_ps(as_dtype(act8(load8(g + i), gelu), bf16), load8(u + i)));
            for (; i < I; ++i)
                tail_store(mr + i, _mm256_mul_ps(as_dtype(act8(one_lane(tail_load(g + i)), gelu), bf16),
                                                 one_lane(tail_load(u + i))));
        }
    });
}

void check_rows(const torch::Tensor& x, const char* name) {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && !x.is_cuda() &&
                (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat32),
                name, " must be a contiguous 2-D bfloat16 or float32 CPU tensor");
}

}  // namespace

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& scale, double eps) {
    check_rows(x, "x");
    TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() &&
                scale.dim() >= 1 && scale.size(-1) == x.size(1),
                "scale must be contiguous float32 [..., n] with n = x's columns");
    const int64_t sr = scale.numel() / x.size(1);
    TORCH_CHECK(sr > 0 && x.size(0) % sr == 0, "rows must be a multiple of the scale's rows");
    torch::Tensor y = torch::empty_like(x);
    const float e = static_cast<float>(eps);
    if (x.scalar_type() == torch::kBFloat16)
        rms_rows(x.data_ptr<at::BFloat16>(), scale.data_ptr<float>(), sr,
                 y.data_ptr<at::BFloat16>(), x.size(0), x.size(1), e);
    else
        rms_rows(x.data_ptr<float>(), scale.data_ptr<float>(), sr, y.data_ptr<float>(),
                 x.size(0), x.size(1), e);
    return y;
}

torch::Tensor act_mul_rows(const torch::Tensor& gu, const std::string& act) {
    check_rows(gu, "gu");
    TORCH_CHECK(gu.size(1) % 2 == 0, "gu must be [T, 2I] (gate columns, then up)");
    TORCH_CHECK(act == "gelu_tanh" || act == "silu", "activation must be gelu_tanh or silu");
    const int64_t I = gu.size(1) / 2;
    torch::Tensor m = torch::empty({gu.size(0), I}, gu.options());
    const bool gelu = act == "gelu_tanh";
    if (gu.scalar_type() == torch::kBFloat16)
        act_rows(gu.data_ptr<at::BFloat16>(), m.data_ptr<at::BFloat16>(), gu.size(0), I, gelu, true);
    else
        act_rows(gu.data_ptr<float>(), m.data_ptr<float>(), gu.size(0), I, gelu, false);
    return m;
}
