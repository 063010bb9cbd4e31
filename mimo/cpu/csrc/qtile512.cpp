// 512-bit VNNI tiles: 16 weight rows at a time, one int32 lane per weight row.
//
// For each 32-element sub-block, the 16 rows are decoded (two rows to a register) into
// unsigned bytes q + OFF and transposed so that register k holds bytes 4k..4k+3 of every
// row; then each activation row costs 8 vpdpbusd against its own bytes 4k..4k+3 broadcast,
// one conversion and two float ops, whatever the weight type. Decoding and the transpose are
// paid once per weight block and shared by up to 16 activation rows held in the loop, so a
// batch of 16 costs far less than 16 single rows (llama.cpp's repacked / tinyBLAS tiles,
// here without a repacked copy of the weights).
//
// The unsigned weights give sum((q + OFF) x) = sum(q x) + OFF sum(x); the dot's accumulator
// starts at -OFF sum(x), which the activations carry per half-block (isum16). Types with a
// min (value = scale q - min) subtract min * d_x sum(x) in float, as the 256-bit path does.
//
// On a CPU with AMX-INT8 (amx_tiles.h), chunks of 16 activation rows take each sub-block's
// dots on the tile unit instead: one tile product of the activations (signed) with the
// transposed weights (made signed: q + OFF - OFF), whose integers equal the vpdpbusd sums
// with their starting values, then the same `finish`, so the results are bit for bit the
// VNNI tiles'.
#include "qdecode512.h"

#ifdef MIMO_ISA_VNNI
#include <algorithm>
#include <vector>

#include "amx_tiles.h"

namespace mimo_q {
namespace {

using namespace tile512;

// One 32-element sub-block j of the 16 rows (decoded in z) against activation rows [0, M):
// s0 and s1 are the rows' scales for elements 0-15 and 16-31, mn their mins.
template <int T, int NM>
inline void consume(const __m512i z[8], __m512 s0, __m512 s1, __m512 mn, int64_t j,
                    const Pack& a, int M, __m512* acc) {
    __m512i t[8];
    transpose(z, t);
    const int rows = NM ? NM : M;
    const int8_t* x = a.x + 32 * j * rows;
    const int32_t* st = a.start + 2 * j * rows;
    const float* d = a.d + j * rows;
    const float* ds = a.dsum + j * rows;
#pragma GCC unroll 16
    for (int m = 0; m < rows; ++m)
        acc[m] = row_dot<T>(t, s0, s1, mn, x + 32 * m, st + 2 * m, d[m], ds[m], acc[m]);
}

// The same on the tile unit (amx_tiles.h's configuration): the integer dots of sub-block j
// for every row in one tile product (two for HALVES types, whose halves have scales of
// their own), stored to scratch, then each row's `finish`. (Issuing the products a chunk of
// sub-blocks ahead of the rows' finishing measured no faster.)
template <int T, int NM>
inline void consume_amx(const __m512i z[8], __m512 s0, __m512 s1, __m512 mn, int64_t j,
                        const Pack& a, int M, __m512* acc, amx::Scratch& w) {
    __m512i q[8], t[8];
    for (int i = 0; i < 8; ++i) q[i] = _mm512_sub_epi8(z[i], _mm512_set1_epi8(static_cast<char>(OFF<T>)));
    transpose(q, t);
    for (int k = 0; k < 8; ++k) _mm512_store_si512(w.b + 64 * k, t[k]);
    const int rows = NM ? NM : M;
    const int8_t* x = a.x + 32 * j * rows;
    if constexpr (HALVES<T>) {
        _tile_loadd(0, x, 32);
        _tile_loadd(1, x + 16, 32);
        _tile_loadd(2, w.b, 64);
        _tile_loadd(3, w.b + 256, 64);
        _tile_zero(4);
        _tile_zero(5);
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(5, 1, 3);
        _tile_stored(4, w.c, 64);
        _tile_stored(5, w.c + 256, 64);
    } else {
        _tile_loadd(0, x, 32);
        _tile_loadd(2, w.b, 64);
        _tile_zero(4);
        _tile_dpbssd(4, 0, 2);
        _tile_stored(4, w.c, 64);
    }
    const float* d = a.d + j * rows;
    const float* ds = a.dsum + j * rows;
#pragma GCC unroll 16
    for (int m = 0; m < rows; ++m) {
        const __m512i i0 = _mm512_load_si512(w.c + 16 * m);
        const __m512i i1 = HALVES<T> ? _mm512_load_si512(w.c + 256 + 16 * m) : _mm512_setzero_si512();
        acc[m] = finish<T>(i0, i1, s0, s1, mn, d[m], ds[m], acc[m]);
    }
}

// Block ib of the 16 rows, all of its sub-blocks.
template <int T, int NM, bool AMX>
inline void block(const Tile& r, int64_t ib, const Pack& a, int M, __m512* acc, amx::Scratch& w) {
    decode_block<T>(r, ib, [&](const __m512i z[8], __m512 s0, __m512 s1, __m512 mn, int64_t j) {
        if constexpr (AMX) consume_amx<T, NM>(z, s0, s1, mn, j, a, M, acc, w);
        else consume<T, NM>(z, s0, s1, mn, j, a, M, acc);
    });
}

// Rows [n0, n1) of W against activation rows [0, M), M <= 16, tile by tile. The rows of a
// tile are read side by side, which the hardware prefetcher does not follow: each block
// step asks for its share of the next tile's bytes into L1 and of the one after into L2, in
// order, and a thread's first tile is asked for whole (a decode step's layer weights come
// cold from memory: with one tile ahead only, MLP down took 75 us a layer, 50 with these).
// Prefetches past the weights' end are harmless. A last tile of fewer rows is copied,
// zero-filled, to `spare` (16 * rb bytes).
template <int T, int NM, bool AMX>
void tiles(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const Pack& a, int M, float* out,
           int64_t ldo, int64_t nb, uint8_t* spare) {
    amx::Scratch scratch;
    if constexpr (AMX) amx::configure(M, HALVES<T>);
    Tile r{w, rb, _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32(static_cast<int32_t>(rb)))};
    const int64_t lines = 16 * rb / 64;
    for (int64_t t = n0; t < n1; t += 16) {
        r.p = w + t * rb;
        if (n1 - t < 16) {
            std::memcpy(spare, r.p, (n1 - t) * rb);
            std::memset(spare + (n1 - t) * rb, 0, (16 - (n1 - t)) * rb);
            r.p = spare;
        }
        __m512 acc[NM ? NM : 16];
        for (int m = 0; m < (NM ? NM : M); ++m) acc[m] = _mm512_setzero_ps();
        const char* next = reinterpret_cast<const char*>(w + (t + 16) * rb);
        const char* next2 = reinterpret_cast<const char*>(w + (t + 32) * rb);
        if (t == n0)
            for (int64_t l = 0; l < lines; ++l) {
                _mm_prefetch(reinterpret_cast<const char*>(r.p) + 64 * l, _MM_HINT_T0);
                _mm_prefetch(next + 64 * l, _MM_HINT_T1);
            }
        for (int64_t ib = 0; ib < nb; ++ib) {
            for (int64_t l = lines * ib / nb; l < lines * (ib + 1) / nb; ++l) {
                _mm_prefetch(next + 64 * l, _MM_HINT_T0);
                _mm_prefetch(next2 + 64 * l, _MM_HINT_T1);
            }
            block<T, NM, AMX>(r, ib, a, M, acc, scratch);
        }
        const __mmask16 keep = static_cast<__mmask16>(n1 - t >= 16 ? 0xFFFF : (1u << (n1 - t)) - 1);
        for (int m = 0; m < (NM ? NM : M); ++m) _mm512_mask_storeu_ps(out + m * ldo + t, keep, acc[m]);
    }
}

using TileFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const Pack&, int, float*, int64_t,
                       int64_t, uint8_t*);

