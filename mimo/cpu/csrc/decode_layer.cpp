// A whole decoder layer of a decode step in one call: the norms, the q/k/v projection, the
// per-head q/k norm and RoPE, the KV cache write, attention over the paged pools, the output
// projection, the gated MLP and both residual adds. Python's per-layer work (module calls,
// casts, views, ~30 aten ops) was most of a single-stream step.
//
// The layer runs in one parallel region (team.h): its threads stay together for the whole
// layer, a barrier between steps, instead of a region per product and attention step with
// serial work between them. The products' tiles and attention's parts are shared out as
// qlinear and decode_attention share them; the small steps whose results every thread
// needs next (the norms, the activations' quantization) each thread runs for itself on
// private buffers, which saves a barrier and costs a few microseconds.
//
// The plain PyTorch layer is the reference: it rounds where that layer rounds to its dtype
// (decode_math.h), so both compute the same values up to the order of float32 sums (norms,
// attention). Results do not depend on the number of threads or who ran what, except the
// split of attention's keys, which depends on the threads asked for (decode_attention).
#include "decode_layer.h"

#include "attn_steps.h"
#include "decode_math.h"
#include "team.h"
#include <ATen/Parallel.h>
#include <atomic>
#include <cstring>

using namespace mimo_dec;
using mimo_q::QAct;
using mimo_q::QActs;
using mimo_q::QProduct;

namespace {

// Each thread's own buffers, kept between calls: the activations' quantization, a normed
// row, the residual after attention.
struct Own {
    QActs acts;
    std::vector<float> h, x1;
};
Own& own() {
    thread_local Own o;
    return o;
}

constexpr int64_t ACT_CHUNK = 256;     // activation columns per item (a multiple of 8)

}  // namespace

struct DecodeLayer::Step {
    int64_t T = 0;
    const float *x = nullptr, *cos = nullptr, *sin = nullptr;
    const int64_t* write_slots = nullptr;
    torch::Tensor kc, vc;
    float *qkv = nullptr, *q = nullptr, *att = nullptr, *yo = nullptr, *gu = nullptr,
          *m = nullptr, *yd = nullptr, *out = nullptr;
    DecodeAttnSteps* attn = nullptr;
    std::atomic<int64_t> next[8];
};

DecodeLayer::DecodeLayer(std::vector<torch::Tensor> qkv_w, std::vector<int64_t> qkv_t,
                         std::vector<torch::Tensor> o_w, std::vector<int64_t> o_t,
                         std::vector<torch::Tensor> gu_w, std::vector<int64_t> gu_t,
                         std::vector<torch::Tensor> down_w, std::vector<int64_t> down_t,
                         std::vector<torch::Tensor> norms, torch::Tensor qk_scale,
                         torch::Tensor sinks, int64_t hq, int64_t hkv, int64_t d, int64_t dv,
                         int64_t rope_dim, double eps, double scale, double v_scale,
                         std::string act, bool round)
    : hq_(hq), hkv_(hkv), d_(d), dv_(dv), rd_(rope_dim), eps_(static_cast<float>(eps)),
      v_scale_(static_cast<float>(v_scale)), scale_(scale), gelu_(act == "gelu_tanh"),
      round_(round) {
    TORCH_CHECK(act == "gelu_tanh" || act == "silu", "activation must be gelu_tanh or silu");
    TORCH_CHECK(norms.size() == 4, "four norms: input, post-attention, pre-MLP, post-MLP");
    TORCH_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0 && rope_dim % 2 == 0 && rope_dim > 0 &&
                rope_dim <= d, "bad head shapes or RoPE dims");
    for (auto& n : norms) norms_.push_back(n.numel() ? f32(n) : n);
    H_ = norms_[0].numel();
    TORCH_CHECK(H_ > 0 && norms_[2].numel() == H_, "input and pre-MLP norms are required");
    TORCH_CHECK(H_ % 32 == 0 && (hq * dv) % 32 == 0, "hidden and attention widths must be multiples of 32");
    if (qk_scale.numel()) {
        TORCH_CHECK(qk_scale.numel() == (hq + hkv) * d, "qk norm scale must be [hq + hkv, d]");
        qk_scale_ = f32(qk_scale);
    }
    if (sinks.numel()) sinks_ = f32(sinks);
    else sinks_ = torch::empty({0}, torch::kFloat32);
    qkv_ = QProduct(qkv_w, qkv_t, H_);
    TORCH_CHECK(qkv_.N() == (hq + hkv) * d + hkv * dv, "q/k/v projection width does not match the heads");
    o_ = QProduct(o_w, o_t, hq * dv);
    gu_ = QProduct(gu_w, gu_t, H_);
    I_ = gu_.N() / 2;
    TORCH_CHECK(gu_.N() % 2 == 0 && I_ % 32 == 0, "gate/up width must be 2 * I, I a multiple of 32");
    down_ = QProduct(down_w, down_t, I_);
    TORCH_CHECK(o_.N() == H_ && down_.N() == H_, "output and down projections must give the hidden width");
}

