// The 512-bit tiles' decoding (qtile512.cpp has the design notes): 16 weight rows of any
// GGUF type decoded, 32 elements at a time, into unsigned bytes q + OFF, two rows to a
// register, with the rows' scales and mins in lanes; and the transpose that puts bytes
// 4k..4k+3 of every row in register k. Shared by the decode tiles (qtile512.cpp) and the
// prefill GEMM (qgemm512.cpp). VNNI build only.
#pragma once
#include "qcommon.h"
#include "qpack.h"

#ifdef MIMO_ISA_VNNI
namespace mimo_q {
namespace tile512 {

struct Tile {                  // 16 weight rows of `rb` bytes from `p`
    const uint8_t* p;
    int64_t rb;
    __m512i off;               // r * rb in lane r, for gathers
    const uint8_t* row(int r) const { return p + r * rb; }
};

// lanes r of the 32-bit words at row r + at
inline __m512i gather(const Tile& r, int64_t at) {
    return _mm512_i32gather_epi32(r.off, r.p + at, 1);
}
inline __m512 half_lo(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)); }
inline __m512 half_hi(__m512i g) { return half_lo(_mm512_srli_epi32(g, 16)); }

// [32 bytes at lo | 32 bytes at hi]
inline __m512i pair256(const uint8_t* lo, const uint8_t* hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
}
// 16 bytes of nibbles at lo and at hi -> [lo & 15, lo >> 4, hi & 15, hi >> 4] (32 each)
inline __m512i nibbles(const uint8_t* lo, const uint8_t* hi) {
    __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo)));
    z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)));
    z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}
// 32 bits at lo and at hi -> 16 added to the bytes whose bit is set
inline __m512i add_bit4(__m512i z, const uint8_t* lo, const uint8_t* hi) {
    uint32_t a, b;
    std::memcpy(&a, lo, 4);
    std::memcpy(&b, hi, 4);
    return _mm512_mask_add_epi8(z, _cvtu64_mask64(a | (static_cast<uint64_t>(b) << 32)), z,
                                _mm512_set1_epi8(16));
}

// z[i] = [row i | row i + 8] (32 bytes each) -> t[k] = bytes 4k..4k+3 of rows 0..15
inline void transpose(const __m512i z[8], __m512i t[8]) {
    __m512i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        a[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {           // rows i..i+3: words {0,4}, {1,5}, {2,6}, {3,7}
        b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
        b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; ++k) {
        t[k] = _mm512_permutex2var_epi64(b[k], lo, b[k + 4]);
        t[k + 4] = _mm512_permutex2var_epi64(b[k], hi, b[k + 4]);
    }
}

inline __m512i dot4(__m512i acc, const __m512i* t, const int8_t* x) {
    for (int k = 0; k < 4; ++k) {
        int32_t v;
        std::memcpy(&v, x + 4 * k, 4);
        acc = _mm512_dpbusd_epi32(acc, t[k], _mm512_set1_epi32(v));
    }
    return acc;
}

// acc + the float side of one activation row's product with a sub-block of 16 rows, from
// its integer dots i0 (elements 0-15, or all 32 unless HALVES) and i1 (16-31, HALVES only):
// s0 / s1 / mn the rows' scales and mins, d the activation row's scale, ds its d * sum.
template <int T>
inline __m512 finish(__m512i i0, __m512i i1, __m512 s0, __m512 s1, __m512 mn, float d, float ds,
                     __m512 acc) {
    if constexpr (HALVES<T>) {
        const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), s1,
                                         _mm512_mul_ps(_mm512_cvtepi32_ps(i0), s0));
        return _mm512_fmadd_ps(f, _mm512_set1_ps(d), acc);
    } else {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(s0, _mm512_set1_ps(d)), acc);
        if constexpr (HAS_MIN<T>) acc = _mm512_fnmadd_ps(mn, _mm512_set1_ps(ds), acc);
        return acc;
    }
}

// acc + one activation row's product with a sub-block of 16 rows (t: the rows transposed;
// x: the row's 32 quants; st: its dot's two starting values). The decode tiles run it; the
// GEMM runs the same integer dots and `finish`, several rows interleaved.
template <int T>
inline __m512 row_dot(const __m512i* t, __m512 s0, __m512 s1, __m512 mn, const int8_t* x,
                      const int32_t* st, float d, float ds, __m512 acc) {
    if constexpr (HALVES<T>)
        return finish<T>(dot4(_mm512_set1_epi32(st[0]), t, x), dot4(_mm512_set1_epi32(st[1]), t + 4, x + 16),
                         s0, s1, mn, d, ds, acc);
    else
        return finish<T>(dot4(dot4(_mm512_set1_epi32(st[0]), t, x), t + 4, x + 16), _mm512_setzero_si512(),
                         s0, s1, mn, d, ds, acc);
}

