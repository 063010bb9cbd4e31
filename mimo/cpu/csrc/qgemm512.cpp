// The prefill GEMM on 512-bit VNNI tiles: x [M, K] @ W^T for M > 16 activation rows.
//
// The decode tiles (qtile512.cpp) decode and transpose a 16-row weight tile for every 16
// activation rows, so at prefill sizes that work is paid M / 16 times. Here a tile is
// decoded once per call (per chunk of activation rows, see qmatmul.cpp) into a thread-local
// scratch of K / 32 sub-blocks, each 8 transposed registers and its scales and mins (704
// bytes: 22 K bytes a tile, 45 KB at K = 2048), and every group of GEMM_ROWS activation
// rows then runs against it with its accumulators in registers. The per-row arithmetic is
// the decode tiles' own (row_dot), so each row's result equals theirs bit for bit.
//
// Weights repacked in 8-row tiles (qrepack.h; the VNNI build repacks its layer weights on a
// CPU without AMX, mimo/cpu/qmatrix.py) are decoded two tiles side by side into the same
// scratch: their registers are already transposed, so a 16-row register is two 8-row ones
// joined, and the same groups run against it. Integer sums are exact and the float steps
// are those of the 8-row tiles (qrepack256.cpp), so rows equal `qlinear`'s on them too.
#include "qdecode512.h"
#include "qrepack_regs.h"

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

inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// 8 fp16 at a (rows 0-7) and 8 at b (rows 8-15) as floats
inline __m512 halves16(const uint8_t* a, const uint8_t* b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(load16(a)), load16(b), 1));
}
// 8 bytes at a and 8 at b, unsigned or signed, as floats
inline __m128i bytes16(const uint8_t* a, const uint8_t* b) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
}
inline __m512 u8x16(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes16(a, b))); }
inline __m512 i8x16(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes16(a, b))); }

// The same for two 8-row tiles of repacked type X at r.p (rows 0-7) and r.p + 8 rb (8-15).
template <int X>
void decode_x8(const Tile& r, int64_t nb, const char* next, int64_t lines, Sub* out) {
    using L = x8::Layout<X>;
    const uint8_t* A = r.p;
    const uint8_t* B = r.p + 8 * r.rb;
    __m256i ta[8], tb[8];
    for (int64_t ib = 0; ib < nb; ++ib) {
        for (int64_t l = lines * ib / nb; l < lines * (ib + 1) / nb; ++l)
            _mm_prefetch(next + 64 * l, _MM_HINT_T0);
        const uint8_t* a = A + L::BLOCK * ib;
        const uint8_t* b = B + L::BLOCK * ib;
        if constexpr (X == Q5_0X8 || X == Q8_0X8) {
            Sub& o = out[ib];
            if constexpr (X == Q5_0X8) {
                x8::q5_0_regs(a, ta);
                x8::q5_0_regs(b, tb);
            }
            for (int k = 0; k < 8; ++k) {
                if constexpr (X == Q5_0X8) o.t[k] = join(ta[k], tb[k]);
                else o.t[k] = _mm512_xor_si512(join(x8::load32(a + L::QUANTS + 32 * k), x8::load32(b + L::QUANTS + 32 * k)),
                                               _mm512_set1_epi8(-128));     // q + 128
            }
            o.s0 = o.s1 = o.mn = halves16(a + L::SCALES, b + L::SCALES);
        } else if constexpr (X == Q4_KX8) {
            const __m512 d = halves16(a + L::D, b + L::D), dmin = halves16(a + L::DMIN, b + L::DMIN);
            for (int s = 0; s < 8; ++s) {
                Sub& o = out[8 * ib + s];
                x8::nibble_regs(a + L::NIBBLES, s, ta);
                x8::nibble_regs(b + L::NIBBLES, s, tb);
                for (int k = 0; k < 8; ++k) o.t[k] = join(ta[k], tb[k]);
                o.s0 = o.s1 = _mm512_mul_ps(d, u8x16(a + L::SC + 8 * s, b + L::SC + 8 * s));
                o.mn = _mm512_mul_ps(dmin, u8x16(a + L::MINS + 8 * s, b + L::MINS + 8 * s));
            }
        } else if constexpr (X == Q6_KX8) {
            const __m512 d = halves16(a + L::D, b + L::D);
            for (int s = 0; s < 8; ++s) {
                Sub& o = out[8 * ib + s];
                x8::q6_k_regs(a, s, ta);
                x8::q6_k_regs(b, s, tb);
                for (int k = 0; k < 8; ++k) o.t[k] = join(ta[k], tb[k]);
                o.s0 = _mm512_mul_ps(d, i8x16(a + L::SC + 16 * s, b + L::SC + 16 * s));
                o.s1 = _mm512_mul_ps(d, i8x16(a + L::SC + 16 * s + 8, b + L::SC + 16 * s + 8));
                o.mn = d;
            }
        }
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
template <int X>       // the 8-row tiles' decoding, then the GGUF type's arithmetic
Kernels kernels_x8() { return {decode_x8<X>, run_group<ggml_type(X), GEMM_ROWS>, run_group<ggml_type(X), 0>}; }

Kernels kernels_of(int t) {
    switch (t) {
        case Q4_0: return kernels<Q4_0>(); case Q4_1: return kernels<Q4_1>();
        case Q5_0: return kernels<Q5_0>(); case Q5_1: return kernels<Q5_1>();
        case Q8_0: return kernels<Q8_0>(); case Q4_K: return kernels<Q4_K>();
        case Q5_K: return kernels<Q5_K>(); case Q6_K: return kernels<Q6_K>();
        case Q5_0X8: return kernels_x8<Q5_0X8>(); case Q8_0X8: return kernels_x8<Q8_0X8>();
        case Q4_KX8: return kernels_x8<Q4_KX8>(); case Q6_KX8: return kernels_x8<Q6_KX8>();
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