torch::Tensor DecodeLayer::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin, const torch::Tensor& k_cache,
                                   const torch::Tensor& v_cache, const torch::Tensor& write_slots,
                                   const torch::Tensor& slots, const torch::Tensor& lens) const {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == H_ && x.scalar_type() == torch::kFloat32 &&
                x.is_contiguous(), "x must be contiguous float32 [T, hidden]");
    const int64_t T = x.size(0);
    TORCH_CHECK(T > 0, "a decode step needs at least one row");
    TORCH_CHECK(cos.numel() == T * rd_ && sin.numel() == T * rd_,
                "RoPE tables must be [T, rope_dim]");
    TORCH_CHECK(write_slots.numel() == T && write_slots.scalar_type() == torch::kInt64 &&
                write_slots.is_contiguous(), "one int64 write slot per row");
    TORCH_CHECK(k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.size(1) == hkv_ &&
                k_cache.size(2) == d_ && v_cache.size(2) == dv_ && k_cache.stride(1) == d_ &&
                k_cache.stride(2) == 1 && v_cache.stride(1) == dv_ && v_cache.stride(2) == 1,
                "caches must be [slots, hkv, d] / [slots, hkv, dv] with contiguous rows");
    const int64_t* ws = write_slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
        TORCH_CHECK(ws[t] >= 0 && ws[t] < k_cache.size(0) && ws[t] < v_cache.size(0),
                    "write slot out of range");
    const torch::Tensor cf = f32(cos), sf = f32(sin);
    const int64_t W = qkv_.N();
    torch::Tensor q = torch::empty({T, hq_, d_}, torch::kFloat32);
    torch::Tensor att = torch::empty({T, hq_, dv_}, torch::kFloat32);
    torch::Tensor out = torch::empty({T, H_}, torch::kFloat32);
    torch::Tensor buf = torch::empty({T * (W + 2 * H_ + 3 * I_)}, torch::kFloat32);
    const int threads = at::get_num_threads();
    DecodeAttnSteps attn(q, k_cache, v_cache, slots, lens, scale_, sinks_, round_, threads, att);
    Step s;
    s.T = T;
    s.x = x.data_ptr<float>();
    s.cos = cf.data_ptr<float>();
    s.sin = sf.data_ptr<float>();
    s.write_slots = ws;
    s.kc = k_cache;
    s.vc = v_cache;
    s.qkv = buf.data_ptr<float>();
    s.yo = s.qkv + T * W;
    s.gu = s.yo + T * H_;
    s.m = s.gu + T * 2 * I_;
    s.yd = s.m + T * I_;
    s.q = q.data_ptr<float>();
    s.att = att.data_ptr<float>();
    s.out = out.data_ptr<float>();
    s.attn = &attn;
    for (auto& n : s.next) n.store(0, std::memory_order_relaxed);
    run_team(threads, [&](const Team& team) { run(s, team); });
    return out;
}

