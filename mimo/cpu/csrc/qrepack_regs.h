// The 8-row tiles' registers (qrepack.h), decoded: per 32-element sub-block, 8 registers of
// 256 bits, register k holding bytes 4k..4k+3 of each row in its int32 lane, as unsigned
// quants q + offset (Q5_0: 16, Q6_K: 32, Q4_K: 0) or, for Q8_0, the signed quants as stored.
// Shared by the decode tiles (qrepack256.cpp, one activation row at a time against them)
// and the VNNI build's prefill GEMM (qgemm512.cpp, two tiles side by side as one 16-row
// tile), so both read one decoding.
#pragma once
#include "qrepack.h"

namespace mimo_q::x8 {

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Block b's sub-block (Q5_0: the whole block) as 5-bit quants.
inline void q5_0_regs(const uint8_t* b, __m256i* T) {
    using L = Layout<Q5_0X8>;
    const __m256i LO = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const __m256i H = load32(b + L::BITS);
    for (int i = 0; i < 4; ++i) {
        const __m256i n = load32(b + L::NIBBLES + 32 * i);
        T[i] = _mm256_and_si256(n, LO);
        T[i + 4] = _mm256_and_si256(_mm256_srli_epi16(n, 4), LO);
    }
    T[0] = _mm256_or_si256(T[0], _mm256_and_si256(_mm256_slli_epi16(H, 4), b4));
    T[1] = _mm256_or_si256(T[1], _mm256_and_si256(_mm256_slli_epi16(H, 3), b4));
    T[2] = _mm256_or_si256(T[2], _mm256_and_si256(_mm256_slli_epi16(H, 2), b4));
    T[3] = _mm256_or_si256(T[3], _mm256_and_si256(_mm256_slli_epi16(H, 1), b4));
    T[4] = _mm256_or_si256(T[4], _mm256_and_si256(H, b4));
    T[5] = _mm256_or_si256(T[5], _mm256_and_si256(_mm256_srli_epi16(H, 1), b4));
    T[6] = _mm256_or_si256(T[6], _mm256_and_si256(_mm256_srli_epi16(H, 2), b4));
    T[7] = _mm256_or_si256(T[7], _mm256_and_si256(_mm256_srli_epi16(H, 3), b4));
}

// Sub-block s's 4-bit quants from the nibble registers at n (pairs of sub-blocks share a
// register set: Q4_K's quants, Q6_K's low bits).
inline void nibble_regs(const uint8_t* n, int s, __m256i* T) {
    const __m256i LO = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 8; ++k) {
        const __m256i v = load32(n + 256 * (s / 2) + 32 * k);
        T[k] = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(v, 4) : v, LO);
    }
}

// Block b's sub-block s as Q6_K's 6-bit quants.
inline void q6_k_regs(const uint8_t* b, int s, __m256i* T) {
    using L = Layout<Q6_KX8>;
    const __m256i hi = _mm256_set1_epi8(0x30);
    nibble_regs(b + L::NIBBLES, s, T);
    const int q = s % 4;                     // its 2 bits at 2q: moved to bits 4-5
    for (int k = 0; k < 8; ++k) {
        const __m256i h = load32(b + L::HIGH + 256 * (s / 4) + 32 * k);
        const __m256i at = q < 2 ? _mm256_slli_epi16(h, 4 - 2 * q) : q == 2 ? h : _mm256_srli_epi16(h, 2);
        T[k] = _mm256_or_si256(T[k], _mm256_and_si256(at, hi));
    }
}

}  // namespace mimo_q::x8
