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
#include <array>
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

// One tile: queries [i0, i1) of KV head g; the span's queries are rows row0 + i of q and out.
template <int64_t KB>
MIMO_BF16 void tile(const uint16_t* q, const uint16_t* kpack, const uint16_t* vpack,
                    const float* sinks, const Shape& s, int64_t row0, int64_t g, int64_t i0,
                    int64_t i1, float scale, void* out, bool bf16, Scratch& w) {
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
        std::memcpy(w.Q.data() + r * s.D, q + ((row0 + i) * s.Hq + h) * s.D,
                    s.D * sizeof(uint16_t));
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
                  (row0 + i) * s.Hq + h);
    }
}

// One span of a step: its shape, its first row in q and out, its slots, and where its
// packed blocks start (in blocks of the step's pack).
struct Span {
    Shape s;
    int64_t row0;
    const int64_t* slots;
    int64_t block0;
};

// Every span of a step (the spans of one layer share window, scale and sinks): one parallel
// region packs all their blocks and one computes all their tiles, so a step of several
// prompts pays one fork and join per layer, not two per prompt, and its threads share the
// prompts' tiles instead of splitting each prompt's few.
template <int64_t KB>
void run_spans(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
               std::vector<Span>& spans, double scale, const torch::Tensor& sinks,
               torch::Tensor& out) {
    int64_t blocks = 0;
    std::vector<std::array<int64_t, 3>> packs;    // (span, g, block)
    std::vector<std::array<int64_t, 4>> tiles;    // (span, g, first query, end query)
    for (int64_t x = 0; x < static_cast<int64_t>(spans.size()); ++x) {
        Span& sp = spans[x];
        const Shape& s = sp.s;
        sp.block0 = blocks;
        blocks += s.Hkv * s.nblk;
        int64_t lo0, unused;
        visible(s, 0, lo0, unused);
        const int64_t tq = std::max<int64_t>(1, TILE_ROWS / s.rep);
        for (int64_t g = 0; g < s.Hkv; ++g) {
            for (int64_t b = lo0 / KB; b < s.nblk; ++b) packs.push_back({x, g, b});
            for (int64_t i = 0; i < s.n; i += tq)
                tiles.push_back({x, g, i, std::min(s.n, i + tq)});
        }
    }
    if (tiles.empty()) return;
    const Shape& s0 = spans[0].s;
    auto kpack = torch::empty({blocks * KB * s0.D}, q.options());
    auto vpack = torch::empty({blocks * KB * s0.Dv}, q.options());
    auto* kp = reinterpret_cast<uint16_t*>(kpack.data_ptr<at::BFloat16>());
    auto* vp = reinterpret_cast<uint16_t*>(vpack.data_ptr<at::BFloat16>());
    const auto* kc = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>());
    const auto* vc = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>());
    at::parallel_for(0, static_cast<int64_t>(packs.size()), 4, [&](int64_t a, int64_t e) {
        for (int64_t x = a; x < e; ++x) {
            const auto [i, g, b] = packs[x];
            const Span& sp = spans[i];
            const int64_t blk = sp.block0 + g * sp.s.nblk + b;
            pack<KB>(kc, vc, sp.slots, sp.s, g, b,
                     reinterpret_cast<uint32_t*>(kp) + blk * KB * (sp.s.D / 2),
                     vp + blk * KB * sp.s.Dv);
        }
    });
    const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
    const float* sk = sinks.defined() && sinks.numel() ? sinks.data_ptr<float>() : nullptr;
    void* op = out.data_ptr();
    const bool bf16 = out.scalar_type() == torch::kBFloat16;
    largest_first<Scratch>(
        static_cast<int64_t>(tiles.size()),
        [&](int64_t x) {
            const auto [i, g, i0, i1] = tiles[x];
            return tile_blocks(spans[i].s, i0, i1, KB);
        },
        [&](int64_t x, Scratch& w) {
            const auto [i, g, i0, i1] = tiles[x];
            const Span& sp = spans[i];
            tile<KB>(qp, kp + sp.block0 * KB * sp.s.D, vp + sp.block0 * KB * sp.s.Dv, sk, sp.s,
                     sp.row0, g, i0, i1, static_cast<float>(scale), op, bf16, w);
        },
        // the AMX tile state, back before oneDNN's next call
        [] { cpublas::brgemm_release(); });
}

