// Vector math shared by the decode-layer and elementwise sources (decode_math.h,
// decode_attention.cpp, elementwise.cpp);
// AVX2 + FMA, which every build has.
#pragma once
#include <immintrin.h>

namespace mimo_vec {

// exp(x) for 8 floats (Cephes' expf: range reduction by ln 2, degree-6 polynomial; within
// 2 ulp of expf for |x| < 88, saturating beyond).
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                    5.0000001201e-1f})
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(c));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// torch's gelu(approximate='tanh'), 0.5 x (1 + tanh(k)) with k = sqrt(2/pi) (x + 0.044715 x^3),
// and silu, x / (1 + exp(-x)), in float32 in torch's order of operations (so where tanh(k)
// rounds to -1, gelu is 0 here too), within a few ulp of torch's (Sleef) values: the
// bfloat16 rounding after them almost never sees the difference.
inline __m256 act8(__m256 x, bool gelu) {
    const __m256 one = _mm256_set1_ps(1.f);
    if (!gelu)
        return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 k = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                   _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
    // tanh(k) = 1 - 2 / (exp(2k) + 1)
    const __m256 e = exp8(_mm256_add_ps(k, k));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, one)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(one, t));
}

// 8 floats rounded to bfloat16 (to nearest even, as c10::BFloat16 rounds finite values) and
// widened back: add 0x7FFF plus the kept part's lowest bit, clear the low 16 bits.
inline __m256 bf16_round8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

#ifdef __AVX512F__
// exp16 / act16 / bf16_round16: the same operations as exp8 / act8 / bf16_round8 in the same
// order on 16 lanes (the AVX-512 builds), so either width gives the same bits per element.
// (the prefill attention kernels keep their own exp16, in prefill_span.h: scalef for the
// power of two and no upper clamp, compiled for AVX512-BF16; it need not match exp8.)
inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                    5.0000001201e-1f})
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(c));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx),
                                                         _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

inline __m512 act16(__m512 x, bool gelu) {
    const __m512 one = _mm512_set1_ps(1.f);
    if (!gelu)
        return _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 k = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                   _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
    const __m512 e = exp16(_mm512_add_ps(k, k));
    const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, one)));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(one, t));
}

inline __m512 bf16_round16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
#endif

}  // namespace mimo_vec
