// The products on GGUF blocks that Python calls: y = x @ W^T over parts of mixed types, and
// the k best columns of x @ W^T fused with the product. Each call quantizes the
// activations once and runs one parallel region over tiles of weight rows, on the 512-bit
// VNNI tiles where the build has them (qtile512.cpp), else on the 256-bit path.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "qcommon.h"
#include "qpack.h"
#include "qproduct.h"
#include "amx_tiles.h"
#include "kernels.h"

using namespace mimo_q;

namespace {

struct Quantized {
    torch::Tensor q, d, dsum, isum16;
    std::vector<QAct> acts;
};

// x [M, K] float32, K a multiple of 32.
Quantized quantize_rows(const torch::Tensor& x) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "activations must be a contiguous float32 [M, K] tensor");
    const int64_t M = x.size(0), K = x.size(1);
    TORCH_CHECK(K % 32 == 0, "K must be a multiple of 32, got ", K);
    Quantized r;
    r.q = torch::empty({M, K}, torch::kInt8);
    r.d = torch::empty({M, K / 32}, torch::kFloat32);
    r.dsum = torch::empty({M, K / 32}, torch::kFloat32);
    r.isum16 = torch::empty({M, K / 16}, torch::kInt32);
    const float* xp = x.data_ptr<float>();
    int8_t* qp = r.q.data_ptr<int8_t>();
    float* dp = r.d.data_ptr<float>();
    float* sp = r.dsum.data_ptr<float>();
    int32_t* ip = r.isum16.data_ptr<int32_t>();
    at::parallel_for(0, M * (K / 32), 256, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b)
            quantize_block(xp + 32 * b, qp + 32 * b, dp + b, sp + b, ip + 2 * b);
    });
    r.acts.resize(M);
    for (int64_t m = 0; m < M; ++m)
        r.acts[m] = QAct{qp + m * K, dp + m * (K / 32), sp + m * (K / 32), ip + m * (K / 16), K};
    return r;
}

// f(slot, i0, i1) over [0, n) in runs of at most `step` items, each run taken by whichever
// thread asks next (in increasing order); slot < at::get_num_threads() names the thread
// that took it. Not an even split up front: on a shared machine one core often runs
// slower than the other (time stolen, the server's event loop), and an even split then
// waits for it at the end of every product: a single-stream AVX2 decode step took
// 20-23 ms split evenly and 17-19 ms taken run by run (docs/speed.md). Each output is
// still computed by one thread with the same code: the results do not depend on who ran what.
template <typename F>
void dynamic_for(int64_t n, int64_t step, const F& f) {
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s)
            for (int64_t i; (i = next.fetch_add(step, std::memory_order_relaxed)) < n;)
                f(s, i, std::min(n, i + step));
    });
}

using Cand = std::pair<float, int64_t>;     // (score, column)

bool better(const Cand& a, const Cand& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Offer scores s[0..n) (columns base..base+n) to a heap of at most k, worst on top. Columns
// come in increasing order, so a later score equal to the worst kept one never beats it.
void offer(std::vector<Cand>& h, int64_t k, const float* s, int64_t n, int64_t base) {
    int64_t i = 0;
    for (; i < n && static_cast<int64_t>(h.size()) < k; ++i) {
        h.emplace_back(s[i], base + i);
        std::push_heap(h.begin(), h.end(), better);
    }
    float thr = h.empty() ? 0.f : h.front().first;
    auto take = [&](int64_t c) {
        std::pop_heap(h.begin(), h.end(), better);
        h.back() = Cand{s[c], base + c};
        std::push_heap(h.begin(), h.end(), better);
        thr = h.front().first;
    };
#ifdef MIMO_ISA_VNNI
    for (; i + 16 <= n; i += 16) {                 // 16 scores per compare
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + i), _mm512_set1_ps(thr), _CMP_GT_OQ);
        while (hit) {
            const int b = __builtin_ctz(hit);
            hit &= hit - 1;
            if (s[i + b] > thr) take(i + b);
        }
    }