template <int64_t KB>
torch::Tensor run(const torch::Tensor& q, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, const torch::Tensor& slots, int64_t offset,
                  int64_t window, double scale, const torch::Tensor& sinks,
                  const torch::Tensor& into) {
    const Shape s = span_shape(q, k_cache, v_cache, slots, offset, window, sinks, KB);
    torch::Tensor out = output_for(into, s, q);
    std::vector<Span> spans{{s, 0, slots.data_ptr<int64_t>(), 0}};
    run_spans<KB>(q, k_cache, v_cache, spans, scale, sinks, out);
    return out;
}

// The spans of `table` [S, 5] int64 rows (row0, n, slot0, L, offset): queries q[row0, row0
// + n) over keys slots[slot0, slot0 + L), each checked as a call of its own would be.
template <int64_t KB>
void run_table(const torch::Tensor& q, const torch::Tensor& k_cache,
               const torch::Tensor& v_cache, const torch::Tensor& slots,
               const torch::Tensor& table, int64_t window, double scale,
               const torch::Tensor& sinks, torch::Tensor& out) {
    TORCH_CHECK(table.dim() == 2 && table.size(1) == 5 && table.scalar_type() == torch::kInt64 &&
                table.is_contiguous(), "spans must be contiguous int64 [S, 5]: row0, n, slot0, L, offset");
    TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && out.size(0) == q.size(0) && out.size(1) == q.size(1),
                "out must be [T, Hq, Dv] for q [T, Hq, D]");
    TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == torch::kInt64 && slots.is_contiguous(),
                "slots must be a contiguous int64 vector");
    const int64_t* t = table.data_ptr<int64_t>();
    std::vector<Span> spans;
    for (int64_t x = 0; x < table.size(0); ++x, t += 5) {
        const int64_t row0 = t[0], n = t[1], slot0 = t[2], L = t[3];
        TORCH_CHECK(row0 >= 0 && n >= 0 && row0 + n <= q.size(0), "span ", x, ": rows [", row0,
                    ", ", row0 + n, ") outside q's ", q.size(0));
        TORCH_CHECK(slot0 >= 0 && L >= 0 && slot0 + L <= slots.size(0), "span ", x, ": slots [",
                    slot0, ", ", slot0 + L, ") outside the ", slots.size(0), " given");
        const Shape s = span_shape(q.narrow(0, row0, n), k_cache, v_cache, slots.narrow(0, slot0, L),
                                   t[4], window, sinks, KB);
        output_for(out.narrow(0, row0, n), s, q);       // (its checks)
        if (s.n > 0) spans.push_back({s, row0, slots.data_ptr<int64_t>() + slot0, 0});
    }
    if (!spans.empty()) run_spans<KB>(q, k_cache, v_cache, spans, scale, sinks, out);
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

void prefill_attention_amx_spans(const torch::Tensor& q, const torch::Tensor& k_cache,
                                 const torch::Tensor& v_cache, const torch::Tensor& slots,
                                 const torch::Tensor& spans, int64_t window, double scale,
                                 const torch::Tensor& sinks, torch::Tensor out) {
    TORCH_CHECK(prefill_attention_amx_ok(),
                "prefill_attention_amx needs AVX512-BF16 and oneDNN's bf16 brgemm (AMX)");
    if (window > 0)
        run_table<KB_WINDOW>(q, k_cache, v_cache, slots, spans, window, scale, sinks, out);
    else
        run_table<KB_FULL>(q, k_cache, v_cache, slots, spans, window, scale, sinks, out);
}

#else   // the AVX2 build: not available (callers keep the other paths)

bool prefill_attention_amx_ok() { return false; }

torch::Tensor prefill_attention_amx(const torch::Tensor&, const torch::Tensor&,
                                    const torch::Tensor&, const torch::Tensor&, int64_t,
                                    int64_t, double, const torch::Tensor&, const torch::Tensor&) {
    TORCH_CHECK(false, "prefill_attention_amx is in the avx512-vnni build only");
    return {};
}

void prefill_attention_amx_spans(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                 const torch::Tensor&, const torch::Tensor&, int64_t, double,
                                 const torch::Tensor&, torch::Tensor) {
    TORCH_CHECK(false, "prefill_attention_amx is in the avx512-vnni build only");
}

#endif