// Row counts of a decode batch get their own loops (accumulators in registers); others run
// the loop bounded at run time.
template <int T, bool AMX>
TileFn pick(int M) {
    static_assert(amx::ROWS == 16, "the tile unit takes chunks of 16 rows only");
    if constexpr (AMX) return M == 16 ? tiles<T, 16, true> : nullptr;
    switch (M) {
        case 1: return tiles<T, 1, AMX>; case 2: return tiles<T, 2, AMX>; case 4: return tiles<T, 4, AMX>;
        case 8: return tiles<T, 8, AMX>; case 16: return tiles<T, 16, AMX>;
    }
    return tiles<T, 0, AMX>;
}

template <bool AMX>
TileFn tile_fn(int t, int M) {
    switch (t) {
        case Q4_0: return pick<Q4_0, AMX>(M); case Q4_1: return pick<Q4_1, AMX>(M);
        case Q5_0: return pick<Q5_0, AMX>(M); case Q5_1: return pick<Q5_1, AMX>(M);
        case Q8_0: return pick<Q8_0, AMX>(M); case Q4_K: return pick<Q4_K, AMX>(M);
        case Q5_K: return pick<Q5_K, AMX>(M); case Q6_K: return pick<Q6_K, AMX>(M);
    }
    return nullptr;             // unreachable: qmatmul.cpp checks the type first
}

}  // namespace

bool tiles512(int qtype, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a,
              int64_t M, float* out, int64_t ldo) {
    if (15 * rb >= (int64_t{1} << 31)) return false;   // gather offsets are int32
    if (n1 <= n0) return true;
    thread_local Packed packed;
    thread_local std::vector<uint8_t> spare;
    spare.resize(16 * rb);
    for (int64_t m0 = 0; m0 < M; m0 += 16) {         // activation rows 16 at a time
        const int mt = static_cast<int>(std::min<int64_t>(16, M - m0));
        const bool on_amx = mt == amx::ROWS && amx::on();
        const TileFn f = on_amx ? tile_fn<true>(qtype, mt) : tile_fn<false>(qtype, mt);
        if (!f) return false;
        pack(a + m0, mt, offset(qtype), qtype == Q6_K, packed);
        f(w, rb, n0, n1, packed.view(), mt, out + m0 * ldo, ldo, a[0].K / block_elems(qtype), spare.data());
        if (on_amx) amx::release();
    }
    return true;
}

}  // namespace mimo_q

#else

namespace mimo_q {
bool tiles512(int, const uint8_t*, int64_t, int64_t, int64_t, const QAct*, int64_t, float*, int64_t) {
    return false;
}
}  // namespace mimo_q

#endif