#endif
    for (; i < n; ++i)
        if (s[i] > thr) take(i);
}

}  // namespace

// y [M, sum(N_i)] = x [M, K] @ concat_i(W_i)^T, each W_i in its own GGUF type: one parallel
// region over the tiles of every part, in runs of 1/8 of a thread's share.
torch::Tensor qlinear(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                      const std::vector<int64_t>& qtypes) {
    Quantized qa = quantize_rows(x);
    const QProduct p(ws, qtypes, x.size(1));
    const int64_t M = x.size(0);
    torch::Tensor y = torch::empty({M, p.N()}, torch::kFloat32);
    float* yp = y.data_ptr<float>();
    dynamic_for(p.tiles(), p.run_tiles(at::get_num_threads()),
                [&](int64_t, int64_t t0, int64_t t1) { p.run(qa.acts.data(), M, t0, t1, yp); });
    return y;
}

// y as qlinear makes it, for M > 16 rows on the prefill GEMM (qgemm512.cpp) where the build
// has one (else qlinear itself): activation rows packed once per weight type's packing into
// groups, then, per chunk of rows whose packed activations stay in L2 (~256 KB), one
// parallel region over the weight tiles of every part, each tile decoded once for the
// chunk. With fewer tiles than 4 per thread, a tile's groups are split between threads too.
torch::Tensor qgemm(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                    const std::vector<int64_t>& qtypes) {
    const int64_t R = gemm_rows();
    if (R == 0 || x.size(0) <= TILE) return qlinear(x, ws, qtypes);
    Quantized qa = quantize_rows(x);
    const int64_t K = x.size(1), M = x.size(0);
    const QProduct p(ws, qtypes, K);
    const int64_t N = p.N();
    const int64_t ng = (M + R - 1) / R;
    // the activations packed per (offset, halves) of the parts' types, R rows a group
    std::vector<std::vector<Packed>> packs;
    std::vector<std::vector<RowGroup>> groups;
    std::vector<int> key_of(ws.size());
    std::vector<int> keys;
    for (size_t i = 0; i < ws.size(); ++i) {
        const int t = static_cast<int>(qtypes[i]);
        const int key = 2 * offset(t) + (ggml_type(t) == Q6_K);
        auto it = std::find(keys.begin(), keys.end(), key);
        key_of[i] = static_cast<int>(it - keys.begin());
        if (it != keys.end()) continue;
        keys.push_back(key);
        packs.emplace_back(ng);
        groups.emplace_back(ng);
        auto& pk = packs.back();
        auto& g = groups.back();
        at::parallel_for(0, ng, 1, [&](int64_t g0, int64_t g1) {
            for (int64_t j = g0; j < g1; ++j) {
                const int rows = static_cast<int>(std::min(R, M - j * R));
                pack(qa.acts.data() + j * R, rows, offset(t), ggml_type(t) == Q6_K, pk[j]);
                g[j] = RowGroup{pk[j].view(), rows, j * R};
            }
        });
    }
    torch::Tensor y = torch::empty({M, N}, torch::kFloat32);
    float* yp = y.data_ptr<float>();
    const int64_t tiles = p.tiles();
    const int64_t chunk = std::max<int64_t>(1, (256 << 10) / (K + K / 8) / R);   // groups
    const int64_t want = 4 * at::get_num_threads();
    for (int64_t c0 = 0; c0 < ng; c0 += chunk) {
        const int64_t c1 = std::min(ng, c0 + chunk);
        const int64_t splits = tiles >= want ? 1 : std::min(c1 - c0, (want + tiles - 1) / tiles);
        at::parallel_for(0, tiles * splits, 1, [&](int64_t i0, int64_t i1) {
            for (int64_t item = i0; item < i1; ++item) {
                const int64_t tile = item / splits, s = item % splits;
                const auto [i, n0, n1, col] = p.tile(tile);
                const int64_t ga = c0 + (c1 - c0) * s / splits, gb = c0 + (c1 - c0) * (s + 1) / splits;
                const RowGroup* g = groups[key_of[i]].data() + ga;
                const int t = static_cast<int>(qtypes[i]);
                if (!gemm512(t, ws[i].data_ptr<uint8_t>(), ws[i].size(1), n0, n1, K, g, gb - ga,
                             yp + col, N))
                    p.run(qa.acts.data() + ga * R, std::min(M, gb * R) - ga * R, tile, tile + 1,
                          yp + ga * R * N);
            }
        });
    }
    return y;
}

