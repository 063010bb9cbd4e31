// Prefill attention over paged KV on AMX tiles: the same contract as prefill_attention.cpp
// (causal, an optional sliding window, GQA, sinks, no mask tensor; float32 out), with both
// products on oneDNN's brgemm micro-kernel (torch's `cpublas::brgemm`, the one its own CPU
// flash kernel calls), which runs bf16 tiles on AMX.
//
// Why not torch's flash kernel: it takes an explicit mask for a window's band or a chunk
// that starts mid-sequence, computes every masked block, and handles one head per row
// block. Here a tile's rows are all the heads sharing one KV head at TILE_ROWS / rep
// positions (GQA: every row of the tile reads the same keys, so the tile is 4x taller at
// Gemma 3's 4:1), a tile multiplies only the keys its rows see (to 32-key columns), and a
// row's softmax exponentiates only its own keys. P is rounded to bf16 for P V, as both other
// kernels round it.
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

// Keys are packed per span as runs of columns (Kp [D/2][LDB] key pairs per super-block of
// SBC keys, Vp [C/2][Dv][2]), C the span's visible keys rounded to COL, so a tile can take any
// run of COL-aligned keys within a super-block as one operand: one S = Q K^T and one P V per
// chunk of at most KMAX keys (a window's band is one chunk, or two where it crosses a
// super-block) instead of two brgemm calls per 128-key block, O written once per chunk, no
// rescale of O within one. oneDNN JIT-compiles and keeps (per thread, for good) a kernel for
// every shape and stride it is given, so every stride here is fixed and a tile's rows are
// padded to ROWS_PAD: at most KMAX / COL widths x TILE_ROWS / ROWS_PAD heights per product.
// LDB is not a power of two: a stride of 8 KB put a tile load's 16 rows in one L1 set.
// KMAX bounds S and P of a 128-row tile (512 KB and 256 KB) to stay in L2 beside the
// chunk's keys and values.
constexpr int64_t COL = 32, KMAX = 1024, SBC = 2048, LDB = SBC + 16;
constexpr int64_t PACK_KEYS = 128;  // keys per packing task (SBC is a multiple)
constexpr int64_t TILE_ROWS = 128;  // rows of a tile (positions x heads per KV head), at most
constexpr int64_t ROWS_PAD = 32;

// Super-blocks of a run of C columns, and where column c of a KV head's keys lies (in pairs).
inline int64_t super_blocks(int64_t C) { return (C + SBC - 1) / SBC; }
inline int64_t key_col(int64_t c, int64_t D) { return c / SBC * (D / 2) * LDB + c % SBC; }

struct Scratch {
    std::vector<uint16_t> Q, P;   // [R, D] the tile's query rows; [R, n] P in bf16
    std::vector<float> S, O, m, l;
    std::vector<int64_t> lo, hi;
};

// The weights of the 16 scores S[c ..] (those in k; the others 0): 2^(S vs - m), added to
// sum and stored to P in bf16.
MIMO_BF16 inline void weigh(const float* S, int64_t c, __mmask16 k, __m512 vs, __m512 vm,
                            __m512& sum, uint16_t* P) {
    const __m512 p = _mm512_maskz_mov_ps(k, exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(S + c), vs, vm)));
    sum = _mm512_add_ps(sum, p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(P + c), (__m256i)_mm512_cvtneps_pbh(p));
}

