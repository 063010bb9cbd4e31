// Block-quantized matmuls on llama.cpp's recipe: activations quantized to 8 bits per block
// of 32 (float scale), weights kept in the GGUF's own blocks, integer dot products per
// 32-element sub-block, float scales applied per sub-block (per 16 for Q6_K).
//
// This file: the activations' quantization, and the 256-bit path (every build; the only
// one on AVX2 machines). Built twice: with -mavx2 -mfma -mf16c (MIMO_ISA_AVX2) and with the
// AVX-512 VNNI flags added (MIMO_ISA_VNNI), where the u8 x s8 dot is one vpdpbusd instead
// of vpmaddubsw + vpmaddwd; that build multiplies on qtile512.cpp's tiles instead.
//
// Every weight type is decoded, 32 elements at a time, into either signed int8 quants
// (value = scale * q) or unsigned ones with a min (value = scale * q - min); the signed dot
// uses the sign trick (|w| as u8, sign(w) applied to the activation), as ggml does.
#include "qcommon.h"
#include <algorithm>

namespace mimo_q {
namespace {

// A 32-element sub-block of weights: quants, a scale per int32 lane (lanes 0-3 cover
// elements 0-15, lanes 4-7 elements 16-31), and a min (0 for signed types).
struct Sub {
    __m256i q;
    __m256 scale;
    float min;
    bool is_signed;
};

inline __m256i nibbles32(const uint8_t* qs) {   // 16 bytes -> low nibbles, then high nibbles
    __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

inline __m256i bits32(const uint8_t* p) {       // 32 bits -> 0xFF where set, else 0
    uint32_t x;
    std::memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Sub-block s (of block_elems / 32) of the block at `b`.
template <int T>
inline Sub load_sub(const uint8_t* b, int s) {
    Sub r;
    r.min = 0.f;
    if constexpr (T == Q8_0) {
        r.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
        r.scale = _mm256_set1_ps(fp16(b));
        r.is_signed = true;
    } else if constexpr (T == Q4_0) {
        r.q = _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8));
        r.scale = _mm256_set1_ps(fp16(b));
        r.is_signed = true;
    } else if constexpr (T == Q4_1) {
        r.q = nibbles32(b + 4);
        r.scale = _mm256_set1_ps(fp16(b));
        r.min = -fp16(b + 2);
        r.is_signed = false;
    } else if constexpr (T == Q5_0) {
        __m256i hi = _mm256_andnot_si256(bits32(b + 2), _mm256_set1_epi8(static_cast<char>(0xF0)));
        r.q = _mm256_or_si256(nibbles32(b + 6), hi);   // (nibble | bit << 4) - 16, as int8
        r.scale = _mm256_set1_ps(fp16(b));
        r.is_signed = true;
    } else if constexpr (T == Q5_1) {
        __m256i hi = _mm256_and_si256(bits32(b + 4), _mm256_set1_epi8(0x10));
        r.q = _mm256_or_si256(nibbles32(b + 8), hi);
        r.scale = _mm256_set1_ps(fp16(b));
        r.min = -fp16(b + 2);
        r.is_signed = false;
    } else if constexpr (T == Q4_K || T == Q5_K) {
        const float d = fp16(b), dmin = fp16(b + 2);
        const uint8_t* scales = b + 4;
        const uint8_t* qs = b + (T == Q4_K ? 16 : 48);
        int sc, m;
        scale_min_k4(s, scales, &sc, &m);
        __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (s / 2)));
        if (s & 1) raw = _mm256_srli_epi16(raw, 4);
        __m256i q = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
        if constexpr (T == Q5_K) {
            __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
            __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(0x01));
            q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
        }
        r.q = q;
        r.scale = _mm256_set1_ps(d * sc);
        r.min = dmin * m;
        r.is_signed = false;
    } else if constexpr (T == Q6_K) {
        const uint8_t* ql = b + 64 * (s / 4);
        const uint8_t* qh = b + 128 + 32 * (s / 4);
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * (s / 4);
        const int quarter = s % 4;
        __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * (quarter & 1)));
        if (quarter >= 2) lo = _mm256_srli_epi16(lo, 4);
        lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
        __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
        h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * quarter), _mm256_set1_epi8(0x03));
        __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(h, 4));
        r.q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
        const float d = fp16(b + 208);
        const float s0 = d * sc[2 * quarter], s1 = d * sc[2 * quarter + 1];
        r.scale = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
        r.is_signed = true;
    }
    return r;
}

// int32 lanes of sum(u[i] * s[i]) over groups of 4 bytes: u unsigned, s signed.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#ifdef MIMO_ISA_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

constexpr int MT = 8;   // activation rows per tile

