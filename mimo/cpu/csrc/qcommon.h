// What the block-quantized kernels share: the GGML block types, the quantized activations,
// and the entry points of each translation unit (qkernels.cpp: the activations and the
// 256-bit path; qtile512.cpp: the 512-bit VNNI tiles; qmatmul.cpp: the products).
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace mimo_q {

enum QType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14,
                   Q5_0X8 = 106, Q8_0X8 = 108, Q4_KX8 = 112, Q6_KX8 = 114 };   // not GGML's: 8-row tiles (qrepack.h), GGML's id + 100

inline float fp16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// The 4 bytes at x in every int32 lane: an activation group against a register of tiles'
// transposed weights (qtile256.cpp, qrepack256.cpp).
inline __m256i bcast4(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

// Bytes per block and elements per block of each supported type (ggml's block structs).
constexpr int block_bytes(int t) {
    switch (t) {
        case Q4_0: return 18; case Q4_1: return 20; case Q5_0: return 22; case Q5_1: return 24;
        case Q8_0: return 34; case Q5_0X8: return 22; case Q8_0X8: return 34; case Q4_K: return 144; case Q4_KX8: return 148; case Q6_KX8: return 210; case Q5_K: return 176; case Q6_K: return 210;
    }
    return 0;
}
// The 8-row tiles' types (qrepack.h): weights of a multiple of 8 rows only.
constexpr bool is_x8(int t) { return t == Q5_0X8 || t == Q8_0X8 || t == Q4_KX8 || t == Q6_KX8; }
// The GGML type whose values a type holds (itself, or the one an 8-row tile type reorders).
constexpr int ggml_type(int t) { return is_x8(t) ? t - 100 : t; }
constexpr int block_elems(int t) { return (t == Q4_K || t == Q5_K || t == Q6_K || t == Q4_KX8 || t == Q6_KX8) ? 256 : 32; }

// One activation row quantized per block of 32: int8 quants, float scale d, d * sum(quants)
// (for the weight types with a min), and the sum of the quants of each half-block of 16
// (for the 512-bit tiles, which take weights as unsigned bytes q + offset and subtract
// offset * sum(quants) back).
struct QAct {
    const int8_t* q;
    const float* d;
    const float* dsum;
    const int32_t* isum16;
    int64_t K;
};

// One block of 32 activations -> its quants, scale, d * sum and the halves' sums (qkernels.cpp).
void quantize_block(const float* v, int8_t* q, float* d, float* dsum, int32_t* isum16);

// out[m * ldo + n] = row n of W . activation row m, for n in [n0, n1) and m < M: the
// 256-bit path (qkernels.cpp), every build.
void rows256(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
             const QAct* a, int64_t M, float* out, int64_t ldo);

// The same on 512-bit VNNI tiles of 16 weight rows (qtile512.cpp); false (nothing done)
// in a build without AVX-512 VNNI.
bool tiles512(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
              const QAct* a, int64_t M, float* out, int64_t ldo);

// The same on AVX2 tiles of 8 weight rows (qtile256.cpp); false in the VNNI build.
bool tiles256(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
              const QAct* a, int64_t M, float* out, int64_t ldo);

// The same for the 8-row tiles' types (qrepack256.cpp), every build; false for any other.
bool rows_x8(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
             const QAct* a, int64_t M, float* out, int64_t ldo);

}  // namespace mimo_q
