// AVX2 tiles: 8 weight rows at a time, one int32 lane per weight row (the AVX2 build's
// counterpart of qtile512.cpp, which has the design notes).
//
// For each 32-element sub-block the 8 rows are decoded into unsigned bytes q + OFF and
// transposed so that register k holds bytes 4k..4k+3 of every row. Without VNNI the u8 x s8
// dot is vpmaddubsw (pairs summed to int16, saturating) then vpmaddwd: with unsigned weights
// of at most 63, vpmaddubsw results are added in int16 before widening (see dot4). Q8_0's
// weights span the full byte, so it keeps its sign on the activation (|w| as u8, as ggml
// does) and widens every vpmaddubsw on its own.
#include "qcommon.h"
#include "qpack.h"

#ifndef MIMO_ISA_VNNI
#include <algorithm>
#include <vector>

namespace mimo_q {
namespace {

struct Tile {                  // 8 weight rows of `rb` bytes from `p`
    const uint8_t* p;
    int64_t rb;
    const uint8_t* row(int r) const { return p + r * rb; }
};

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256i nibbles(const uint8_t* qs) {      // 16 bytes -> low nibbles, then high nibbles
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

inline __m256i bit4(const uint8_t* p) {          // 32 bits -> 16 in the bytes whose bit is set
    uint32_t x;
    std::memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
}

// z[i] = row i (32 bytes) -> t[k] = bytes 4k..4k+3 of rows 0..7
inline void transpose(const __m256i z[8], __m256i t[8]) {
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(z[i], z[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(z[i], z[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
        t[k] = _mm256_permute2x128_si256(b[k], b[k + 4], 0x20);
        t[k + 4] = _mm256_permute2x128_si256(b[k], b[k + 4], 0x31);
    }
}

// sum over 4 groups k of t[k] . x[4k..4k+3], as int32 lanes
template <int T>
inline __m256i dot4(const __m256i* t, const int8_t* x) {
    const __m256i one = _mm256_set1_epi16(1);
    if constexpr (T == Q8_0) {
        __m256i s = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(t[k], t[k]), _mm256_sign_epi8(bcast4(x + 4 * k), t[k]));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, one));
        }
        return s;
    } else {
        // a vpmaddubsw lane is at most 2 x 63 x 127 = 16,002: two add up within int16, and
        // four when the quants are at most 31 (every type but Q6_K)
        const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(t[0], bcast4(x)), _mm256_maddubs_epi16(t[1], bcast4(x + 4)));
        const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(t[2], bcast4(x + 8)), _mm256_maddubs_epi16(t[3], bcast4(x + 12)));
        if constexpr (T == Q6_K)
            return _mm256_add_epi32(_mm256_madd_epi16(p01, one), _mm256_madd_epi16(p23, one));
        return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), one);
    }
}

template <int T, int NM>
inline void consume(const __m256i z[8], __m256 s0, __m256 s1, __m256 mn, int64_t j,
                    const Pack& a, int M, __m256* acc) {
    __m256i t[8];
    transpose(z, t);
    const int rows = NM ? NM : M;
    const int8_t* x = a.x + 32 * j * rows;
    const int32_t* st = a.start + 2 * j * rows;
    const float* d = a.d + j * rows;
#pragma GCC unroll 8
    for (int m = 0; m < rows; ++m) {
        if constexpr (HALVES<T>) {
            const __m256i i0 = _mm256_add_epi32(_mm256_set1_epi32(st[2 * m]), dot4<T>(t, x + 32 * m));
            const __m256i i1 = _mm256_add_epi32(_mm256_set1_epi32(st[2 * m + 1]), dot4<T>(t + 4, x + 32 * m + 16));
            const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), s1, _mm256_mul_ps(_mm256_cvtepi32_ps(i0), s0));
            acc[m] = _mm256_fmadd_ps(f, _mm256_set1_ps(d[m]), acc[m]);
        } else {
            __m256i i0 = _mm256_add_epi32(dot4<T>(t, x + 32 * m), dot4<T>(t + 4, x + 32 * m + 16));
            if constexpr (T != Q8_0) i0 = _mm256_add_epi32(i0, _mm256_set1_epi32(st[2 * m]));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(s0, _mm256_set1_ps(d[m])), acc[m]);
            if constexpr (HAS_MIN<T>)
                acc[m] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(a.dsum[j * rows + m]), acc[m]);
        }
    }
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

