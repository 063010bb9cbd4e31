// Prefill attention over paged KV on AMX tiles: the same contract as prefill_attention.cpp
// (causal, an optional sliding window, GQA, sinks, no mask tensor; float32 out), with both
// products on oneDNN's brgemm micro-kernel (torch's `cpublas::brgemm`, the one its own CPU
// flash kernel calls), which runs bf16 tiles on AMX.
//
// Why not torch's flash kernel: it takes an explicit mask for a window's band or a chunk
// that starts mid-sequence, computes every masked block, and handles one head per row
// block. Here a tile's rows are all the heads sharing one KV head at TILE_ROWS / rep
// positions (GQA: every row of the tile reads the same keys, so the tile is 4x taller at
// Gemma 3's 4:1), a tile visits only the key blocks its rows see, and only blocks that some
// row sees in part (the band's two edges) are masked. P is rounded to bf16 for P V, as both
// other kernels round it.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

#if defined(MIMO_ISA_VNNI)
#include "prefill_span.h"

namespace {

using namespace mimo_prefill;
namespace cpublas = at::native::cpublas;

// Keys per block (the N of S = Q K^T, the K of P V): 128 under a window (a tile's band
// spans few blocks, and the edge blocks' masked part is waste), 256 without (longer
// products, fewer rescales of O); measured in docs/cpu_kernels.md.
constexpr int64_t KB_WINDOW = 128, KB_FULL = 256;
constexpr int64_t TILE_ROWS = 128;  // rows of a tile (positions x heads per KV head), at most

// 2^x for 16 floats: x rounded to an integer plus a fraction in [-0.5, 0.5], 2^fraction by
// its Taylor series to the 6th power (relative error ~1e-7), the integer by scalef. The
// softmax runs in base 2 (scores times scale * log2 e): a shorter exp than exp16's.
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

struct Scratch {
    std::vector<uint16_t> Q, P;   // [R, D] the tile's query rows; [R, KB] P in bf16
    std::vector<float> S, O, m, l;
    std::vector<int64_t> lo, hi;
};

// One tile: queries [i0, i1) of KV head g.
template <int64_t KB>
MIMO_BF16 void tile(const uint16_t* q, const uint16_t* kpack, const uint16_t* vpack,
                    const float* sinks, const Shape& s, int64_t g, int64_t i0, int64_t i1,
                    float scale, float* out, Scratch& w) {
    const int64_t R = (i1 - i0) * s.rep;
    w.Q.resize(R * s.D);
    w.P.resize(R * KB);
    w.S.resize(R * KB);
    w.O.assign(R * s.Dv, 0.f);
    w.m.resize(R);
    w.l.resize(R);
    w.lo.resize(R);
    w.hi.resize(R);
    int64_t lo_max = 0, hi_min = s.L;
    for (int64_t r = 0; r < R; ++r) {
        const int64_t i = i0 + r / s.rep, h = g * s.rep + r % s.rep;
        std::memcpy(w.Q.data() + r * s.D, q + (i * s.Hq + h) * s.D, s.D * sizeof(uint16_t));
        visible(s, i, w.lo[r], w.hi[r]);
        lo_max = std::max(lo_max, w.lo[r]);
        hi_min = std::min(hi_min, w.hi[r]);
        w.m[r] = sinks ? sinks[h] * LOG2E : NEG_INF;   // a sink: one more logit, no value
        w.l[r] = sinks ? 1.f : 0.f;
    }
    const auto* Qb = reinterpret_cast<const at::BFloat16*>(w.Q.data());
    const auto* Pb = reinterpret_cast<const at::BFloat16*>(w.P.data());
    const int64_t jlo = w.lo[0], jhi = w.hi[R - 1];
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 vs = _mm512_set1_ps(scale * LOG2E), ninf = _mm512_set1_ps(NEG_INF);
    for (int64_t b = jlo / KB; b * KB < jhi; ++b) {
        const int64_t j0 = b * KB;
        const auto* kp = reinterpret_cast<const at::BFloat16*>(kpack + (g * s.nblk + b) * KB * s.D);
        const auto* vp = reinterpret_cast<const at::BFloat16*>(vpack + (g * s.nblk + b) * KB * s.Dv);
        cpublas::brgemm(R, KB, s.D, s.D, KB, KB, false, Qb, kp, w.S.data());
        // Every row sees the whole block: no masks (the interior of a window's band).
        const bool whole = lo_max <= j0 && j0 + KB <= hi_min;
        for (int64_t r = 0; r < R; ++r) {
            float* S = w.S.data() + r * KB;
            __mmask16 k[KB / 16];
            __m512 v[KB / 16];
            __m512 mx = ninf;
            for (int64_t c = 0; c < KB / 16; ++c) {
                if (whole) {
                    k[c] = 0xFFFF;
                } else {
                    const __m512i j = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(j0 + 16 * c)));
                    k[c] = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(w.lo[r]))) &
                           _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(w.hi[r])));
                }
                v[c] = _mm512_mask_mul_ps(ninf, k[c], _mm512_loadu_ps(S + 16 * c), vs);
                mx = _mm512_max_ps(mx, v[c]);
            }
            uint16_t* pr = w.P.data() + r * KB;
            const float mnew = std::max(w.m[r], _mm512_reduce_max_ps(mx));
            if (mnew == NEG_INF) {              // nothing seen yet, nothing in this block
                std::memset(pr, 0, KB * sizeof(uint16_t));
                continue;
            }
            const __m512 vm = _mm512_set1_ps(mnew);
            __m512 sum = _mm512_setzero_ps();
            for (int64_t c = 0; c < KB / 16; c += 2) {
                const __m512 p0 = _mm512_maskz_mov_ps(k[c], exp2_16(_mm512_sub_ps(v[c], vm)));
                const __m512 p1 = _mm512_maskz_mov_ps(k[c + 1], exp2_16(_mm512_sub_ps(v[c + 1], vm)));
                sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
                _mm512_storeu_si512(pr + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
            }
            const float alpha = w.m[r] == NEG_INF ? 0.f : std::exp2(w.m[r] - mnew);
            w.l[r] = w.l[r] * alpha + _mm512_reduce_add_ps(sum);
            if (alpha != 1.f) {
                float* o = w.O.data() + r * s.Dv;
                const __m512 va = _mm512_set1_ps(alpha);
                for (int64_t d = 0; d < s.Dv; d += 16)
                    _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), va));
            }
            w.m[r] = mnew;
        }
        cpublas::brgemm(R, s.Dv, KB, KB, s.Dv, s.Dv, true, Pb, vp, w.O.data());
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t i = i0 + r / s.rep, h = g * s.rep + r % s.rep;
        const __m512 inv = _mm512_set1_ps(w.l[r] > 0.f ? 1.f / w.l[r] : 0.f);
        const float* o = w.O.data() + r * s.Dv;
        float* dst = out + (i * s.Hq + h) * s.Dv;
        for (int64_t d = 0; d < s.Dv; d += 16)
            _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), inv));
    }
}