// Weight rows read ahead of the one multiplied. One thread reading rows in order is
// latency-bound on the hardware prefetcher alone: the 178 MB Q8_0 head took 24 ms on one
// thread and 14 ms on two (12 GB/s); asking for the row 8 ahead took it to 14 and 7 ms
// (24-25 GB/s, the machine's read rate). 2 rows ahead gave 8.4 ms, 16 no better than 8.
constexpr int64_t AHEAD = 8;

// out[m * ldo + n] for rows n of one weight row range and NM activation rows (a compile-time
// count, so that the accumulators stay in registers).
template <int T, int NM>
void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QAct* a,
              float* out, int64_t ldo) {
    constexpr int mt = NM;
    const int subs = block_elems(T) / 32;
    const int bb = block_bytes(T);
    const int64_t nblocks = a[0].K / block_elems(T);
    const int64_t lines = (row_bytes + 63) / 64;
    const char* first = reinterpret_cast<const char*>(w + n0 * row_bytes);
    for (int64_t l = 0; l < lines * std::min(AHEAD, n1 - n0); ++l)   // the rows before AHEAD's
        _mm_prefetch(first + 64 * l, _MM_HINT_T0);
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        if (n + AHEAD < n1) {
            const char* next = reinterpret_cast<const char*>(row + AHEAD * row_bytes);
            for (int64_t l = 0; l < lines; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
        }
        __m256 acc[MT];
        float macc[MT];
        for (int m = 0; m < mt; ++m) { acc[m] = _mm256_setzero_ps(); macc[m] = 0.f; }
        for (int64_t ib = 0; ib < nblocks; ++ib) {
            const uint8_t* blk = row + ib * bb;
            for (int s = 0; s < subs; ++s) {
                const Sub sub = load_sub<T>(blk, s);
                const int64_t j = ib * subs + s;          // 32-element block index
                const __m256i uq = sub.is_signed ? _mm256_sign_epi8(sub.q, sub.q) : sub.q;
                for (int m = 0; m < mt; ++m) {
                    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[m].q + 32 * j));
                    if (sub.is_signed) x = _mm256_sign_epi8(x, sub.q);
                    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(uq, x));
                    acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(sub.scale, _mm256_set1_ps(a[m].d[j])), p, acc[m]);
                    if (!sub.is_signed) macc[m] += sub.min * a[m].dsum[j];
                }
            }
        }
        for (int m = 0; m < mt; ++m) out[m * ldo + n] = hsum(acc[m]) - macc[m];
    }
}

using RowsFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const QAct*, float*, int64_t);
struct DotFn {
    RowsFn by_rows[MT + 1];    // by the number of activation rows, 1..MT
};


template <int T>
DotFn make_dot() {
    return DotFn{{nullptr, dot_rows<T, 1>, dot_rows<T, 2>, dot_rows<T, 3>, dot_rows<T, 4>,
                  dot_rows<T, 5>, dot_rows<T, 6>, dot_rows<T, 7>, dot_rows<T, 8>}};
}

DotFn dot_fn(int t) {
    switch (t) {
        case Q4_0: return make_dot<Q4_0>(); case Q4_1: return make_dot<Q4_1>();
        case Q5_0: return make_dot<Q5_0>(); case Q5_1: return make_dot<Q5_1>();
        case Q8_0: return make_dot<Q8_0>(); case Q4_K: return make_dot<Q4_K>();
        case Q5_K: return make_dot<Q5_K>(); case Q6_K: return make_dot<Q6_K>();
    }
    return DotFn{};             // unreachable: qmatmul.cpp checks the type first
}

}  // namespace

void rows256(int qtype, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a,
             int64_t M, float* out, int64_t ldo) {
    const DotFn f = dot_fn(qtype);
    if (!f.by_rows[1]) return;
    for (int64_t m0 = 0; m0 < M; m0 += MT) {       // tiled by MT activation rows
        const int mt = static_cast<int>(std::min<int64_t>(MT, M - m0));
        f.by_rows[mt](w, rb, n0, n1, a + m0, out + m0 * ldo, ldo);
    }
}

void quantize_block(const float* v, int8_t* q, float* dq, float* dsum, int32_t* isum16) {
    __m256 amax = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 32; i += 8)
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float am = _mm_cvtss_f32(m4);
    const float d = am / 127.f;
    const float id = am > 0.f ? 127.f / am : 0.f;
    int half[2] = {0, 0};
    for (int i = 0; i < 32; i += 8) {
        __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(id)));
        alignas(32) int32_t t[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(t), qi);
        for (int k = 0; k < 8; ++k) { q[i + k] = static_cast<int8_t>(t[k]); half[i / 16] += t[k]; }
    }
    *dq = d;
    *dsum = d * static_cast<float>(half[0] + half[1]);
    isum16[0] = half[0];
    isum16[1] = half[1];
}

}  // namespace mimo_q
