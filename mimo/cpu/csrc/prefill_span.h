// What the two prefill attention kernels share (prefill_attention.cpp: vdpbf16ps dot
// products; prefill_attention_amx.cpp: oneDNN's brgemm on AMX tiles): the span's shape and
// its argument checks, the output they write and how a row is stored, the keys a query
// sees, the packed keys and values (in blocks; the AMX kernel's in runs of columns), exp
// and 2^x of 16 floats, one row's step of the online softmax. avx512-vnni build only (the
// includer guards it with MIMO_ISA_VNNI).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#include "rows_io.h"

#define MIMO_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace mimo_prefill {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

struct Shape {
    int64_t n, Hq, Hkv, rep, D, Dv, L, nblk, offset, window;
};

// The checks both kernels make; `blk` keys per packed block (nblk counts them).
inline Shape span_shape(const torch::Tensor& q, const torch::Tensor& k_cache,
                        const torch::Tensor& v_cache, const torch::Tensor& slots,
                        int64_t offset, int64_t window, const torch::Tensor& sinks,
                        int64_t blk) {
    TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3,
                "q [n, Hq, D], caches [S, Hkv, D] and [S, Hkv, Dv]");
    for (const auto* t : {&q, &k_cache, &v_cache})
        TORCH_CHECK(t->scalar_type() == torch::kBFloat16 && t->is_contiguous(),
                    "q and the caches must be contiguous bfloat16");
    TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == torch::kInt64 && slots.is_contiguous(),
                "slots must be a contiguous int64 vector");
    Shape s{q.size(0), q.size(1), k_cache.size(1), 0, q.size(2), v_cache.size(2),
            slots.size(0), 0, offset, window};
    TORCH_CHECK(s.Hkv > 0 && s.Hq % s.Hkv == 0, "query heads must be a multiple of KV heads");
    TORCH_CHECK(k_cache.size(2) == s.D && v_cache.size(1) == s.Hkv, "cache shapes disagree with q");
    TORCH_CHECK(s.D % 2 == 0 && s.Dv % 64 == 0, "needs an even head dim and Dv % 64 == 0");
    TORCH_CHECK(offset >= 0 && offset + s.n <= s.L, "queries must lie within the keys");
    TORCH_CHECK(!sinks.defined() || sinks.numel() == 0 ||
                (sinks.numel() == s.Hq && sinks.scalar_type() == torch::kFloat32 &&
                 sinks.is_contiguous()), "sinks must be float32 [Hq] or empty");
    const int64_t* sl = slots.data_ptr<int64_t>();
    for (int64_t j = 0; j < s.L; ++j)
        TORCH_CHECK(sl[j] >= 0 && sl[j] < k_cache.size(0), "slot out of range: ", sl[j]);
    s.rep = s.Hq / s.Hkv;
    s.nblk = (s.L + blk - 1) / blk;
    return s;
}

// The output a kernel writes: the caller's `out` (float32 or bfloat16 [n, Hq, Dv],
// contiguous: rows of a step's output, written in place) or, if empty, a new float32 one.
inline torch::Tensor output_for(const torch::Tensor& out, const Shape& s, const torch::Tensor& q) {
    if (!out.defined() || out.numel() == 0)
        return torch::empty({s.n, s.Hq, s.Dv}, q.options().dtype(torch::kFloat32));
    TORCH_CHECK(out.dim() == 3 && out.size(0) == s.n && out.size(1) == s.Hq &&
                out.size(2) == s.Dv && out.is_contiguous() &&
                (out.scalar_type() == torch::kFloat32 || out.scalar_type() == torch::kBFloat16),
                "out must be contiguous float32 or bfloat16 [n, Hq, Dv] (or empty)");
    return out;
}

// Output row `row` (of n * Hq, Dv wide): o * inv, stored in float32 or rounded to bfloat16
// as torch rounds (mimo_rows::store16), so writing bf16 here equals .to(bfloat16) after.
MIMO_BF16 inline void store_row(const float* o, float inv, int64_t Dv, void* out, bool bf16,
                                int64_t row) {
    const __m512 v = _mm512_set1_ps(inv);
    for (int64_t d = 0; d < Dv; d += 16) {
        const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(o + d), v);
        if (bf16)
            mimo_rows::store16(static_cast<at::BFloat16*>(out) + row * Dv + d, x);
        else
            mimo_rows::store16(static_cast<float*>(out) + row * Dv + d, x);
    }
}

