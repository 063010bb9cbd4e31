// The prefill GEMM on 512-bit VNNI tiles: x [M, K] @ W^T for M > 16 activation rows.
//
// The decode tiles (qtile512.cpp) decode and transpose a 16-row weight tile for every 16
// activation rows, so at prefill sizes that work is paid M / 16 times. Here a tile is
// decoded once per call (per chunk of activation rows, see qmatmul.cpp) into a thread-local
// scratch of K / 32 sub-blocks, each 8 transposed registers and its scales and mins (704
// bytes: 22 K bytes a tile, 45 KB at K = 2048), and every group of GEMM_ROWS activation
// rows then runs against it with its accumulators in registers. The per-row arithmetic is
// the decode tiles' own (row_dot), so each row's result equals theirs bit for bit.
#include "qdecode512.h"

#ifdef MIMO_ISA_VNNI
#include <algorithm>
#include <vector>

namespace mimo_q {
namespace {

using namespace tile512;

constexpr int GEMM_ROWS = 8;   // activation rows per group: 8 accumulators + 8 weight registers

struct alignas(64) Sub {       // one 32-element sub-block of a tile, decoded and transposed
    __m512i t[8];
    __m512 s0, s1, mn;
};

// The tile at r (16 rows, nb blocks) into out[0, nb * block_elems / 32), asking for `next`'s
// `lines` cache lines in address order meanwhile (the rows are read side by side).
template <int T>
void decode_tile(const Tile& r, int64_t nb, const char* next, int64_t lines, Sub* out) {
    for (int64_t ib = 0; ib < nb; ++ib) {
        for (int64_t l = lines * ib / nb; l < lines * (ib + 1) / nb; ++l)
            _mm_prefetch(next + 64 * l, _MM_HINT_T0);
        decode_block<T>(r, ib, [&](const __m512i z[8], __m512 s0, __m512 s1, __m512 mn, int64_t j) {
            Sub& s = out[j];
            transpose(z, s.t);
            s.s0 = s0;
            s.s1 = s1;
            s.mn = mn;
        });
    }
}

inline __m512i bcast4(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

// One group of activation rows (NM, or M < GEMM_ROWS at run time) against a decoded tile.
// Each row's 8 vpdpbusd of a sub-block form a chain; the rows' chains are interleaved (one
// weight register against every row in turn) so that no instruction waits on the one
// before. Integer sums are exact in any order, so each row ends equal to row_dot's.
template <int T, int NM>
void run_group(const Sub* w, int64_t nsub, const Pack& a, int M, float* out, int64_t ldo,
               __mmask16 keep) {
    const int rows = NM ? NM : M;
    __m512 acc[GEMM_ROWS];
    __m512i i0[GEMM_ROWS], i1[GEMM_ROWS];
    for (int m = 0; m < rows; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nsub; ++j) {
        const Sub& s = w[j];
        const int8_t* x = a.x + 32 * j * rows;
        const int32_t* st = a.start + 2 * j * rows;
        const float* d = a.d + j * rows;
        const float* ds = a.dsum + j * rows;
#pragma GCC unroll 8
        for (int m = 0; m < rows; ++m) {
            i0[m] = _mm512_set1_epi32(st[2 * m]);
            i1[m] = HALVES<T> ? _mm512_set1_epi32(st[2 * m + 1]) : _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const __m512i tk = s.t[k];
            __m512i* i = HALVES<T> && k >= 4 ? i1 : i0;
#pragma GCC unroll 8
            for (int m = 0; m < rows; ++m) i[m] = _mm512_dpbusd_epi32(i[m], tk, bcast4(x + 32 * m + 4 * k));
        }
#pragma GCC unroll 8
        for (int m = 0; m < rows; ++m)
            acc[m] = finish<T>(i0[m], i1[m], s.s0, s.s1, s.mn, d[m], ds[m], acc[m]);
    }
    for (int m = 0; m < rows; ++m) _mm512_mask_storeu_ps(out + m * ldo, keep, acc[m]);
}

using DecodeFn = void (*)(const Tile&, int64_t, const char*, int64_t, Sub*);
using GroupFn = void (*)(const Sub*, int64_t, const Pack&, int, float*, int64_t, __mmask16);

struct Kernels {
    DecodeFn decode;
    GroupFn full, part;        // a group of GEMM_ROWS rows; a shorter last group
};

template <int T>
Kernels kernels() { return {decode_tile<T>, run_group<T, GEMM_ROWS>, run_group<T, 0>}; }

Kernels kernels_of(int t) {
    switch (t) {
        case Q4_0: return kernels<Q4_0>(); case Q4_1: return kernels<Q4_1>();
        case Q5_0: return kernels<Q5_0>(); case Q5_1: return kernels<Q5_1>();
        case Q8_0: return kernels<Q8_0>(); case Q4_K: return kernels<Q4_K>();
        case Q5_K: return kernels<Q5_K>(); case Q6_K: return kernels<Q6_K>();
    }
    return {nullptr, nullptr, nullptr};
}

}  // namespace

int gemm_rows() { return GEMM_ROWS; }

bool gemm512(int qtype, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, int64_t K,
             const RowGroup* g, int64_t ng, float* out, int64_t ldo) {
    if (15 * rb >= (int64_t{1} << 31)) return false;   // gather offsets are int32
    const Kernels k = kernels_of(qtype);
    if (!k.decode) return false;
    const int64_t nb = K / block_elems(qtype), nsub = K / 32;
    thread_local std::vector<Sub> scratch;
    thread_local std::vector<uint8_t> spare;
    scratch.resize(nsub);
    spare.resize(16 * rb);
    Tile r{w, rb, _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32(static_cast<int32_t>(rb)))};
    for (int64_t t = n0; t < n1; t += 16) {
        r.p = w + t * rb;
        if (n1 - t < 16) {      // a last tile of fewer rows: zero-filled copy
            std::memcpy(spare.data(), r.p, (n1 - t) * rb);
            std::memset(spare.data() + (n1 - t) * rb, 0, (16 - (n1 - t)) * rb);
            r.p = spare.data();
        }
        k.decode(r, nb, reinterpret_cast<const char*>(w + (t + 16) * rb), 16 * rb / 64, scratch.data());
        const __mmask16 keep = static_cast<__mmask16>(n1 - t >= 16 ? 0xFFFF : (1u << (n1 - t)) - 1);
        for (int64_t i = 0; i < ng; ++i) {
            const GroupFn f = g[i].rows == GEMM_ROWS ? k.full : k.part;
            f(scratch.data(), nsub, g[i].a, g[i].rows, out + g[i].m0 * ldo + t, ldo, keep);
        }
    }
    return true;
}

}  // namespace mimo_q

#else

namespace mimo_q {
int gemm_rows() { return 0; }
bool gemm512(int, const uint8_t*, int64_t, int64_t, int64_t, int64_t, const RowGroup*, int64_t,
             float*, int64_t) {
    return false;
}
}  // namespace mimo_q

#endif
