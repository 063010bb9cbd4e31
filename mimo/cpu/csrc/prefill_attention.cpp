// Prefill attention over paged KV with bfloat16 dot products (AVX512-BF16): a chunk of
// queries against the keys its sequence reads, causal, optionally in a sliding window,
// GQA and attention sinks, no mask tensor. torch's CPU flash kernel computes in float32
// (about 150 GFLOP/s on two cores here); `vdpbf16ps` doubles the rate of both products.
//
// Two passes: the span's keys and values are packed once per KV head into the layouts
// `vdpbf16ps` wants (key pairs along D interleaved per key block; value rows interleaved
// in pairs), then tiles of queries (all heads of one KV head) run a flash loop over the
// key blocks they see: S = Q K^T in float32, online softmax in float32, P rounded to
// bfloat16 for P V. Only the avx512-vnni build has it; callers ask `prefill_attention_ok`.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"

#if defined(MIMO_ISA_VNNI)
#include "prefill_span.h"

namespace {

using namespace mimo_prefill;

constexpr int64_t TK = 32;         // keys per block: two vectors of 16 scores per row
constexpr int64_t ROWS_QK = 8;     // rows per S micro-kernel
constexpr int64_t ROWS_PV = 4;     // rows per P V micro-kernel (x 4 vectors of 16 values)

// S[r][0..TK) = q_r . k_j over the block's packed keys, for rows r0 .. r0 + ROWS_QK.
MIMO_BF16 inline void scores(const uint32_t* const* q, const uint32_t* kp, int64_t P,
                             float* S) {
    __m512 acc[ROWS_QK][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < P; ++p) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kp + p * TK);
        const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kp + p * TK + 16);
        for (int64_t r = 0; r < ROWS_QK; ++r) {
            const __m512bh qb = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r][p]));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qb, k0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qb, k1);
        }
    }
    for (int64_t r = 0; r < ROWS_QK; ++r) {
        _mm512_storeu_ps(S + r * TK, acc[r][0]);
        _mm512_storeu_ps(S + r * TK + 16, acc[r][1]);
    }
}

// O[r] += P[r] V over the block, rows r0 .. r0 + ROWS_PV (P as bf16 pairs of keys).
MIMO_BF16 inline void values(const uint32_t* Pp, const uint16_t* vp, int64_t Dv, float* O) {
    for (int64_t d = 0; d < Dv; d += 64) {
        __m512 acc[ROWS_PV][4];
        for (int64_t r = 0; r < ROWS_PV; ++r)
            for (int64_t c = 0; c < 4; ++c) acc[r][c] = _mm512_loadu_ps(O + r * Dv + d + 16 * c);
        for (int64_t t = 0; t < TK / 2; ++t) {
            __m512bh v[4];
            for (int64_t c = 0; c < 4; ++c)
                v[c] = (__m512bh)_mm512_loadu_si512(vp + (t * Dv + d + 16 * c) * 2);
            for (int64_t r = 0; r < ROWS_PV; ++r) {
                const __m512bh pb = (__m512bh)_mm512_set1_epi32(
                    static_cast<int>(Pp[r * (TK / 2) + t]));
                for (int64_t c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, v[c]);
            }
        }
        for (int64_t r = 0; r < ROWS_PV; ++r)
            for (int64_t c = 0; c < 4; ++c) _mm512_storeu_ps(O + r * Dv + d + 16 * c, acc[r][c]);
    }
}