// Visible keys of query i: [lo, hi) (contiguous: causal, and a window's band).
inline void visible(const Shape& s, int64_t i, int64_t& lo, int64_t& hi) {
    hi = std::min(s.L, s.offset + i + 1);
    lo = s.window > 0 ? std::max<int64_t>(0, s.offset + i - s.window + 1) : 0;
}

// exp(x) for 16 floats: Cephes' expf (as vec_math.h's exp8), the power of two by scalef.
MIMO_BF16 inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                    5.0000001201e-1f})
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(c));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(y, fx);
}

// 2^x for 16 floats: x rounded to an integer plus a fraction in [-0.5, 0.5], 2^fraction by
// its Taylor series to the 6th power (relative error ~1e-7), the integer by scalef.
MIMO_BF16 inline __m512 exp2_16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
    const __m512 fx = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, fx);
    __m512 y = _mm512_set1_ps(1.5403530393e-4f);
    for (float c : {1.3333558146e-3f, 9.6181291076e-3f, 5.5504108665e-2f, 2.4022650696e-1f,
                    6.9314718056e-1f, 1.f})
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    return _mm512_scalef_ps(y, fx);
}

constexpr float LOG2E = 1.44269504088896341f;

// One row's step of the online softmax over a block of 16 * NV scores S (keys j0 ..): keys
// outside [lo, hi) masked (every one visible when `whole`), scores times `vs`; the row's
// running max m and sum l updated, its output row O [Dv] rescaled where m grew, and the
// block's weights written to P (16 * NV bf16). BASE2: m, `vs` and the weights in base 2
// (exp2_16), else in base e (exp16).
template <int64_t NV, bool BASE2>
MIMO_BF16 inline void softmax_row(const float* S, int64_t j0, int64_t lo, int64_t hi,
                                  bool whole, __m512 vs, float& m, float& l, float* O,
                                  int64_t Dv, uint16_t* P) {
    static_assert(NV % 2 == 0, "weights are stored two vectors at a time");
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 ninf = _mm512_set1_ps(NEG_INF);
    __mmask16 k[NV];
    __m512 v[NV];
    __m512 mx = ninf;
    for (int64_t c = 0; c < NV; ++c) {
        if (whole) {
            k[c] = 0xFFFF;
        } else {
            const __m512i j = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(j0 + 16 * c)));
            k[c] = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(lo))) &
                   _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(hi)));
        }
        v[c] = _mm512_mask_mul_ps(ninf, k[c], _mm512_loadu_ps(S + 16 * c), vs);
        mx = _mm512_max_ps(mx, v[c]);
    }
    const float mnew = std::max(m, _mm512_reduce_max_ps(mx));
    if (mnew == NEG_INF) {              // nothing seen yet, nothing in this block
        std::memset(P, 0, 16 * NV * sizeof(uint16_t));
        return;
    }
    const __m512 vm = _mm512_set1_ps(mnew);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < NV; c += 2) {
        const __m512 x0 = _mm512_sub_ps(v[c], vm), x1 = _mm512_sub_ps(v[c + 1], vm);
        const __m512 p0 = _mm512_maskz_mov_ps(k[c], BASE2 ? exp2_16(x0) : exp16(x0));
        const __m512 p1 = _mm512_maskz_mov_ps(k[c + 1], BASE2 ? exp2_16(x1) : exp16(x1));
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        _mm512_storeu_si512(P + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    const float alpha = m == NEG_INF ? 0.f : BASE2 ? std::exp2(m - mnew) : std::exp(m - mnew);
    l = l * alpha + _mm512_reduce_add_ps(sum);
    if (alpha != 1.f) {
        const __m512 va = _mm512_set1_ps(alpha);
        for (int64_t d = 0; d < Dv; d += 16)
            _mm512_storeu_ps(O + d, _mm512_mul_ps(_mm512_loadu_ps(O + d), va));
    }
    m = mnew;
}

// Value rows a and b (Dv bf16 each; null: zeros) interleaved, a[0] b[0] a[1] b[1] ..., into
// dst [Dv][2]: a key pair's row of the layout P V reads.
MIMO_BF16 inline void interleave_pair(const uint16_t* a, const uint16_t* b, int64_t Dv,
                                      uint16_t* dst) {
    // 16 values of a and 16 of b -> 32 bf16, interleaved.
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    for (int64_t d = 0; d < Dv; d += 16) {
        const __m256i va = a ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d))
                             : _mm256_setzero_si256();
        const __m256i vb = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d))
                             : _mm256_setzero_si256();
        const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
        _mm512_storeu_si512(dst + d * 2, _mm512_permutexvar_epi16(idx, ab));
    }
}