// The k best columns of x @ W^T per row (scores descending, ties to the lower index),
// without writing the [M, N] scores: each thread keeps the candidates of the chunks of
// weight rows it scored, merged at the end.
std::vector<torch::Tensor> qtopk(const torch::Tensor& x, const torch::Tensor& w, int64_t qtype,
                                 int64_t k) {
    const int64_t K = x.size(1), M = x.size(0), N = w.size(0);
    check_weight(w, qtype, K);
    TORCH_CHECK(k >= 1 && k <= N, "k must lie in [1, N]");
    Quantized qa = quantize_rows(x);
    const int t = static_cast<int>(qtype);
    const uint8_t* wp = w.data_ptr<uint8_t>();
    const int64_t rb = w.size(1);
    constexpr int64_t CH = 1024;                      // weight rows scored per pass
    const int64_t chunks = (N + CH - 1) / CH;
    const int64_t groups = at::get_num_threads();
    // cand[g][m]: (score, index) pairs, at most k, of the chunks thread slot g scored
    std::vector<std::vector<std::vector<Cand>>> cand(groups, std::vector<std::vector<Cand>>(M));
    std::vector<std::vector<float>> bufs(groups);
    dynamic_for(chunks, 1, [&](int64_t g, int64_t c0, int64_t c1) {
        std::vector<float>& buf = bufs[g];
        buf.resize(M * CH);
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t n0 = c * CH, n1 = std::min(N, n0 + CH);
            run_rows(t, wp + n0 * rb, rb, 0, n1 - n0, qa.acts.data(), M, buf.data(), CH);
            for (int64_t m = 0; m < M; ++m)
                offer(cand[g][m], k, buf.data() + m * CH, n1 - n0, n0);
        }
    });
    torch::Tensor vals = torch::empty({M, k}, torch::kFloat32);
    torch::Tensor idx = torch::empty({M, k}, torch::kInt64);
    auto vp = vals.accessor<float, 2>();
    auto ip = idx.accessor<int64_t, 2>();
    for (int64_t m = 0; m < M; ++m) {
        std::vector<Cand> all;
        for (int64_t g = 0; g < groups; ++g) all.insert(all.end(), cand[g][m].begin(), cand[g][m].end());
        std::partial_sort(all.begin(), all.begin() + k, all.end(), better);
        for (int64_t i = 0; i < k; ++i) {
            vp[m][i] = all[i].first;
            ip[m][i] = all[i].second;
        }
    }
    return {vals, idx};
}

// The activation quantization alone, for tests: (int8 quants, scales) per block of 32.
std::vector<torch::Tensor> quantize_q8(const torch::Tensor& x) {
    Quantized qa = quantize_rows(x);
    return {qa.q, qa.d};
}

std::string isa() {
#ifdef MIMO_ISA_VNNI
    return "avx512-vnni";
#else
    return "avx2";
#endif
}

