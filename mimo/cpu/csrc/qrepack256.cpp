// Products on the 8-row tiles' layouts (qrepack.h): per sub-block, the 8 transposed
// registers are decoded with a few ANDs and shifts (no gathering, no transpose), then each
// activation row costs 8 u8 x s8 dots against its own 4-byte groups broadcast, one or two
// conversions and two or three float ops, one int32 lane per weight row. Unsigned quants
// (Q5_0: q + 16, Q6_K: q + 32) give back the offset as offset * sum(x) from the
// activations' half-block sums. Built in both builds (the VNNI one dots with vpdpbusd);
// which types each build repacks: mimo/cpu/qmatrix.py, repack_types.
#include <algorithm>

#include "qrepack_regs.h"

namespace mimo_q {
namespace {

using namespace x8;

inline __m256 fp16x8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 u8x8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 i8x8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// sum over k < 4 of T[k] . x[4k..4k+3] per int32 lane. Without VNNI: a vpmaddubsw lane is
// at most 2 x 31 x 127 = 7,874 for quants up to 31 (four add up within int16 before
// widening), 2 x 63 x 127 = 16,002 for Q6_K's (two).
template <bool WIDE>
inline __m256i dot4(const __m256i* T, const int8_t* x) {
#ifdef MIMO_ISA_VNNI
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), T[0], bcast4(x));
    s = _mm256_dpbusd_epi32(s, T[1], bcast4(x + 4));
    s = _mm256_dpbusd_epi32(s, T[2], bcast4(x + 8));
    return _mm256_dpbusd_epi32(s, T[3], bcast4(x + 12));
#else
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(T[0], bcast4(x)), _mm256_maddubs_epi16(T[1], bcast4(x + 4)));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(T[2], bcast4(x + 8)), _mm256_maddubs_epi16(T[3], bcast4(x + 12)));
    if constexpr (WIDE) return _mm256_add_epi32(_mm256_madd_epi16(p01, one), _mm256_madd_epi16(p23, one));
    return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), one);
#endif
}

inline void block_q5_0(const uint8_t* b, int64_t j, const QAct* a, int rows, __m256* acc) {
    using L = Layout<Q5_0X8>;
    const __m256 sw = fp16x8(b + L::SCALES);
    __m256i T[8];
    q5_0_regs(b, T);
#pragma GCC unroll 8
    for (int m = 0; m < rows; ++m) {
        const int8_t* x = a[m].q + 32 * j;
        const int32_t sx = a[m].isum16[2 * j] + a[m].isum16[2 * j + 1];
        __m256i s = _mm256_add_epi32(dot4<false>(T, x), dot4<false>(T + 4, x + 16));
        s = _mm256_sub_epi32(s, _mm256_set1_epi32(16 * sx));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sw, _mm256_set1_ps(a[m].d[j])), acc[m]);
    }
}

// Q8_0's signed quants by the sign trick (as qkernels.cpp's rows): |w| as u8 against the
// broadcast activations given w's sign. A vpmaddubsw lane is at most 2 x 128 x 127 = 32,512,
// so each register's pairs are widened to int32 before they are added: the block's 32
// products sum exactly in int32, then one float step per block. The registers are loaded
// (from L1 after the first row) and their magnitudes taken per activation row: held for all
// rows, the 16 registers of quants and magnitudes spilled (AVX2 has 16).
inline void block_q8_0(const uint8_t* b, int64_t j, const QAct* a, int rows, __m256* acc) {
    using L = Layout<Q8_0X8>;
    const __m256 sw = fp16x8(b + L::SCALES);
    const uint8_t* q = b + L::QUANTS;
#pragma GCC unroll 8
    for (int m = 0; m < rows; ++m) {
        const int8_t* x = a[m].q + 32 * j;
        __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const __m256i t = load32(q + 32 * k);
            const __m256i u = _mm256_sign_epi8(t, t);          // |w|: -128 gives the byte 128
            const __m256i xs = _mm256_sign_epi8(bcast4(x + 4 * k), t);
#ifdef MIMO_ISA_VNNI
            s = _mm256_dpbusd_epi32(s, u, xs);
#else
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xs), _mm256_set1_epi16(1)));
#endif
        }
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sw, _mm256_set1_ps(a[m].d[j])), acc[m]);
    }
}

inline void block_q4_k(const uint8_t* b, int64_t ib, const QAct* a, int rows, __m256* acc) {
    using L = Layout<Q4_KX8>;
    const __m256 dv = fp16x8(b + L::D), mv = fp16x8(b + L::DMIN);
    for (int s = 0; s < 8; ++s) {
        __m256i T[8];
        nibble_regs(b + L::NIBBLES, s, T);
        const __m256 sc = _mm256_mul_ps(dv, u8x8(b + L::SC + 8 * s));
        const __m256 mn = _mm256_mul_ps(mv, u8x8(b + L::MINS + 8 * s));
        const int64_t j = 8 * ib + s;
#pragma GCC unroll 8
        for (int m = 0; m < rows; ++m) {
            const int8_t* x = a[m].q + 32 * j;
            const __m256i d = _mm256_add_epi32(dot4<false>(T, x), dot4<false>(T + 4, x + 16));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sc, _mm256_set1_ps(a[m].d[j])), acc[m]);
            acc[m] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(a[m].dsum[j]), acc[m]);
        }
    }
}

