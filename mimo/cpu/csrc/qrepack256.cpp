// Q5_0 and Q4_K weights repacked for the 256-bit path: 8 rows interleaved per block, so
// that a tile's quants load already transposed (one int32 lane per weight row) and their
// fifth bits come out of one register by shifts. The AVX2 build's decode otherwise spends
// most of a Q5_0 block on gathering each row's bits and transposing (qtile256.cpp) or on
// one row at a time with a float step per block (qkernels.cpp); llama.cpp repacks its
// AVX2 weights for the same reason. The layout keeps the GGUF's bytes, 22 a row-block:
//
//   tile g = rows 8g..8g+7 = bytes [8g rb, 8g rb + 8 rb); its block j at + 176 j:
//   [0, 16)    the 8 rows' fp16 scales
//   [16, 48)   H: byte 4r+e, bit k = the fifth bit of row r's element 4k+e
//   [48, 176)  N_i, i = 0..3, 32 bytes each: byte 4r+e = row r's nibble of element 4i+e,
//              | the nibble of element 4(i+4)+e << 4
//
// Q4_K (GGML's 144-byte blocks of 256; 148 bytes a row-block here, the scales unpacked):
//
//   tile g = bytes [8g rb, 8g rb + 8 rb), rb = 148 per block of 256; its block i at + 1184 i:
//   [0, 16) the rows' fp16 d, [16, 32) their fp16 dmin
//   [32, 96) byte 8s+r: row r's 6-bit scale of sub-block s; [96, 160) the same for the mins
//   [160, 1184) per pair p = 0..3 of sub-blocks, 8 registers k of 32 bytes: byte 4r+e = row
//              r's quant of element 4k+e of sub-block 2p | that of sub-block 2p+1 << 4
//
// For Q5_0, register T_k (bytes 4r+e = row r's element 4k+e, as q + 16 in [0, 31]) is
// N_{k%4}'s low or high nibbles | (H shifted by 4-k) & 0x10. Each activation row then costs
// 8 u8 x s8 dots against its own 4-byte groups broadcast, one conversion and two float ops
// per block; the -16 comes back as -16 sum(x) from the activations' block sums.
//
// This file owns the layout: the repack, its inverse (for the reference path) and the
// kernel. Built in both builds (the VNNI one dots with vpdpbusd); only the AVX2 build's
// weights are repacked (mimo/models/quantized.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <utility>

#include "qcommon.h"
#include "kernels.h"