// attention.cpp
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& slots,
                                     const torch::Tensor& lens, double scale,
                                     const torch::Tensor& sinks);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    // The products release the GIL: the event loop thread serves streams meanwhile.
    m.def("qlinear", &qlinear, "x @ concat(W_i)^T with GGUF-block weights",
          py::call_guard<py::gil_scoped_release>());
    m.def("qgemm", &qgemm, "qlinear for prefill-sized M: each weight tile decoded once per call",
          py::call_guard<py::gil_scoped_release>());
    m.def("qtopk", &qtopk, "top-k columns of x @ W^T per row, scores never written",
          py::call_guard<py::gil_scoped_release>());
    m.def("repack_x8", &repack_x8, "Q5_0 / Q4_K / Q6_K blocks [N, rb] -> the 8-row tiles' layout",
          py::call_guard<py::gil_scoped_release>());
    m.def("unpack_x8", &unpack_x8, "the 8-row tiles' layout -> the GGUF's blocks");
    m.def("quantize_q8", &quantize_q8, "activations -> int8 blocks of 32 and their scales");
    m.def("paged_decode_attention", &paged_decode_attention,
          "one query per sequence over paged KV read in place (GQA, sinks)");
    // out: empty (a new float32 result) or the caller's float32/bf16 rows, written in place.
#define MIMO_PREFILL_ARGS py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), \
    py::arg("slots"), py::arg("offset"), py::arg("window"), py::arg("scale"), py::arg("sinks"), \
    py::arg("out") = torch::empty({0})
    m.def("prefill_attention", &prefill_attention,
          "a prefill chunk over paged KV with bf16 dot products (causal, window, GQA, sinks)",
          MIMO_PREFILL_ARGS, py::call_guard<py::gil_scoped_release>());
    m.def("prefill_attention_ok", &prefill_attention_ok,
          "whether this build has prefill_attention and the CPU runs it");
    m.def("prefill_attention_amx", &prefill_attention_amx,
          "prefill_attention on oneDNN's brgemm (AMX tiles)",
          MIMO_PREFILL_ARGS, py::call_guard<py::gil_scoped_release>());
#undef MIMO_PREFILL_ARGS
    m.def("prefill_attention_amx_spans", &prefill_attention_amx_spans,
          "prefill_attention_amx for every span of a step (rows row0, n, slot0, L, offset)",
          py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slots"),
          py::arg("spans"), py::arg("window"), py::arg("scale"), py::arg("sinks"), py::arg("out"),
          py::call_guard<py::gil_scoped_release>());
    m.def("prefill_attention_amx_ok", &prefill_attention_amx_ok,
          "whether this build has prefill_attention_amx and torch's bf16 brgemm runs here");
    m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of each row in its dtype (bf16/f32)",
          py::call_guard<py::gil_scoped_release>());
    m.def("act_mul_rows", &act_mul_rows, "act(gate) * up of [T, 2I] in its dtype (bf16/f32)",
          py::call_guard<py::gil_scoped_release>());
    m.def("qk_norm_rope_rows", &qk_norm_rope_rows,
          "q/k heads' RMSNorm then RoPE, from the qkv rows (bf16/f32)",
          py::call_guard<py::gil_scoped_release>());
    m.def("add_rms_norm_rows", &add_rms_norm_rows,
          "the residual sum x + rms_norm(h) and the next norm of it, in one pass",
          py::arg("x"), py::arg("h"), py::arg("w1"), py::arg("w2"), py::arg("eps"),
          py::arg("y_bf16") = false, py::call_guard<py::gil_scoped_release>());
    m.def("write_rows", &write_rows, "cache[slots[i]] = src[i], one thread",
          py::call_guard<py::gil_scoped_release>());
    py::class_<DequantHandle>(m, "Dequantizing", py::module_local())
        .def("wait", &DequantHandle::wait, "join the thread; raise its error",
             py::call_guard<py::gil_scoped_release>());
    m.def("start_dequantize", &start_dequantize,
          "GGUF blocks -> dense float32/bf16 tensors on a thread of its own (dequant.cpp)");
    m.def("dequant_type", &dequant_type, "whether start_dequantize decodes this GGML type");
    m.def("isa", &isa, "the instruction set this build was compiled for");
    m.def("amx_tiles", &amx::on, "whether chunks of 16 activation rows take the AMX-INT8 tile unit");
    m.def("amx_rows", [] { return amx::ROWS; }, "the activation rows (a chunk) that take the tile unit");
    m.def("set_amx_tiles", &amx::set_enabled,
          "switch the AMX-INT8 tiles on or off (on only where usable); returns amx_tiles()");
}