// Keys [j0, j0 + nj) of KV head g (nj even, at most MAXK) in the pair-interleaved ("VNNI")
// layouts both products read: Kp [D/2][ldk] key pairs along D (32 bits each; the run's
// keys in its first nj columns), Vp [nj/2][Dv][2] bf16 (value rows interleaved in pairs).
// Keys past L are zeros (and masked).
template <int64_t MAXK>
MIMO_BF16 inline void pack_keys(const uint16_t* kc, const uint16_t* vc, const int64_t* slots,
                                const Shape& s, int64_t g, int64_t j0, int64_t nj,
                                uint32_t* kp, int64_t ldk, uint16_t* vp) {
    const int64_t P = s.D / 2;
    const uint32_t* krow[MAXK];
    const uint16_t* vrow[MAXK];
    for (int64_t t = 0; t < nj; ++t) {
        const int64_t j = j0 + t;
        krow[t] = j < s.L ? reinterpret_cast<const uint32_t*>(kc + (slots[j] * s.Hkv + g) * s.D)
                          : nullptr;
        vrow[t] = j < s.L ? vc + (slots[j] * s.Hkv + g) * s.Dv : nullptr;
    }
    for (int64_t p = 0; p < P; ++p)
        for (int64_t t = 0; t < nj; ++t) kp[p * ldk + t] = krow[t] ? krow[t][p] : 0u;
    for (int64_t t = 0; t < nj / 2; ++t)
        interleave_pair(vrow[2 * t], vrow[2 * t + 1], s.Dv, vp + t * s.Dv * 2);
}

// Block b (TK keys) of KV head g: Kp [D/2][TK], Vp [TK/2][Dv][2] (pack_keys).
template <int64_t TK>
MIMO_BF16 void pack(const uint16_t* kc, const uint16_t* vc, const int64_t* slots,
                    const Shape& s, int64_t g, int64_t b, uint32_t* kp, uint16_t* vp) {
    pack_keys<TK>(kc, vc, slots, s, g, b * TK, TK, kp, TK, vp);
}

// Packs every block some query of the span sees (a window's first queries start past key
// 0), in parallel; kp/vp hold Hkv * nblk blocks.
template <int64_t TK>
inline void pack_span(const uint16_t* kc, const uint16_t* vc, const int64_t* slots,
                      const Shape& s, uint32_t* kp, uint16_t* vp) {
    int64_t lo0, unused;
    visible(s, 0, lo0, unused);
    const int64_t b0 = lo0 / TK, nb = s.nblk - b0;
    at::parallel_for(0, s.Hkv * nb, 4, [&](int64_t a, int64_t e) {
        for (int64_t x = a; x < e; ++x) {
            const int64_t g = x / nb, b = b0 + x % nb;
            pack<TK>(kc, vc, slots, s, g, b, kp + (g * s.nblk + b) * TK * (s.D / 2),
                     vp + (g * s.nblk + b) * TK * s.Dv);
        }
    });
}

// Key blocks of `blk` keys that the queries [i0, i1) of a span visit (a tile's cost).
inline int64_t tile_blocks(const Shape& s, int64_t i0, int64_t i1, int64_t blk) {
    int64_t lo, hi, unused;
    visible(s, i0, lo, unused);
    visible(s, i1 - 1, unused, hi);
    return (hi + blk - 1) / blk - lo / blk;
}

// body(x, state) for every x in [0, n) on the threads, the costliest first, each thread
// taking the next as it frees up; `State` is made once per thread, and done() runs on each
// thread after its last. A contiguous range per thread left a causal span's long tiles to
// one thread (a 256-token prompt's 8 tiles split 1-4 / 5-8: 10 against 26 blocks of work).
template <class State, class Cost, class Body, class Done>
void largest_first(int64_t n, Cost cost, Body body, Done done) {
    if (n <= 0) return;
    std::vector<int64_t> c(n), order(n);
    for (int64_t x = 0; x < n; ++x) {
        c[x] = cost(x);
        order[x] = x;
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n), 1, [&](int64_t, int64_t) {
        State w;
        for (int64_t y; (y = next.fetch_add(1, std::memory_order_relaxed)) < n;)
            body(order[y], w);
        done();
    });
}

}  // namespace mimo_prefill