// Block ib of the 16 rows, all of its sub-blocks: for each, sink(z, s0, s1, mn, j) with z
// the 16 rows decoded two to a register, s0 / s1 the rows' scales for elements 0-15 and
// 16-31, mn their mins and j the sub-block's index along the row.
template <int T, class Sink>
inline void decode_block(const Tile& r, int64_t ib, Sink&& sink) {
    constexpr int64_t bb = block_bytes(T);
    const int64_t at = ib * bb;
    __m512i z[8];
    if constexpr (block_elems(T) == 32) {
        const __m512i g = gather(r, at);
        const __m512 d = half_lo(g);
        const __m512 mn = HAS_MIN<T> ? _mm512_sub_ps(_mm512_setzero_ps(), half_hi(g)) : d;
        for (int i = 0; i < 8; ++i) {
            const uint8_t* lo = r.row(i) + at;
            const uint8_t* hi = r.row(i + 8) + at;
            if constexpr (T == Q8_0) z[i] = _mm512_xor_si512(pair256(lo + 2, hi + 2), _mm512_set1_epi8(-128));
            if constexpr (T == Q4_0) z[i] = nibbles(lo + 2, hi + 2);
            if constexpr (T == Q4_1) z[i] = nibbles(lo + 4, hi + 4);
            if constexpr (T == Q5_0) z[i] = add_bit4(nibbles(lo + 6, hi + 6), lo + 2, hi + 2);
            if constexpr (T == Q5_1) z[i] = add_bit4(nibbles(lo + 8, hi + 8), lo + 4, hi + 4);
        }
        sink(z, d, d, mn, ib);
    } else if constexpr (T == Q4_K || T == Q5_K) {
        const __m512i g = gather(r, at);
        const __m512 d = half_lo(g), dmin = half_hi(g);
        const __m512i g0 = gather(r, at + 4), g1 = gather(r, at + 8), g2 = gather(r, at + 12);
        const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
        constexpr int qs = T == Q4_K ? 16 : 48;
        for (int s = 0; s < 8; ++s) {        // ggml's get_scale_min_k4, one row per lane
            __m512i sc, mi;
            const int sh = 8 * (s & 3);
            if (s < 4) {
                sc = _mm512_and_si512(_mm512_srli_epi32(g0, sh), m6);
                mi = _mm512_and_si512(_mm512_srli_epi32(g1, sh), m6);
            } else {
                const __m512i x = _mm512_srli_epi32(g2, sh);
                sc = _mm512_or_si512(_mm512_and_si512(x, m4),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(g0, sh + 6), m2), 4));
                mi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(x, 4), m4),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(g1, sh + 6), m2), 4));
            }
            for (int i = 0; i < 8; ++i) {
                const uint8_t* lo = r.row(i) + at;
                const uint8_t* hi = r.row(i + 8) + at;
                __m512i q = pair256(lo + qs + 32 * (s / 2), hi + qs + 32 * (s / 2));
                if (s & 1) q = _mm512_srli_epi16(q, 4);
                q = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
                if constexpr (T == Q5_K) {   // bit s of each qh byte -> bit 4
                    const __m512i h = pair256(lo + 16, hi + 16);
                    const __m512i b = s <= 4 ? _mm512_slli_epi16(h, 4 - s) : _mm512_srli_epi16(h, s - 4);
                    q = _mm512_or_si512(q, _mm512_and_si512(b, _mm512_set1_epi8(0x10)));
                }
                z[i] = q;
            }
            const __m512 scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
            sink(z, scale, scale, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mi)), ib * 8 + s);
        }
    } else if constexpr (T == Q6_K) {
        const __m512 d = half_hi(gather(r, at + 206));
        __m512i sc[4];
        for (int c = 0; c < 4; ++c) sc[c] = gather(r, at + 192 + 4 * c);
        for (int s = 0; s < 8; ++s) {
            const int quarter = s & 3, half = s / 4;
            for (int i = 0; i < 8; ++i) {
                const uint8_t* lo = r.row(i) + at;
                const uint8_t* hi = r.row(i + 8) + at;
                const int ql = 64 * half + 32 * (quarter & 1), qh = 128 + 32 * half;
                __m512i q = pair256(lo + ql, hi + ql);
                if (quarter >= 2) q = _mm512_srli_epi16(q, 4);
                q = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
                const __m512i h = pair256(lo + qh, hi + qh);   // bits 2 quarter, +1 -> bits 4, 5
                const __m512i b = quarter < 3 ? _mm512_slli_epi16(h, 4 - 2 * quarter) : _mm512_srli_epi16(h, 2);
                z[i] = _mm512_or_si512(q, _mm512_and_si512(b, _mm512_set1_epi8(0x30)));
            }
            const __m512i w = sc[s / 2];              // int8 scales 2s and 2s + 1
            const int b0 = 16 * (s & 1);
            const __m512 s0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - b0), 24));
            const __m512 s1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 16 - b0), 24));
            sink(z, _mm512_mul_ps(d, s0), _mm512_mul_ps(d, s1), d, ib * 8 + s);
        }
    }
}

}  // namespace tile512
}  // namespace mimo_q
#endif
