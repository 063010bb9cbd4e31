// The activation rows of a call packed for the weight tiles (qtile512.cpp, qtile256.cpp), and
// the weight types' traits the tiles share. No torch headers.
#pragma once
#include <vector>

#include "qcommon.h"

namespace mimo_q {

template <int T> constexpr int OFF = 0;        // q + OFF is the unsigned byte decoded
template <> constexpr int OFF<Q8_0> = 128;
template <> constexpr int OFF<Q4_0> = 8;
template <> constexpr int OFF<Q5_0> = 16;
template <> constexpr int OFF<Q6_K> = 32;
template <int T> constexpr bool HAS_MIN = T == Q4_1 || T == Q5_1 || T == Q4_K || T == Q5_K;
template <int T> constexpr bool HALVES = T == Q6_K;   // a scale per 16 elements

// The activation rows of one call in the order the tiles read them: per 32-element block j,
// each row's 32 quants, the dot's starting value -OFF * sum(quants) (per half-block of 16
// for HALVES types, else the whole in the first), its scale and d * sum(quants).
struct Pack {
    const int8_t* x;           // [blocks][M][32]
    const int32_t* start;      // [blocks][M][2]
    const float* d;            // [blocks][M]
    const float* dsum;         // [blocks][M]
};

// Activation rows [0, M) packed for a weight type with offset `off`.
struct Packed {
    std::vector<int8_t> x;
    std::vector<int32_t> start;
    std::vector<float> d, dsum;
    Pack view() const { return Pack{x.data(), start.data(), d.data(), dsum.data()}; }
};

inline void pack(const QAct* a, int M, int off, bool halves, Packed& p) {
    const int64_t nb = a[0].K / 32;
    p.x.resize(nb * M * 32);
    p.start.resize(nb * M * 2);
    p.d.resize(nb * M);
    p.dsum.resize(nb * M);
    for (int64_t j = 0; j < nb; ++j)
        for (int m = 0; m < M; ++m) {
            const int64_t i = j * M + m;
            std::memcpy(&p.x[32 * i], a[m].q + 32 * j, 32);
            const int32_t h0 = a[m].isum16[2 * j], h1 = a[m].isum16[2 * j + 1];
            p.start[2 * i] = -off * (halves ? h0 : h0 + h1);
            p.start[2 * i + 1] = halves ? -off * h1 : 0;
            p.d[i] = a[m].d[j];
            p.dsum[i] = a[m].dsum[j];
        }
}

inline int offset(int t) {      // a GGML type's, or that of the one an 8-row tile type reorders
    switch (ggml_type(t)) {
        case Q8_0: return OFF<Q8_0>; case Q4_0: return OFF<Q4_0>; case Q5_0: return OFF<Q5_0>;
        case Q6_K: return OFF<Q6_K>;
    }
    return 0;
}

}  // namespace mimo_q

namespace mimo_q {

// Activation rows [m0, m0 + rows) packed for the prefill GEMM.
struct RowGroup {
    Pack a;
    int rows;
    int64_t m0;
};

// Rows per group of the prefill GEMM in this build; 0 where it has none (AVX2).
int gemm_rows();

// out[m * ldo + n] = row n of W . activation row m, for n in [n0, n1) and the rows of the
// groups g[0, ng): each 16-row weight tile decoded once for all of them (qgemm512.cpp);
// false (nothing done) where the build or the type has no GEMM.
bool gemm512(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t K,
             const RowGroup* g, int64_t ng, float* out, int64_t ldo);

}  // namespace mimo_q