namespace mimo_q {
namespace {

constexpr int64_t X8 = 8;                       // rows a tile
constexpr int64_t XB = 22 * X8;                 // bytes a tile's Q5_0 block
constexpr int64_t KB = 148 * X8;                // bytes a tile's Q4_K block

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256i bcast(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

// 8 unsigned bytes -> 8 floats
inline __m256 bytes8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// sum over k < 4 of T[k] . x[4k..4k+3] per int32 lane (T[k] in [0, 31]: a vpmaddubsw lane
// is at most 2 x 31 x 127 = 7,874, so four add up within int16 before widening)
inline __m256i dot4(const __m256i* T, const int8_t* x) {
#ifdef MIMO_ISA_VNNI
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), T[0], bcast(x));
    s = _mm256_dpbusd_epi32(s, T[1], bcast(x + 4));
    s = _mm256_dpbusd_epi32(s, T[2], bcast(x + 8));
    return _mm256_dpbusd_epi32(s, T[3], bcast(x + 12));
#else
    const __m256i p = _mm256_add_epi16(
        _mm256_add_epi16(_mm256_maddubs_epi16(T[0], bcast(x)), _mm256_maddubs_epi16(T[1], bcast(x + 4))),
        _mm256_add_epi16(_mm256_maddubs_epi16(T[2], bcast(x + 8)), _mm256_maddubs_epi16(T[3], bcast(x + 12))));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

// Tiles of rows [n0, n1) (multiples of 8) against activation rows [0, NM or M).
template <int NM>
void tiles(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a, int M,
           float* out, int64_t ldo) {
    const int rows = NM ? NM : M;
    const int64_t nb = rb / 22, tb = X8 * rb, lines = tb / 64;
    const __m256i lo = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    // the first tiles whole, then each block step asks for its share of the tile 2 ahead
    for (int64_t l = 0; l < lines * std::min<int64_t>(2, (n1 - n0) / X8); ++l)
        _mm_prefetch(reinterpret_cast<const char*>(w + n0 * rb) + 64 * l, _MM_HINT_T0);
    for (int64_t t = n0; t < n1; t += X8) {
        const uint8_t* tile = w + t * rb;
        const char* ahead = reinterpret_cast<const char*>(tile + 2 * tb);
        const bool pf = t + 3 * X8 <= n1;
        __m256 acc[NM ? NM : 8];
        for (int m = 0; m < rows; ++m) acc[m] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nb; ++j) {
            if (pf)
                for (int64_t l = lines * j / nb; l < lines * (j + 1) / nb; ++l)
                    _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
            const uint8_t* b = tile + XB * j;
            const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
            const __m256i H = load32(b + 16);
            __m256i T[8];
            for (int i = 0; i < 4; ++i) {
                const __m256i n = load32(b + 48 + 32 * i);
                T[i] = _mm256_and_si256(n, lo);
                T[i + 4] = _mm256_and_si256(_mm256_srli_epi16(n, 4), lo);
            }
            T[0] = _mm256_or_si256(T[0], _mm256_and_si256(_mm256_slli_epi16(H, 4), b4));
            T[1] = _mm256_or_si256(T[1], _mm256_and_si256(_mm256_slli_epi16(H, 3), b4));
            T[2] = _mm256_or_si256(T[2], _mm256_and_si256(_mm256_slli_epi16(H, 2), b4));
            T[3] = _mm256_or_si256(T[3], _mm256_and_si256(_mm256_slli_epi16(H, 1), b4));
            T[4] = _mm256_or_si256(T[4], _mm256_and_si256(H, b4));
            T[5] = _mm256_or_si256(T[5], _mm256_and_si256(_mm256_srli_epi16(H, 1), b4));
            T[6] = _mm256_or_si256(T[6], _mm256_and_si256(_mm256_srli_epi16(H, 2), b4));
            T[7] = _mm256_or_si256(T[7], _mm256_and_si256(_mm256_srli_epi16(H, 3), b4));
#pragma GCC unroll 8
            for (int m = 0; m < rows; ++m) {
                const int8_t* x = a[m].q + 32 * j;
                const int32_t sx = a[m].isum16[2 * j] + a[m].isum16[2 * j + 1];
                __m256i s = _mm256_add_epi32(dot4(T, x), dot4(T + 4, x + 16));
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(16 * sx));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sw, _mm256_set1_ps(a[m].d[j])), acc[m]);
            }
        }
        for (int m = 0; m < rows; ++m) _mm256_storeu_ps(out + m * ldo + t, acc[m]);
    }
}

// Q4_K tiles of rows [n0, n1): value = d sc q - dmin m, per 32-element sub-block s.
template <int NM>
void tiles_q4k(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a, int M,
               float* out, int64_t ldo) {
    const int rows = NM ? NM : M;
    const int64_t nb = rb / 148, tb = X8 * rb, lines = tb / 64;
    const __m256i lo = _mm256_set1_epi8(0x0F);
    for (int64_t l = 0; l < lines * std::min<int64_t>(2, (n1 - n0) / X8); ++l)
        _mm_prefetch(reinterpret_cast<const char*>(w + n0 * rb) + 64 * l, _MM_HINT_T0);
    for (int64_t t = n0; t < n1; t += X8) {
        const uint8_t* tile = w + t * rb;
        const char* ahead = reinterpret_cast<const char*>(tile + 2 * tb);
        const bool pf = t + 3 * X8 <= n1;
        __m256 acc[NM ? NM : 8];
        for (int m = 0; m < rows; ++m) acc[m] = _mm256_setzero_ps();
        for (int64_t ib = 0; ib < nb; ++ib) {
            if (pf)
                for (int64_t l = lines * ib / nb; l < lines * (ib + 1) / nb; ++l)
                    _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
            const uint8_t* b = tile + KB * ib;
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
            const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
            for (int s = 0; s < 8; ++s) {
                const uint8_t* q = b + 160 + 256 * (s / 2);
                __m256i T[8];
                for (int k = 0; k < 8; ++k) {
                    const __m256i n = load32(q + 32 * k);
                    T[k] = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(n, 4) : n, lo);
                }
                const __m256 sc = _mm256_mul_ps(dv, bytes8(b + 32 + 8 * s));
                const __m256 mn = _mm256_mul_ps(mv, bytes8(b + 96 + 8 * s));
                const int64_t j = 8 * ib + s;
#pragma GCC unroll 8
                for (int m = 0; m < rows; ++m) {
                    const int8_t* x = a[m].q + 32 * j;
                    const __m256i d = _mm256_add_epi32(dot4(T, x), dot4(T + 4, x + 16));
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sc, _mm256_set1_ps(a[m].d[j])), acc[m]);
                    acc[m] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(a[m].dsum[j]), acc[m]);
                }
            }
        }
        for (int m = 0; m < rows; ++m) _mm256_storeu_ps(out + m * ldo + t, acc[m]);
    }
}

using TilesFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const QAct*, int, float*, int64_t);

TilesFn tiles_fn(int qtype, int M) {
    if (qtype == Q4_KX8) {
        switch (M) {
            case 1: return tiles_q4k<1>; case 2: return tiles_q4k<2>; case 3: return tiles_q4k<3>;
            case 4: return tiles_q4k<4>; case 8: return tiles_q4k<8>;
        }
        return tiles_q4k<0>;
    }
    switch (M) {
        case 1: return tiles<1>; case 2: return tiles<2>; case 3: return tiles<3>;
        case 4: return tiles<4>; case 8: return tiles<8>;
    }
    return tiles<0>;
}

// Element i of a GGUF Q5_0 block: its nibble and fifth bit.
inline int nibble(const uint8_t* blk, int i) { return i < 16 ? blk[6 + i] & 15 : blk[6 + i - 16] >> 4; }
inline int bit5(const uint8_t* blk, int i) {
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    return (qh >> i) & 1;
}

// GGUF Q5_0 block j of rows 8g..8g+7 -> the tile's block d (zeroed), and back.
void pack_q5_0(const uint8_t* src, int64_t rb, int64_t g, int64_t j, uint8_t* d) {
    for (int r = 0; r < X8; ++r) {
        const uint8_t* blk = src + (g * X8 + r) * rb + 22 * j;
        std::memcpy(d + 2 * r, blk, 2);
        for (int e = 0; e < 32; ++e) {
            const int k = e / 4, byte = 4 * r + e % 4;
            d[16 + byte] |= static_cast<uint8_t>(bit5(blk, e) << k);
            d[48 + 32 * (k % 4) + byte] |= static_cast<uint8_t>(nibble(blk, e) << (k >= 4 ? 4 : 0));
        }
    }
}

void unpack_q5_0(const uint8_t* s, uint8_t* dst, int64_t rb, int64_t g, int64_t j) {
    for (int r = 0; r < X8; ++r) {
        uint8_t* blk = dst + (g * X8 + r) * rb + 22 * j;
        std::memcpy(blk, s + 2 * r, 2);
        uint32_t qh = 0;
        for (int e = 0; e < 32; ++e) {
            const int k = e / 4, byte = 4 * r + e % 4;
            qh |= static_cast<uint32_t>((s[16 + byte] >> k) & 1) << e;
            const int nib = (s[48 + 32 * (k % 4) + byte] >> (k >= 4 ? 4 : 0)) & 15;
            blk[6 + e % 16] |= static_cast<uint8_t>(e < 16 ? nib : nib << 4);
        }
        std::memcpy(blk + 2, &qh, 4);
    }
}

// Q4_K's 12 scale bytes <-> the 8 sub-blocks' 6-bit scales and mins (ggml's get_scale_min_k4).
void scales_of(const uint8_t* q, uint8_t* sc, uint8_t* m) {
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
}