template <int64_t KB>
torch::Tensor run(const torch::Tensor& q, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, const torch::Tensor& slots, int64_t offset,
                  int64_t window, double scale, const torch::Tensor& sinks) {
    const Shape s = span_shape(q, k_cache, v_cache, slots, offset, window, sinks, KB);
    auto out = torch::empty({s.n, s.Hq, s.Dv}, q.options().dtype(torch::kFloat32));
    if (s.n == 0) return out;
    auto kpack = torch::empty({s.Hkv * s.nblk * KB * s.D}, q.options());
    auto vpack = torch::empty({s.Hkv * s.nblk * KB * s.Dv}, q.options());
    auto* kp = reinterpret_cast<uint16_t*>(kpack.data_ptr<at::BFloat16>());
    auto* vp = reinterpret_cast<uint16_t*>(vpack.data_ptr<at::BFloat16>());
    pack_span<KB>(reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
                  reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()),
                  slots.data_ptr<int64_t>(), s, reinterpret_cast<uint32_t*>(kp), vp);
    const int64_t tq = std::max<int64_t>(1, TILE_ROWS / s.rep);
    const int64_t ntiles = (s.n + tq - 1) / tq;
    const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
    const float* sk = sinks.defined() && sinks.numel() ? sinks.data_ptr<float>() : nullptr;
    float* op = out.data_ptr<float>();
    at::parallel_for(0, s.Hkv * ntiles, 1, [&](int64_t a, int64_t e) {
        Scratch w;
        for (int64_t x = a; x < e; ++x) {
            const int64_t g = x / ntiles, t = x % ntiles;
            tile<KB>(qp, kp, vp, sk, s, g, t * tq, std::min(s.n, (t + 1) * tq),
                     static_cast<float>(scale), op, w);
        }
        cpublas::brgemm_release();     // the AMX tile state, back before oneDNN's next call
    });
    return out;
}

}  // namespace

bool prefill_attention_amx_ok() {
    return __builtin_cpu_supports("avx512bf16") && cpublas::could_pack(at::kBFloat16);
}

torch::Tensor prefill_attention_amx(const torch::Tensor& q, const torch::Tensor& k_cache,
                                    const torch::Tensor& v_cache, const torch::Tensor& slots,
                                    int64_t offset, int64_t window, double scale,
                                    const torch::Tensor& sinks) {
    TORCH_CHECK(prefill_attention_amx_ok(),
                "prefill_attention_amx needs AVX512-BF16 and oneDNN's bf16 brgemm (AMX)");
    return window > 0 ? run<KB_WINDOW>(q, k_cache, v_cache, slots, offset, window, scale, sinks)
                      : run<KB_FULL>(q, k_cache, v_cache, slots, offset, window, scale, sinks);
}

#else   // the AVX2 build: not available (callers keep the other paths)

bool prefill_attention_amx_ok() { return false; }

torch::Tensor prefill_attention_amx(const torch::Tensor&, const torch::Tensor&,
                                    const torch::Tensor&, const torch::Tensor&, int64_t,
                                    int64_t, double, const torch::Tensor&) {
    TORCH_CHECK(false, "prefill_attention_amx is in the avx512-vnni build only");
    return {};
}

#endif
