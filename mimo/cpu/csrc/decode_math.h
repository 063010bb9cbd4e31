// The elementwise steps of the fused decode layer (decode_layer.cpp), also bound alone for
// tests (decode_ops.cpp). The plain PyTorch layer is the reference: where it rounds to its
// dtype (bfloat16 linear outputs, q/k norms, RoPE's three products and sums, the activation
// and its product, the sandwich norms), these round at the same points.
#pragma once
#include "vec_math.h"
#include <torch/extension.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace mimo_dec {

using mimo_vec::act8;
using mimo_vec::exp8;

inline torch::Tensor f32(const torch::Tensor& t) { return t.to(torch::kFloat32).contiguous(); }

inline float bf16(float v) { return static_cast<float>(c10::BFloat16(v)); }
inline float rnd(float v, bool on) { return on ? bf16(v) : v; }

// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * scale[r % scale_rows], as torch's rms_norm
// computes it in float32 ((x * rrms) * w), rounded to bfloat16 when `round`; the sum of
// squares in double.
inline void rms_rows(const float* x, const float* scale, int64_t scale_rows, float* y, int64_t rows,
                     int64_t n, float eps, bool round) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        const float* w = scale + (r % scale_rows) * n;
        __m256d s4 = _mm256_setzero_pd();
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(xr + i));
            s4 = _mm256_fmadd_pd(v, v, s4);
        }
        alignas(32) double part[4];
        _mm256_store_pd(part, s4);
        double ss = (part[0] + part[1]) + (part[2] + part[3]);
        for (; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const float inv = 1.f / std::sqrt(static_cast<float>(ss / n) + eps);
        float* yr = y + r * n;
        const __m256 iv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8) {
            __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), iv), _mm256_loadu_ps(w + i));
            _mm256_storeu_ps(yr + i, round ? mimo_vec::bf16_round8(v) : v);
        }
        for (; i < n; ++i) yr[i] = rnd((xr[i] * inv) * w[i], round);
    }
}

inline float act1(float x, bool gelu) {
    alignas(32) float v[8] = {x};
    _mm256_store_ps(v, act8(_mm256_load_ps(v), gelu));
    return v[0];
}

// m[i] = act(g[i]) * u[i] for i in [i0, i1) of one row (u = g + I: gate columns first),
// each op rounded when `round`. Elementwise: any split of a row gives the same values.
inline void act_mul_range(const float* g, float* m, int64_t I, int64_t i0, int64_t i1, bool gelu,
                          bool round) {
    const float* u = g + I;
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(m + i, act8(_mm256_loadu_ps(g + i), gelu));
    for (; i < i1; ++i) m[i] = act1(g[i], gelu);
    for (i = i0; i < i1; ++i) m[i] = rnd(rnd(m[i], round) * u[i], round);
}

// Rotate-half RoPE of one head in place: x * cos + flip_halves(x) * sin_signed, each
// product and the sum rounded when `round` (the tables hold sin with the sign folded in).
inline void rope_row(float* x, const float* cos, const float* sin, int64_t d, bool round) {
    const int64_t h = d / 2;
    auto r8 = [round](__m256 v) { return round ? mimo_vec::bf16_round8(v) : v; };
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + h);
        const __m256 lo = _mm256_add_ps(r8(_mm256_mul_ps(a, _mm256_loadu_ps(cos + i))),
                                        r8(_mm256_mul_ps(b, _mm256_loadu_ps(sin + i))));
        const __m256 hi = _mm256_add_ps(r8(_mm256_mul_ps(b, _mm256_loadu_ps(cos + i + h))),
                                        r8(_mm256_mul_ps(a, _mm256_loadu_ps(sin + i + h))));
        _mm256_storeu_ps(x + i, r8(lo));
        _mm256_storeu_ps(x + i + h, r8(hi));
    }
    for (; i < h; ++i) {
        const float a = x[i], b = x[i + h];
        x[i] = rnd(rnd(a * cos[i], round) + rnd(b * sin[i], round), round);
        x[i + h] = rnd(rnd(b * cos[i + h], round) + rnd(a * sin[i + h], round), round);
    }
}

// Every element rounded to bfloat16 (to nearest even, as c10::BFloat16; inputs are finite).
inline void round_range(float* p, int64_t n, bool round) {
    if (!round) return;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, mimo_vec::bf16_round8(_mm256_loadu_ps(p + i)));
    for (; i < n; ++i) p[i] = bf16(p[i]);
}

template <typename T>
inline void write_row(const torch::Tensor& cache, int64_t slot, int64_t head, const float* src,
                      int64_t n) {
    T* dst = cache.data_ptr<T>() + slot * cache.stride(0) + head * cache.stride(1);
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
        // to nearest even, as c10::BFloat16 rounds finite values; a loop the compiler vectorizes
        uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) {
            uint32_t u;
            std::memcpy(&u, src + i, 4);
            d16[i] = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        }
    } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
    }
}

inline void write_cache(const torch::Tensor& cache, int64_t slot, int64_t head, const float* src,
                        int64_t n) {
    if (cache.scalar_type() == torch::kBFloat16) write_row<c10::BFloat16>(cache, slot, head, src, n);
    else write_row<float>(cache, slot, head, src, n);
}

}  // namespace mimo_dec
