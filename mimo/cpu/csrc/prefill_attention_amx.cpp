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

struct Scratch {
    std::vector<uint16_t> Q, P;   // [R, D] the tile's query rows; [R, KB] P in bf16
    std::vector<float> S, O, m, l;
    std::vector<int64_t> lo, hi;
};

// One tile: queries [i0, i1) of KV head g.
template <int64_t KB>
MIMO_BF16 void tile(const uint16_t* q, const uint16_t* kpack, const uint16_t* vpack,
                    const float* sinks, const Shape& s, int64_t g, int64_t i0, int64_t i1,
                    float scale, void* out, bool bf16, Scratch& w) {
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
    const __m512 vs = _mm512_set1_ps(scale * LOG2E);   // the softmax in base 2
    for (int64_t b = jlo / KB; b * KB < jhi; ++b) {
        const int64_t j0 = b * KB;
        const auto* kp = reinterpret_cast<const at::BFloat16*>(kpack + (g * s.nblk + b) * KB * s.D);
        const auto* vp = reinterpret_cast<const at::BFloat16*>(vpack + (g * s.nblk + b) * KB * s.Dv);
        cpublas::brgemm(R, KB, s.D, s.D, KB, KB, false, Qb, kp, w.S.data());
        // Every row sees the whole block: no masks (the interior of a window's band).
        const bool whole = lo_max <= j0 && j0 + KB <= hi_min;
        for (int64_t r = 0; r < R; ++r)
            softmax_row<KB / 16, true>(w.S.data() + r * KB, j0, w.lo[r], w.hi[r], whole, vs,
                                       w.m[r], w.l[r], w.O.data() + r * s.Dv, s.Dv,
                                       w.P.data() + r * KB);
        cpublas::brgemm(R, s.Dv, KB, KB, s.Dv, s.Dv, true, Pb, vp, w.O.data());
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t i = i0 + r / s.rep, h = g * s.rep + r % s.rep;
        store_row(w.O.data() + r * s.Dv, w.l[r] > 0.f ? 1.f / w.l[r] : 0.f, s.Dv, out, bf16,
                  i * s.Hq + h);
    }
}

template <int64_t KB>
torch::Tensor run(const torch::Tensor& q, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, const torch::Tensor& slots, int64_t offset,
                  int64_t window, double scale, const torch::Tensor& sinks,
                  const torch::Tensor& into) {
    const Shape s = span_shape(q, k_cache, v_cache, slots, offset, window, sinks, KB);
    torch::Tensor out = output_for(into, s, q);
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
    void* op = out.data_ptr();
    const bool bf16 = out.scalar_type() == torch::kBFloat16;
    at::parallel_for(0, s.Hkv * ntiles, 1, [&](int64_t a, int64_t e) {
        Scratch w;
        for (int64_t x = a; x < e; ++x) {
            const int64_t g = x / ntiles, t = x % ntiles;
            tile<KB>(qp, kp, vp, sk, s, g, t * tq, std::min(s.n, (t + 1) * tq),
                     static_cast<float>(scale), op, bf16, w);
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
                                    const torch::Tensor& sinks, const torch::Tensor& out) {
    TORCH_CHECK(prefill_attention_amx_ok(),
                "prefill_attention_amx needs AVX512-BF16 and oneDNN's bf16 brgemm (AMX)");
    return window > 0
        ? run<KB_WINDOW>(q, k_cache, v_cache, slots, offset, window, scale, sinks, out)
        : run<KB_FULL>(q, k_cache, v_cache, slots, offset, window, scale, sinks, out);
}

#else   // the AVX2 build: not available (callers keep the other paths)

bool prefill_attention_amx_ok() { return false; }

torch::Tensor prefill_attention_amx(const torch::Tensor&, const torch::Tensor&,
                                    const torch::Tensor&, const torch::Tensor&, int64_t,
                                    int64_t, double, const torch::Tensor&, const torch::Tensor&) {
    TORCH_CHECK(false, "prefill_attention_amx is in the avx512-vnni build only");
    return {};
}

#endif