// The layer on one member of the team; steps between barriers, numbered by their counters.
void DecodeLayer::run(Step& s, const Team& team) const {
    const int64_t T = s.T;
    Own& o = own();
    o.h.resize(T * std::max(H_, I_));
    o.x1.resize(T * H_);
    rms_rows(s.x, norms_[0].data_ptr<float>(), 1, o.h.data(), T, H_, eps_, false);
    product(s, team, qkv_, o.h.data(), s.qkv, 0);
    team.share(s.next[1], T * (hq_ + hkv_ + 1), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) head(s, i);
    });
    team.sync();
    DecodeAttnSteps& a = *s.attn;
    team.share(s.next[2], a.units(), 1, [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) a.score(u);
    });
    team.sync();
    if (team.id == 0) a.maxes();
    team.sync();
    team.share(s.next[3], a.units(), 1, [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) a.values(u);
    });
    team.sync();
    if (team.id == 0) {
        a.combine();
        round_range(s.att, T * hq_ * dv_, round_);
    }
    team.sync();
    product(s, team, o_, s.att, s.yo, 4);
    residual(s.x, s.yo, norms_[1], o.h.data(), o.x1.data(), T, 0, H_);
    rms_rows(o.x1.data(), norms_[2].data_ptr<float>(), 1, o.h.data(), T, H_, eps_, false);
    product(s, team, gu_, o.h.data(), s.gu, 5);
    const int64_t chunks = (I_ + ACT_CHUNK - 1) / ACT_CHUNK;
    team.share(s.next[6], T * chunks, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t t = i / chunks, c = i % chunks * ACT_CHUNK;
            act_mul_range(s.gu + t * 2 * I_, s.m + t * I_, I_, c, std::min(I_, c + ACT_CHUNK),
                          gelu_, round_);
        }
    });
    team.sync();
    product(s, team, down_, s.m, s.yd, 7);
    // each member writes its share of the output's columns
    residual(o.x1.data(), s.yd, norms_[3], o.h.data(), s.out, T, H_ * team.id / team.size,
             H_ * (team.id + 1) / team.size);
}

// y [T, N] = x [T, K] @ W^T, rounded to bfloat16 when the layer rounds; the tiles taken
// from counter `step` in guided runs, then a barrier. Each member quantizes x for itself.
void DecodeLayer::product(Step& s, const Team& team, const QProduct& p, const float* x,
                          float* y, int step) const {
    const QAct* a = own().acts.quantize(x, s.T, p.K());
    const int64_t N = p.N();
    team.share_guided(s.next[step], p.tiles(), 1, [&](int64_t t0, int64_t t1) {
        p.run(a, s.T, t0, t1, y);
        if (!round_) return;
        const auto [c0, c1] = p.columns(t0, t1);
        for (int64_t t = 0; t < s.T; ++t) round_range(y + t * N + c0, c1 - c0, true);
    });
    team.sync();
}

// Item i of the heads' step: row t = i / (heads + 1), its q or k head j (q/k norm, RoPE; q
// kept for attention, k written to the cache), or for j = heads its v heads (scaled, written).
void DecodeLayer::head(Step& s, int64_t i) const {
    const int64_t nh = hq_ + hkv_, t = i / (nh + 1), j = i % (nh + 1);
    float* row = s.qkv + t * qkv_.N();
    const int64_t slot = s.write_slots[t];
    if (j < nh) {
        float* x = row + j * d_;
        if (qk_scale_.defined())
            rms_rows(x, qk_scale_.data_ptr<float>() + j * d_, 1, x, 1, d_, eps_, round_);
        rope_row(x, s.cos + t * rd_, s.sin + t * rd_, rd_, round_);
        if (j < hq_) std::memcpy(s.q + (t * hq_ + j) * d_, x, sizeof(float) * d_);
        else write_cache(s.kc, slot, j - hq_, x, d_);
        return;
    }
    float* v = row + nh * d_;
    if (v_scale_ != 1.f)      // the cache holds scaled values
        for (int64_t k = 0; k < hkv_ * dv_; ++k) v[k] = rnd(v[k] * v_scale_, round_);
    for (int64_t g = 0; g < hkv_; ++g) write_cache(s.vc, slot, g, v + g * dv_, dv_);
}

// out[t, c0:c1] = x[t] + norm(y[t]) (rounded like the plain path's post norm; `normed`
// [T, H] scratch), or x + y without a norm.
void DecodeLayer::residual(const float* x, const float* y, const torch::Tensor& norm,
                           float* normed, float* out, int64_t T, int64_t c0, int64_t c1) const {
    if (norm.numel()) {
        rms_rows(y, norm.data_ptr<float>(), 1, normed, T, H_, eps_, round_);
        y = normed;
    }
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = c0; c < c1; ++c) out[t * H_ + c] = x[t * H_ + c] + y[t * H_ + c];
}