// One row's step of the online softmax over a chunk of n scores S (keys j0 .., n % 32 == 0):
// only keys in [lo, hi) weigh (the 16-key vectors wholly outside are not exponentiated, just
// zeroed in P); scores times `vs` (base 2). The row's running max m and sum l updated and,
// when `rescale` (O holds earlier chunks' sums), its output row O [Dv] scaled where m grew.
MIMO_BF16 inline void softmax_cols(const float* S, int64_t n, int64_t j0, int64_t lo,
                                   int64_t hi, __m512 vs, float& m, float& l, bool rescale,
                                   float* O, int64_t Dv, uint16_t* P) {
    const int64_t a = std::clamp<int64_t>(lo - j0, 0, n), e = std::clamp<int64_t>(hi - j0, 0, n);
    if (a >= e) {                        // nothing of this row in the chunk
        std::memset(P, 0, n * sizeof(uint16_t));
        return;
    }
    // vectors [c0, c1) hold the row's keys; only the first and last may hold others
    const int64_t c0 = a / 16 * 16, c1 = (e + 15) / 16 * 16, cl = c1 - 16;
    const auto mask = [&](int64_t c) {
        const int64_t x = std::max<int64_t>(a - c, 0), y = std::min<int64_t>(e - c, 16);
        return static_cast<__mmask16>(((1u << y) - 1u) & ~((1u << x) - 1u));
    };
    const __mmask16 kf = mask(c0), kl = mask(cl);
    const __m512 ninf = _mm512_set1_ps(NEG_INF);
    __m512 mx = _mm512_mask_mul_ps(ninf, kf, _mm512_loadu_ps(S + c0), vs);
    for (int64_t c = c0 + 16; c < cl; c += 16)
        mx = _mm512_max_ps(mx, _mm512_mul_ps(_mm512_loadu_ps(S + c), vs));
    if (cl > c0) mx = _mm512_max_ps(mx, _mm512_mask_mul_ps(ninf, kl, _mm512_loadu_ps(S + cl), vs));
    const float mnew = std::max(m, _mm512_reduce_max_ps(mx));
    const __m512 vm = _mm512_set1_ps(mnew);
    std::memset(P, 0, c0 * sizeof(uint16_t));
    std::memset(P + c1, 0, (n - c1) * sizeof(uint16_t));
    __m512 sum = _mm512_setzero_ps();
    weigh(S, c0, kf, vs, vm, sum, P);
    for (int64_t c = c0 + 16; c < cl; c += 16) weigh(S, c, 0xFFFF, vs, vm, sum, P);
    if (cl > c0) weigh(S, cl, kl, vs, vm, sum, P);
    const float alpha = m == NEG_INF ? 0.f : std::exp2(m - mnew);
    l = l * alpha + _mm512_reduce_add_ps(sum);
    if (rescale && alpha != 1.f) {
        const __m512 va = _mm512_set1_ps(alpha);
        for (int64_t d = 0; d < Dv; d += 16)
            _mm512_storeu_ps(O + d, _mm512_mul_ps(_mm512_loadu_ps(O + d), va));
    }
    m = mnew;
}