void scales_to(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
    for (int j = 0; j < 4; ++j) {
        q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

// GGUF Q4_K block i of rows 8g..8g+7 (row bytes rs) -> the tile's block d (zeroed), and back.
void pack_q4_k(const uint8_t* src, int64_t rs, int64_t g, int64_t i, uint8_t* d) {
    for (int r = 0; r < X8; ++r) {
        const uint8_t* blk = src + (g * X8 + r) * rs + 144 * i;
        std::memcpy(d + 2 * r, blk, 2);
        std::memcpy(d + 16 + 2 * r, blk + 2, 2);
        uint8_t sc[8], m[8];
        scales_of(blk + 4, sc, m);
        for (int s = 0; s < 8; ++s) {
            d[32 + 8 * s + r] = sc[s];
            d[96 + 8 * s + r] = m[s];
            for (int e = 0; e < 32; ++e) {
                const int q = (blk[16 + 32 * (s / 2) + e] >> (4 * (s & 1))) & 15;
                d[160 + 256 * (s / 2) + 32 * (e / 4) + 4 * r + e % 4] |= static_cast<uint8_t>(q << (4 * (s & 1)));
            }
        }
    }
}

void unpack_q4_k(const uint8_t* d, uint8_t* dst, int64_t rs, int64_t g, int64_t i) {
    for (int r = 0; r < X8; ++r) {
        uint8_t* blk = dst + (g * X8 + r) * rs + 144 * i;
        std::memcpy(blk, d + 2 * r, 2);
        std::memcpy(blk + 2, d + 16 + 2 * r, 2);
        uint8_t sc[8], m[8];
        for (int s = 0; s < 8; ++s) {
            sc[s] = d[32 + 8 * s + r];
            m[s] = d[96 + 8 * s + r];
            for (int e = 0; e < 32; ++e) {
                const int q = (d[160 + 256 * (s / 2) + 32 * (e / 4) + 4 * r + e % 4] >> (4 * (s & 1))) & 15;
                blk[16 + 32 * (s / 2) + e] |= static_cast<uint8_t>(q << (4 * (s & 1)));
            }
        }
        scales_to(sc, m, blk + 4);
    }
}

// (GGUF block bytes, tile-layout row bytes per block) of a type with a repacked layout.
std::pair<int64_t, int64_t> sizes(int64_t t) {
    TORCH_CHECK(t == Q5_0 || t == Q4_K, "no repacked layout for GGML type ", t);
    return t == Q5_0 ? std::make_pair<int64_t, int64_t>(22, 22) : std::make_pair<int64_t, int64_t>(144, 148);
}

void check_rows8(const torch::Tensor& w, int64_t bytes) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
                "weights must be contiguous uint8 [N, row_bytes] blocks");
    TORCH_CHECK(w.size(0) % X8 == 0, "a repacked weight needs a multiple of 8 rows, got ", w.size(0));
    TORCH_CHECK(w.size(1) % bytes == 0, "rows of ", w.size(1), " bytes are not whole blocks");
}

}  // namespace

bool rows_x8(int qtype, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a,
             int64_t M, float* out, int64_t ldo) {
    if (qtype != Q5_0X8 && qtype != Q4_KX8) return false;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {          // activation rows 8 at a time
        const int mt = static_cast<int>(std::min<int64_t>(8, M - m0));
        tiles_fn(qtype, mt)(w, rb, n0, n1, a + m0, mt, out + m0 * ldo, ldo);
    }
    return true;
}

}  // namespace mimo_q

using namespace mimo_q;

torch::Tensor repack_x8(const torch::Tensor& w, int64_t qtype) {
    const auto [gb, xb] = sizes(qtype);
    check_rows8(w, gb);
    const int64_t N = w.size(0), nb = w.size(1) / gb, rb = nb * xb;
    torch::Tensor out = torch::zeros({N, rb}, torch::kUInt8);
    const uint8_t* src = w.data_ptr<uint8_t>();
    uint8_t* dst = out.data_ptr<uint8_t>();
    at::parallel_for(0, N / X8 * nb, 64, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t g = i / nb, j = i % nb;
            uint8_t* d = dst + g * X8 * rb + X8 * xb * j;
            if (qtype == Q5_0) pack_q5_0(src, w.size(1), g, j, d);
            else pack_q4_k(src, w.size(1), g, j, d);
        }
    });
    return out;
}

torch::Tensor unpack_x8(const torch::Tensor& p, int64_t qtype) {
    const auto [gb, xb] = sizes(qtype);
    check_rows8(p, xb);
    const int64_t N = p.size(0), nb = p.size(1) / xb, rs = nb * gb;
    torch::Tensor out = torch::zeros({N, rs}, torch::kUInt8);
    const uint8_t* src = p.data_ptr<uint8_t>();
    uint8_t* dst = out.data_ptr<uint8_t>();
    for (int64_t g = 0; g < N / X8; ++g)
        for (int64_t j = 0; j < nb; ++j) {
            const uint8_t* d = src + g * X8 * p.size(1) + X8 * xb * j;
            if (qtype == Q5_0) unpack_q5_0(d, dst, rs, g, j);
            else unpack_q4_k(d, dst, rs, g, j);
        }
    return out;
}