inline void block_q6_k(const uint8_t* b, int64_t ib, const QAct* a, int rows, __m256* acc) {
    using L = Layout<Q6_KX8>;
    const __m256 dv = fp16x8(b + L::D);
    for (int s = 0; s < 8; ++s) {
        __m256i T[8];
        q6_k_regs(b, s, T);
        const __m256 s0 = _mm256_mul_ps(dv, i8x8(b + L::SC + 16 * s));
        const __m256 s1 = _mm256_mul_ps(dv, i8x8(b + L::SC + 16 * s + 8));
        const int64_t j = 8 * ib + s;
#pragma GCC unroll 8
        for (int m = 0; m < rows; ++m) {
            const int8_t* x = a[m].q + 32 * j;
            const __m256i i0 = _mm256_sub_epi32(dot4<true>(T, x), _mm256_set1_epi32(32 * a[m].isum16[2 * j]));
            const __m256i i1 = _mm256_sub_epi32(dot4<true>(T + 4, x + 16), _mm256_set1_epi32(32 * a[m].isum16[2 * j + 1]));
            const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), s1, _mm256_mul_ps(_mm256_cvtepi32_ps(i0), s0));
            acc[m] = _mm256_fmadd_ps(f, _mm256_set1_ps(a[m].d[j]), acc[m]);
        }
    }
}

// Tiles of rows [n0, n1) (multiples of 8) against activation rows [0, NM or M). The rows of
// a tile lie side by side: a thread's first two tiles are asked for whole, then each block
// step asks for its share of the tile two ahead, in address order.
template <int T, int NM>
void tiles(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a, int M,
           float* out, int64_t ldo) {
    using L = Layout<T>;
    const int rows = NM ? NM : M;
    const int64_t nb = rb / L::ROW_BYTES, tb = ROWS * rb, lines = tb / 64;
    for (int64_t l = 0; l < lines * std::min<int64_t>(2, (n1 - n0) / ROWS); ++l)
        _mm_prefetch(reinterpret_cast<const char*>(w + n0 * rb) + 64 * l, _MM_HINT_T0);
    for (int64_t t = n0; t < n1; t += ROWS) {
        const uint8_t* tile = w + t * rb;
        const char* ahead = reinterpret_cast<const char*>(tile + 2 * tb);
        const bool pf = t + 3 * ROWS <= n1;
        __m256 acc[NM ? NM : 8];
        for (int m = 0; m < rows; ++m) acc[m] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; ++i) {
            if (pf)
                for (int64_t l = lines * i / nb; l < lines * (i + 1) / nb; ++l)
                    _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
            const uint8_t* b = tile + L::BLOCK * i;
            if constexpr (T == Q5_0X8) block_q5_0(b, i, a, rows, acc);
            if constexpr (T == Q8_0X8) block_q8_0(b, i, a, rows, acc);
            if constexpr (T == Q4_KX8) block_q4_k(b, i, a, rows, acc);
            if constexpr (T == Q6_KX8) block_q6_k(b, i, a, rows, acc);
        }
        for (int m = 0; m < rows; ++m) _mm256_storeu_ps(out + m * ldo + t, acc[m]);
    }
}

using TilesFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const QAct*, int, float*, int64_t);

template <int T>
TilesFn pick(int M) {
    switch (M) {
        case 1: return tiles<T, 1>; case 2: return tiles<T, 2>; case 3: return tiles<T, 3>;
        case 4: return tiles<T, 4>; case 8: return tiles<T, 8>;
    }
    return tiles<T, 0>;
}

TilesFn tiles_fn(int qtype, int M) {
    switch (qtype) {
        case Q5_0X8: return pick<Q5_0X8>(M);
        case Q8_0X8: return pick<Q8_0X8>(M);
        case Q4_KX8: return pick<Q4_KX8>(M);
        case Q6_KX8: return pick<Q6_KX8>(M);
    }
    return nullptr;
}

}  // namespace

bool rows_x8(int qtype, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a,
             int64_t M, float* out, int64_t ldo) {
    if (!tiles_fn(qtype, 1)) return false;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {          // activation rows 8 at a time
        const int mt = static_cast<int>(std::min<int64_t>(8, M - m0));
        tiles_fn(qtype, mt)(w, rb, n0, n1, a + m0, mt, out + m0 * ldo, ldo);
    }
    return true;
}

}  // namespace mimo_q