// One tile: queries [i0, i1) of KV head g, R = (i1 - i0) * rep rows.
MIMO_BF16 void tile(const uint16_t* q, const uint32_t* kpack, const uint16_t* vpack,
                    const float* sinks, const Shape& s, int64_t g, int64_t i0, int64_t i1,
                    float scale, void* out, bool bf16) {
    const int64_t R = (i1 - i0) * s.rep, P = s.D / 2;
    const int64_t Rq = (R + ROWS_QK - 1) / ROWS_QK * ROWS_QK;
    const int64_t Rv = (R + ROWS_PV - 1) / ROWS_PV * ROWS_PV;
    std::vector<const uint32_t*> qrow(Rq);
    std::vector<float> S(Rq * TK), O(Rv * s.Dv, 0.f), m(R), l(R);
    std::vector<uint32_t> Pp(Rv * (TK / 2), 0u);
    std::vector<int64_t> lo(R), hi(R);
    for (int64_t r = 0; r < Rq; ++r) {
        const int64_t rr = r < R ? r : 0;         // padding rows repeat row 0, unused
        const int64_t i = i0 + rr / s.rep, h = g * s.rep + rr % s.rep;
        qrow[r] = reinterpret_cast<const uint32_t*>(q + (i * s.Hq + h) * s.D);
        if (r < R) {
            visible(s, i, lo[r], hi[r]);
            m[r] = sinks ? sinks[h] : NEG_INF;     // a sink: one more logit with no value
            l[r] = sinks ? 1.f : 0.f;
        }
    }
    int64_t jlo, jhi, unused;
    visible(s, i0, jlo, unused);
    visible(s, i1 - 1, unused, jhi);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t b = jlo / TK; b * TK < jhi; ++b) {
        const uint32_t* kp = kpack + (g * s.nblk + b) * TK * P;
        for (int64_t r = 0; r < Rq; r += ROWS_QK) scores(qrow.data() + r, kp, P, S.data() + r * TK);
        for (int64_t r = 0; r < R; ++r)
            softmax_row<TK / 16, false>(S.data() + r * TK, b * TK, lo[r], hi[r], false, vs,
                                        m[r], l[r], O.data() + r * s.Dv, s.Dv,
                                        reinterpret_cast<uint16_t*>(Pp.data() + r * (TK / 2)));
        const uint16_t* vp = vpack + (g * s.nblk + b) * TK * s.Dv;
        for (int64_t r = 0; r < Rv; r += ROWS_PV)
            values(Pp.data() + r * (TK / 2), vp, s.Dv, O.data() + r * s.Dv);
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t i = i0 + r / s.rep, h = g * s.rep + r % s.rep;
        store_row(O.data() + r * s.Dv, l[r] > 0.f ? 1.f / l[r] : 0.f, s.Dv, out, bf16,
                  i * s.Hq + h);
    }
}

}  // namespace

bool prefill_attention_ok() { return __builtin_cpu_supports("avx512bf16"); }

torch::Tensor prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                const torch::Tensor& v_cache, const torch::Tensor& slots,
                                int64_t offset, int64_t window, double scale,
                                const torch::Tensor& sinks, const torch::Tensor& into) {
    TORCH_CHECK(prefill_attention_ok(), "prefill_attention needs a CPU with AVX512-BF16");
    const Shape s = span_shape(q, k_cache, v_cache, slots, offset, window, sinks, TK);
    const int64_t* sl = slots.data_ptr<int64_t>();
    torch::Tensor out = output_for(into, s, q);
    if (s.n == 0) return out;
    auto kpack = torch::empty({s.Hkv * s.nblk * TK * s.D}, q.options());
    auto vpack = torch::empty({s.Hkv * s.nblk * TK * s.Dv}, q.options());
    const auto* kc = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>());
    const auto* vc = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>());
    auto* kp = reinterpret_cast<uint32_t*>(kpack.data_ptr<at::BFloat16>());
    auto* vp = reinterpret_cast<uint16_t*>(vpack.data_ptr<at::BFloat16>());
    pack_span<TK>(kc, vc, sl, s, kp, vp);
    const int64_t tq = std::max<int64_t>(1, 64 / s.rep);
    const int64_t ntiles = (s.n + tq - 1) / tq;
    const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
    const float* sk = sinks.defined() && sinks.numel() ? sinks.data_ptr<float>() : nullptr;
    void* op = out.data_ptr();
    const bool bf16 = out.scalar_type() == torch::kBFloat16;
    struct NoState {};
    largest_first<NoState>(
        s.Hkv * ntiles,
        [&](int64_t x) {
            const int64_t t = x % ntiles;
            return tile_blocks(s, t * tq, std::min(s.n, (t + 1) * tq), TK);
        },
        [&](int64_t x, NoState&) {
            const int64_t g = x / ntiles, t = x % ntiles;
            tile(qp, kp, vp, sk, s, g, t * tq, std::min(s.n, (t + 1) * tq),
                 static_cast<float>(scale), op, bf16);
        },
        [] {});
    return out;
}

#else   // the AVX2 build: not available (callers keep torch's kernel)

bool prefill_attention_ok() { return false; }

torch::Tensor prefill_attention(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                const torch::Tensor&, int64_t, int64_t, double,
                                const torch::Tensor&, const torch::Tensor&) {
    TORCH_CHECK(false, "prefill_attention is in the avx512-vnni build only");
    return {};
}

#endif