// One tile: queries [i0, i1) of KV head g; the span's queries are rows row0 + i of q and out;
// kp, vp its KV head's packed columns (C of them, the first being key kbase).
MIMO_BF16 void tile(const uint16_t* q, const uint16_t* kp, const uint16_t* vp, int64_t kbase,
                    const float* sinks, const Shape& s, int64_t row0, int64_t g, int64_t i0,
                    int64_t i1, float scale, void* out, bool bf16, Scratch& w) {
    const int64_t R = (i1 - i0) * s.rep, Rp = (R + ROWS_PAD - 1) / ROWS_PAD * ROWS_PAD;
    w.Q.resize(Rp * s.D);
    w.O.resize(Rp * s.Dv);
    w.S.resize(Rp * KMAX);
    w.P.resize(Rp * KMAX);
    w.m.resize(Rp);
    w.l.resize(Rp);
    w.lo.resize(Rp);
    w.hi.resize(Rp);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t i = i0 + r / s.rep, h = g * s.rep + r % s.rep;
        std::memcpy(w.Q.data() + r * s.D, q + ((row0 + i) * s.Hq + h) * s.D,
                    s.D * sizeof(uint16_t));
        visible(s, i, w.lo[r], w.hi[r]);
        w.m[r] = sinks ? sinks[h] * LOG2E : NEG_INF;   // a sink: one more logit, no value
        w.l[r] = sinks ? 1.f : 0.f;
    }
    // padding rows: zero queries over the last row's keys, computed and never stored
    std::memset(w.Q.data() + R * s.D, 0, (Rp - R) * s.D * sizeof(uint16_t));
    for (int64_t r = R; r < Rp; ++r) {
        w.lo[r] = w.lo[R - 1];
        w.hi[r] = w.hi[R - 1];
        w.m[r] = NEG_INF;
        w.l[r] = 0.f;
    }
    const auto* Qb = reinterpret_cast<const at::BFloat16*>(w.Q.data());
    const int64_t jlo = w.lo[0] / COL * COL, jhi = (w.hi[R - 1] + COL - 1) / COL * COL;
    const __m512 vs = _mm512_set1_ps(scale * LOG2E);   // the softmax in base 2
    for (int64_t j0 = jlo, n; j0 < jhi; j0 += n) {
        const int64_t c = j0 - kbase;
        n = std::min({jhi - j0, KMAX, SBC - c % SBC});
        cpublas::brgemm(Rp, n, s.D, s.D, LDB, n, false, Qb,
                        reinterpret_cast<const at::BFloat16*>(kp) + 2 * key_col(c, s.D), w.S.data());
        for (int64_t r = 0; r < Rp; ++r)
            softmax_cols(w.S.data() + r * n, n, j0, w.lo[r], w.hi[r], vs, w.m[r], w.l[r],
                         j0 > jlo, w.O.data() + r * s.Dv, s.Dv, w.P.data() + r * n);
        cpublas::brgemm(Rp, s.Dv, n, n, s.Dv, s.Dv, j0 > jlo,
                        reinterpret_cast<const at::BFloat16*>(w.P.data()),
                        reinterpret_cast<const at::BFloat16*>(vp) + c * s.Dv, w.O.data());
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t i = i0 + r / s.rep, h = g * s.rep + r % s.rep;
        store_row(w.O.data() + r * s.Dv, w.l[r] > 0.f ? 1.f / w.l[r] : 0.f, s.Dv, out, bf16,
                  (row0 + i) * s.Hq + h);
    }
}

// Keys [j0, j0 + nj) of KV head g (within one super-block) into the columns j - kbase of kp
// (key_col) and vp [C/2][Dv][2] (pack_keys).
MIMO_BF16 void pack_cols(const uint16_t* kc, const uint16_t* vc, const int64_t* slots,
                         const Shape& s, int64_t g, int64_t j0, int64_t nj, int64_t kbase,
                         uint32_t* kp, uint16_t* vp) {
    pack_keys<PACK_KEYS>(kc, vc, slots, s, g, j0, nj, kp + key_col(j0 - kbase, s.D), LDB,
                         vp + (j0 - kbase) * s.Dv);
}

// One span of a step: its shape, its first row in q and out, its slots, its packed columns
// (C from key kbase: the keys its first query sees onwards) and where they start in the
// step's packs (each KV head's after the other's): its keys at column kcol0 (counting each
// super-block's LDB), its values at vcol0.
struct Span {
    Shape s;
    int64_t row0;
    const int64_t* slots;
    int64_t kbase = 0, C = 0, kcol0 = 0, vcol0 = 0;
    int64_t kcols() const { return super_blocks(C) * LDB; }   // a KV head's, in the key pack
};

