// What the two prefill attention kernels share (prefill_attention.cpp: vdpbf16ps dot
// products; prefill_attention_amx.cpp: oneDNN's brgemm on AMX tiles): the span's shape and
// its argument checks, the keys a query sees, the packed key and value blocks, exp of 16
// floats. avx512-vnni build only (the includer guards it with MIMO_ISA_VNNI).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <limits>

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

// Block b (TK keys) of KV head g in the pair-interleaved ("VNNI") layouts both products
// read: Kp [D/2][TK] key pairs along D (32 bits each), Vp [TK/2][Dv][2] bf16 (value rows
// interleaved in pairs). Keys past L are zeros (and masked).
template <int64_t TK>
MIMO_BF16 void pack(const uint16_t* kc, const uint16_t* vc, const int64_t* slots,
                    const Shape& s, int64_t g, int64_t b, uint32_t* kp, uint16_t* vp) {
    const int64_t P = s.D / 2;
    const uint32_t* krow[TK];
    const uint16_t* vrow[TK];
    for (int64_t t = 0; t < TK; ++t) {
        const int64_t j = b * TK + t;
        krow[t] = j < s.L ? reinterpret_cast<const uint32_t*>(kc + (slots[j] * s.Hkv + g) * s.D)
                          : nullptr;
        vrow[t] = j < s.L ? vc + (slots[j] * s.Hkv + g) * s.Dv : nullptr;
    }
    for (int64_t p = 0; p < P; ++p)
        for (int64_t t = 0; t < TK; ++t) kp[p * TK + t] = krow[t] ? krow[t][p] : 0u;
    // 16 values of row 2t and 16 of row 2t+1 -> 32 bf16, interleaved.
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    for (int64_t t = 0; t < TK / 2; ++t) {
        const uint16_t* a = vrow[2 * t];
        const uint16_t* c = vrow[2 * t + 1];
        for (int64_t d = 0; d < s.Dv; d += 16) {
            const __m256i va = a ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d))
                                 : _mm256_setzero_si256();
            const __m256i vb = c ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + d))
                                 : _mm256_setzero_si256();
            const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
            _mm512_storeu_si512(vp + (t * s.Dv + d) * 2, _mm512_permutexvar_epi16(idx, ab));
        }
    }
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

}  // namespace mimo_prefill