// Block ib of the 8 rows, all of its sub-blocks.
template <int T, int NM>
inline void block(const Tile& r, int64_t ib, const Pack& a, int M, __m256* acc) {
    constexpr int64_t bb = block_bytes(T);
    const int64_t at = ib * bb;
    __m256i z[8];
    alignas(32) float s0[8], s1[8], mn[8];
    if constexpr (block_elems(T) == 32) {
        for (int i = 0; i < 8; ++i) {
            const uint8_t* b = r.row(i) + at;
            s0[i] = fp16(b);
            if constexpr (HAS_MIN<T>) mn[i] = -fp16(b + 2);
            if constexpr (T == Q8_0) z[i] = load32(b + 2);
            if constexpr (T == Q4_0) z[i] = nibbles(b + 2);
            if constexpr (T == Q4_1) z[i] = nibbles(b + 4);
            if constexpr (T == Q5_0) z[i] = _mm256_or_si256(nibbles(b + 6), bit4(b + 2));
            if constexpr (T == Q5_1) z[i] = _mm256_or_si256(nibbles(b + 8), bit4(b + 4));
        }
        const __m256 sv = _mm256_load_ps(s0);
        consume<T, NM>(z, sv, sv, HAS_MIN<T> ? _mm256_load_ps(mn) : sv, ib, a, M, acc);
    } else {
        for (int s = 0; s < 8; ++s) {
            for (int i = 0; i < 8; ++i) {
                const uint8_t* b = r.row(i) + at;
                if constexpr (T == Q4_K || T == Q5_K) {
                    int sc, m;
                    scale_min_k4(s, b + 4, &sc, &m);
                    s0[i] = fp16(b) * sc;
                    mn[i] = fp16(b + 2) * m;
                    __m256i q = load32(b + (T == Q4_K ? 16 : 48) + 32 * (s / 2));
                    if (s & 1) q = _mm256_srli_epi16(q, 4);
                    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
                    if constexpr (T == Q5_K) {
                        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(load32(b + 16), s), _mm256_set1_epi8(1));
                        q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
                    }
                    z[i] = q;
                } else {                                     // Q6_K
                    const int quarter = s & 3, half = s / 4;
                    __m256i lo = load32(b + 64 * half + 32 * (quarter & 1));
                    if (quarter >= 2) lo = _mm256_srli_epi16(lo, 4);
                    lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
                    const __m256i h = _mm256_and_si256(_mm256_srli_epi16(load32(b + 128 + 32 * half), 2 * quarter),
                                                       _mm256_set1_epi8(3));
                    z[i] = _mm256_or_si256(lo, _mm256_slli_epi16(h, 4));
                    const float d = fp16(b + 208);
                    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
                    s0[i] = d * sc[2 * s];
                    s1[i] = d * sc[2 * s + 1];
                }
            }
            const __m256 a0 = _mm256_load_ps(s0);
            consume<T, NM>(z, a0, HALVES<T> ? _mm256_load_ps(s1) : a0, HAS_MIN<T> ? _mm256_load_ps(mn) : a0,
                           ib * 8 + s, a, M, acc);
        }
    }
}

// Rows [n0, n1) of W against activation rows [0, M), M <= 8, tile by tile; a last tile of
// fewer rows is copied, zero-filled, to `spare` (8 * rb bytes).
template <int T, int NM>
void tiles(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const Pack& a, int M, float* out,
           int64_t ldo, int64_t nb, uint8_t* spare) {
    Tile r{w, rb};
    const int64_t lines = 8 * rb / 64;
    for (int64_t t = n0; t < n1; t += 8) {
        r.p = w + t * rb;
        if (n1 - t < 8) {
            std::memcpy(spare, r.p, (n1 - t) * rb);
            std::memset(spare + (n1 - t) * rb, 0, (8 - (n1 - t)) * rb);
            r.p = spare;
        }
        __m256 acc[NM ? NM : 8];
        for (int m = 0; m < (NM ? NM : M); ++m) acc[m] = _mm256_setzero_ps();
        const char* next = reinterpret_cast<const char*>(w + (t + 8) * rb);
        for (int64_t ib = 0; ib < nb; ++ib) {
            for (int64_t l = lines * ib / nb; l < lines * (ib + 1) / nb; ++l)
                _mm_prefetch(next + 64 * l, _MM_HINT_T0);
            block<T, NM>(r, ib, a, M, acc);
        }
        const int keep = static_cast<int>(std::min<int64_t>(8, n1 - t));
        for (int m = 0; m < (NM ? NM : M); ++m) {
            alignas(32) float v[8];
            _mm256_store_ps(v, acc[m]);
            std::memcpy(out + m * ldo + t, v, keep * sizeof(float));
        }
    }
}

using TileFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const Pack&, int, float*, int64_t,
                       int64_t, uint8_t*);

template <int T>
TileFn pick(int M) {
    switch (M) {
        case 1: return tiles<T, 1>; case 2: return tiles<T, 2>; case 4: return tiles<T, 4>;
        case 8: return tiles<T, 8>;
    }
    return tiles<T, 0>;
}

TileFn tile_fn(int t, int M) {
    switch (t) {
        case Q4_0: return pick<Q4_0>(M); case Q4_1: return pick<Q4_1>(M);
        case Q5_0: return pick<Q5_0>(M); case Q5_1: return pick<Q5_1>(M);
        case Q8_0: return pick<Q8_0>(M); case Q4_K: return pick<Q4_K>(M);
        case Q5_K: return pick<Q5_K>(M); case Q6_K: return pick<Q6_K>(M);
    }
    return nullptr;             // unreachable: qmatmul.cpp checks the type first
}

}  // namespace

bool tiles256(int qtype, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a,
              int64_t M, float* out, int64_t ldo) {
    // One activation row gains nothing from the transpose without VNNI (measured: the Q8_0
    // head 4.5 ms on the 256-bit path, 6.1 ms on tiles): it stays on the 256-bit path.
    if (M < 2) return false;
    if (n1 <= n0) return true;
    thread_local Packed packed;
    thread_local std::vector<uint8_t> spare;
    spare.resize(8 * rb);
    for (int64_t m0 = 0; m0 < M; m0 += 8) {          // activation rows 8 at a time
        const int mt = static_cast<int>(std::min<int64_t>(8, M - m0));
        const TileFn f = tile_fn(qtype, mt);
        if (!f) return false;
        pack(a + m0, mt, qtype == Q8_0 ? 0 : offset(qtype), qtype == Q6_K, packed);
        f(w, rb, n0, n1, packed.view(), mt, out + m0 * ldo, ldo, a[0].K / block_elems(qtype), spare.data());
    }
    return true;
}

}  // namespace mimo_q

#else

namespace mimo_q {
bool tiles256(int, const uint8_t*, int64_t, int64_t, int64_t, const QAct*, int64_t, float*, int64_t) {
    return false;
}
}  // namespace mimo_q

#endif
