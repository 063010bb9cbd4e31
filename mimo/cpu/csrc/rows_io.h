// Loading and storing 8 activations of either dtype as float32 lanes (16 in the AVX-512
// builds), shared by the row kernels (elementwise.cpp, fused_norms.cpp); the 8-lane code is
// AVX2 + FMA, which every build has.
#pragma once
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include "vec_math.h"
#include <cmath>
#include <cstdint>

namespace mimo_rows {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// Rounded to nearest even, as c10::BFloat16 rounds finite values (bf16_round8), then the
// high halves packed.
inline void store8(at::BFloat16* p, __m256 v) {
    const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(mimo_vec::bf16_round8(v)), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

#ifdef __AVX512F__
// The same on 16 lanes, for the AVX-512 builds.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
// Rounded to nearest even (bf16_round16), then the high halves packed.
inline void store16(at::BFloat16* p, __m512 v) {
    const __m512i u = _mm512_srli_epi32(_mm512_castps_si512(mimo_vec::bf16_round16(v)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(u));
}
#endif

// One value through the same vector code (tails), so tails round exactly as the body.
template <typename T>
inline float tail_load(const T* p) { return static_cast<float>(*p); }
inline __m256 one_lane(float x) { return _mm256_set_ps(0, 0, 0, 0, 0, 0, 0, x); }
template <typename T>
inline void tail_store(T* p, __m256 v) { *p = static_cast<T>(_mm256_cvtss_f32(v)); }

// v rounded to the dtype and widened back (a no-op for float32), in the register.
inline __m256 as_dtype(__m256 v, bool bf16) { return bf16 ? mimo_vec::bf16_round8(v) : v; }
#ifdef __AVX512F__
inline __m512 as_dtype(__m512 v, bool bf16) { return bf16 ? mimo_vec::bf16_round16(v) : v; }
#endif

// 1 / sqrt(mean(x^2) + eps) of one row, its squares summed in 8 float32 lanes in order,
// the lanes in order, then the tail: every norm kernel sums in this one order, so a fused
// kernel rounds exactly as the plain norm kernel does.
template <typename T>
inline float inv_rms(const T* x, int64_t n, float eps) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = load8(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    alignas(32) float part[8];
    _mm256_store_ps(part, acc);
    float ss = 0.f;
    for (float p : part) ss += p;
    // An explicit fma: left to the compiler, contraction differs between call sites.
    for (; i < n; ++i) ss = std::fma(tail_load(x + i), tail_load(x + i), ss);
    return 1.f / std::sqrt(ss / n + eps);
}

// y[0, n) = (x * inv_rms) * w, rounded to the dtype when `round` (the plain norm rounds
// once; a bfloat16 y rounds again on the store, exactly). Every norm kernel writes a row so,
// 16 lanes at a time in the AVX-512 builds (the same two products per element: the same bits).
template <typename T, typename O>
inline void norm_row(const T* x, const float* w, int64_t n, float eps, bool round, O* y) {
    const float r = inv_rms(x, n, eps);
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 inv16 = _mm512_set1_ps(r);
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(load16(x + i), inv16), load16(w + i));
        store16(y + i, as_dtype(v, round));
    }
#endif
    const __m256 inv = _mm256_set1_ps(r);
    for (; i + 8 <= n; i += 8)
        store8(y + i, as_dtype(_mm256_mul_ps(_mm256_mul_ps(load8(x + i), inv), load8(w + i)), round));
    for (; i < n; ++i)
        tail_store(y + i, as_dtype(_mm256_mul_ps(_mm256_mul_ps(one_lane(tail_load(x + i)), inv),
                                                 one_lane(w[i])), round));
}

}  // namespace mimo_rows