// Every span of a step (the spans of one layer share window, scale and sinks): one parallel
// region packs all their keys and one computes all their tiles, so a step of several
// prompts pays one fork and join per layer, not two per prompt, and its threads share the
// prompts' tiles instead of splitting each prompt's few.
void run_spans(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
               std::vector<Span>& spans, double scale, const torch::Tensor& sinks,
               torch::Tensor& out) {
    int64_t kcols = 0, vcols = 0;
    std::vector<std::array<int64_t, 3>> packs;    // (span, g, first key)
    std::vector<std::array<int64_t, 4>> tiles;    // (span, g, first query, end query)
    for (int64_t x = 0; x < static_cast<int64_t>(spans.size()); ++x) {
        Span& sp = spans[x];
        const Shape& s = sp.s;
        int64_t lo0, unused;
        visible(s, 0, lo0, unused);
        sp.kbase = lo0 / COL * COL;
        sp.C = (s.L + COL - 1) / COL * COL - sp.kbase;
        sp.kcol0 = kcols;
        sp.vcol0 = vcols;
        kcols += s.Hkv * sp.kcols();
        vcols += s.Hkv * sp.C;
        const int64_t tq = std::max<int64_t>(1, TILE_ROWS / s.rep);
        for (int64_t g = 0; g < s.Hkv; ++g) {
            for (int64_t j = sp.kbase; j < sp.kbase + sp.C; j += PACK_KEYS) packs.push_back({x, g, j});
            for (int64_t i = 0; i < s.n; i += tq)
                tiles.push_back({x, g, i, std::min(s.n, i + tq)});
        }
    }
    if (tiles.empty()) return;
    const Shape& s0 = spans[0].s;
    auto kpack = torch::empty({kcols * s0.D}, q.options());
    auto vpack = torch::empty({vcols * s0.Dv}, q.options());
    auto* kp = reinterpret_cast<uint16_t*>(kpack.data_ptr<at::BFloat16>());
    auto* vp = reinterpret_cast<uint16_t*>(vpack.data_ptr<at::BFloat16>());
    const auto* kc = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>());
    const auto* vc = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>());
    // KV head g's packed keys and values
    const auto keys = [&](const Span& sp, int64_t g) { return kp + (sp.kcol0 + g * sp.kcols()) * sp.s.D; };
    const auto values = [&](const Span& sp, int64_t g) { return vp + (sp.vcol0 + g * sp.C) * sp.s.Dv; };
    at::parallel_for(0, static_cast<int64_t>(packs.size()), 4, [&](int64_t a, int64_t e) {
        for (int64_t x = a; x < e; ++x) {
            const auto [i, g, j] = packs[x];
            const Span& sp = spans[i];
            pack_cols(kc, vc, sp.slots, sp.s, g, j, std::min(PACK_KEYS, sp.kbase + sp.C - j),
                      sp.kbase, reinterpret_cast<uint32_t*>(keys(sp, g)), values(sp, g));
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
            return tile_blocks(spans[i].s, i0, i1, COL);
        },
        [&](int64_t x, Scratch& w) {
            const auto [i, g, i0, i1] = tiles[x];
            const Span& sp = spans[i];
            tile(qp, keys(sp, g), values(sp, g), sp.kbase, sk, sp.s, sp.row0, g, i0, i1,
                 static_cast<float>(scale), op, bf16, w);
        },
        // the AMX tile state, back before oneDNN's next call
        [] { cpublas::brgemm_release(); });
}

torch::Tensor run(const torch::Tensor& q, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, const torch::Tensor& slots, int64_t offset,
                  int64_t window, double scale, const torch::Tensor& sinks,
                  const torch::Tensor& into) {
    const Shape s = span_shape(q, k_cache, v_cache, slots, offset, window, sinks, COL);
    torch::Tensor out = output_for(into, s, q);
    std::vector<Span> spans{{s, 0, slots.data_ptr<int64_t>()}};
    run_spans(q, k_cache, v_cache, spans, scale, sinks, out);
    return out;
}

// The spans of `table` [S, 5] int64 rows (row0, n, slot0, L, offset): queries q[row0, row0
// + n) over keys slots[slot0, slot0 + L), each checked as a call of its own would be.
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
                                   t[4], window, sinks, COL);
        output_for(out.narrow(0, row0, n), s, q);       // (its checks)
        if (s.n > 0) spans.push_back({s, row0, slots.data_ptr<int64_t>() + slot0});
    }
    if (!spans.empty()) run_spans(q, k_cache, v_cache, spans, scale, sinks, out);
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
    return run(q, k_cache, v_cache, slots, offset, window, scale, sinks, out);
}

void prefill_attention_amx_spans(const torch::Tensor& q, const torch::Tensor& k_cache,
                                 const torch::Tensor& v_cache, const torch::Tensor& slots,
                                 const torch::Tensor& spans, int64_t window, double scale,
                                 const torch::Tensor& sinks, torch::Tensor out) {
    TORCH_CHECK(prefill_attention_amx_ok(),
                "prefill_attention_amx needs AVX512-BF16 and oneDNN's bf16 brgemm (AMX)");
    run_table(q, k_cache, v_cache, slots, spans, window, scale, sinks, out);
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
