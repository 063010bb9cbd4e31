// A whole decoder layer of a decode step in one call: the norms, the q/k/v projection, the
// per-head q/k norm and RoPE, the KV cache write, attention over the paged pools, the output
// projection, the gated MLP and both residual adds. Python's per-layer work (module calls,
// casts, views, ~30 aten ops) was most of a single-stream step; the products themselves go
// to qkernels.cpp's `qlinear` and decode_attention.cpp (kernels.h).
//
// The plain PyTorch layer is the reference: where it rounds to its dtype (bfloat16 linear
// outputs, q/k norms, RoPE's three products and sums, the activation and its product, the
// sandwich norms), this code rounds at the same points, so both paths compute the same
// values up to the order of float32 sums (norms, attention).
//
// Built into the same extension as qkernels.cpp, but as its own Python module
// (`<build>_decode_ops`, loaded from the same shared object by mimo/cpu/decode_ops.py).
#include "kernels.h"
#include "vec_math.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using mimo_vec::act8;
using mimo_vec::exp8;

inline float bf16(float v) { return static_cast<float>(c10::BFloat16(v)); }
inline float rnd(float v, bool on) { return on ? bf16(v) : v; }

// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * scale[r % scale_rows], as torch's rms_norm
// computes it in float32 ((x * rrms) * w), rounded to bfloat16 when `round`; the sum of
// squares in double.
void rms_rows(const float* x, const float* scale, int64_t scale_rows, float* y, int64_t rows,
              int64_t n, float eps, bool round) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        const float* w = scale + (r % scale_rows) * n;
        __m256d s4 = _mm256_setzero_pd();
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(xr + i));
            s4 = _mm256_fmadd_pd(v, v, s4);
        }
        alignas(32) double part[4];
        _mm256_store_pd(part, s4);
        double ss = (part[0] + part[1]) + (part[2] + part[3]);
        for (; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const float inv = 1.f / std::sqrt(static_cast<float>(ss / n) + eps);
        float* yr = y + r * n;
        const __m256 iv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8) {
            __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), iv), _mm256_loadu_ps(w + i));
            _mm256_storeu_ps(yr + i, round ? mimo_vec::bf16_round8(v) : v);
        }
        for (; i < n; ++i) yr[i] = rnd((xr[i] * inv) * w[i], round);
    }
}

inline float act1(float x, bool gelu) {
    alignas(32) float v[8] = {x};
    _mm256_store_ps(v, act8(_mm256_load_ps(v), gelu));
    return v[0];
}

// m[t, i] = act(g) * u for gu [T, 2I] (gate columns first), each op rounded when `round`.
void act_mul(const float* gu, float* m, int64_t T, int64_t I, bool gelu, bool round) {
    at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const float* g = gu + t * 2 * I;
            const float* u = g + I;
            float* mt = m + t * I;
            int64_t i = 0;
            for (; i + 8 <= I; i += 8)
                _mm256_storeu_ps(mt + i, act8(_mm256_loadu_ps(g + i), gelu));
            for (; i < I; ++i) mt[i] = act1(g[i], gelu);
            for (i = 0; i < I; ++i) mt[i] = rnd(rnd(mt[i], round) * u[i], round);
        }
    });
}

// Rotate-half RoPE of one head in place: x * cos + flip_halves(x) * sin_signed, each
// product and the sum rounded when `round` (the tables hold sin with the sign folded in).
void rope_row(float* x, const float* cos, const float* sin, int64_t d, bool round) {
    const int64_t h = d / 2;
    auto r8 = [round](__m256 v) { return round ? mimo_vec::bf16_round8(v) : v; };
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + h);
        const __m256 lo = _mm256_add_ps(r8(_mm256_mul_ps(a, _mm256_loadu_ps(cos + i))),
                                        r8(_mm256_mul_ps(b, _mm256_loadu_ps(sin + i))));
        const __m256 hi = _mm256_add_ps(r8(_mm256_mul_ps(b, _mm256_loadu_ps(cos + i + h))),
                                        r8(_mm256_mul_ps(a, _mm256_loadu_ps(sin + i + h))));
        _mm256_storeu_ps(x + i, r8(lo));
        _mm256_storeu_ps(x + i + h, r8(hi));
    }
    for (; i < h; ++i) {
        const float a = x[i], b = x[i + h];
        x[i] = rnd(rnd(a * cos[i], round) + rnd(b * sin[i], round), round);
        x[i + h] = rnd(rnd(b * cos[i + h], round) + rnd(a * sin[i + h], round), round);
    }
}

// Every element rounded to bfloat16 (to nearest even, as c10::BFloat16; inputs are finite).
void round_all(torch::Tensor& t, bool round) {
    if (!round) return;
    float* p = t.data_ptr<float>();
    const int64_t n = t.numel();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, mimo_vec::bf16_round8(_mm256_loadu_ps(p + i)));
    for (; i < n; ++i) p[i] = bf16(p[i]);
}

template <typename T>
void write_row(const torch::Tensor& cache, int64_t slot, int64_t head, const float* src,
               int64_t n) {
    T* dst = cache.data_ptr<T>() + slot * cache.stride(0) + head * cache.stride(1);
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
        // to nearest even, as c10::BFloat16 rounds finite values; a loop the compiler vectorizes
        uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) {
            uint32_t u;
            std::memcpy(&u, src + i, 4);
            d16[i] = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        }
    } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
    }
}

void write_cache(const torch::Tensor& cache, int64_t slot, int64_t head, const float* src,
                 int64_t n) {
    if (cache.scalar_type() == torch::kBFloat16) write_row<c10::BFloat16>(cache, slot, head, src, n);
    else write_row<float>(cache, slot, head, src, n);
}

torch::Tensor f32(const torch::Tensor& t) { return t.to(torch::kFloat32).contiguous(); }

struct QLinear {
    std::vector<torch::Tensor> w;
    std::vector<int64_t> types;
    torch::Tensor operator()(const torch::Tensor& x, bool round) const {
        torch::Tensor y = qlinear(x, w, types);
        round_all(y, round);
        return y;
    }
};

}  // namespace

// One decoder layer's decode step (T single-token rows) over the float32 residual stream.
// Sandwich norms (Gemma 3) when the post norms are given; empty tensors leave them out
// (the pre-norm Llama shape, whose norms on a float32 input equal these with scale = w).
class DecodeLayer {
public:
    DecodeLayer(std::vector<torch::Tensor> qkv_w, std::vector<int64_t> qkv_t,
                std::vector<torch::Tensor> o_w, std::vector<int64_t> o_t,
                std::vector<torch::Tensor> gu_w, std::vector<int64_t> gu_t,
                std::vector<torch::Tensor> down_w, std::vector<int64_t> down_t,
                std::vector<torch::Tensor> norms, torch::Tensor qk_scale, torch::Tensor sinks,
                int64_t hq, int64_t hkv, int64_t d, int64_t dv, int64_t rope_dim, double eps,
                double scale, double v_scale, std::string act, bool round)
        : qkv_{qkv_w, qkv_t}, o_{o_w, o_t}, gu_{gu_w, gu_t}, down_{down_w, down_t},
          hq_(hq), hkv_(hkv), d_(d), dv_(dv), rd_(rope_dim), eps_(static_cast<float>(eps)),
          scale_(scale), v_scale_(static_cast<float>(v_scale)), gelu_(act == "gelu_tanh"),
          round_(round) {
        TORCH_CHECK(act == "gelu_tanh" || act == "silu", "activation must be gelu_tanh or silu");
        TORCH_CHECK(norms.size() == 4, "four norms: input, post-attention, pre-MLP, post-MLP");
        TORCH_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0 && rope_dim % 2 == 0 && rope_dim > 0 &&
                    rope_dim <= d, "bad head shapes or RoPE dims");
        for (auto& n : norms) norms_.push_back(n.numel() ? f32(n) : n);
        H_ = norms_[0].numel();
        TORCH_CHECK(H_ > 0 && norms_[2].numel() == H_, "input and pre-MLP norms are required");
        if (qk_scale.numel()) {
            TORCH_CHECK(qk_scale.numel() == (hq + hkv) * d, "qk norm scale must be [hq + hkv, d]");
            qk_scale_ = f32(qk_scale);
        }
        if (sinks.numel()) sinks_ = f32(sinks);
        else sinks_ = torch::empty({0}, torch::kFloat32);
    }

    // x [T, H] float32 -> the next residual [T, H]; writes row t's k/v at write_slots[t].
    // cos/sin: [T, (1,) d] RoPE tables; slots [T, L] int64, lens [T] int64 (attention.cpp).
    torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin, const torch::Tensor& k_cache,
                          const torch::Tensor& v_cache, const torch::Tensor& write_slots,
                          const torch::Tensor& slots, const torch::Tensor& lens) const {
        TORCH_CHECK(x.dim() == 2 && x.size(1) == H_ && x.scalar_type() == torch::kFloat32 &&
                    x.is_contiguous(), "x must be contiguous float32 [T, hidden]");
        const int64_t T = x.size(0);
        TORCH_CHECK(cos.numel() == T * rd_ && sin.numel() == T * rd_,
                    "RoPE tables must be [T, rope_dim]");
        TORCH_CHECK(write_slots.numel() == T && write_slots.scalar_type() == torch::kInt64,
                    "one int64 write slot per row");
        TORCH_CHECK(k_cache.size(1) == hkv_ && k_cache.size(2) == d_ && v_cache.size(2) == dv_ &&
                    k_cache.stride(1) == d_ && k_cache.stride(2) == 1 &&
                    v_cache.stride(1) == dv_ && v_cache.stride(2) == 1,
                    "caches must be [slots, hkv, d] / [slots, hkv, dv] with contiguous rows");
        const bool r = round_;
        torch::Tensor h = torch::empty_like(x);
        rms_rows(x.data_ptr<float>(), norms_[0].data_ptr<float>(), 1, h.data_ptr<float>(), T, H_,
                 eps_, false);
        torch::Tensor qkv = qkv_(h, r);
        torch::Tensor q = qk_rope_write(qkv, f32(cos), f32(sin), k_cache, v_cache, write_slots);
        torch::Tensor att = decode_attention(q, k_cache, v_cache, slots, lens, scale_, sinks_, r);
        round_all(att, r);
        torch::Tensor x1 = residual(x, o_(att.view({T, hq_ * dv_}), r), norms_[1]);
        rms_rows(x1.data_ptr<float>(), norms_[2].data_ptr<float>(), 1, h.data_ptr<float>(), T,
                 H_, eps_, false);
        torch::Tensor gu = gu_(h, r);
        const int64_t I = gu.size(1) / 2;
        torch::Tensor m = torch::empty({T, I}, torch::kFloat32);
        act_mul(gu.data_ptr<float>(), m.data_ptr<float>(), T, I, gelu_, r);
        return residual(x1, down_(m, r), norms_[3]);
    }

private:
    // q/k norms and RoPE over qkv's q and k heads, k and v written to the caches; -> q.
    torch::Tensor qk_rope_write(torch::Tensor& qkv, const torch::Tensor& cos,
                                const torch::Tensor& sin, const torch::Tensor& kc,
                                const torch::Tensor& vc, const torch::Tensor& write_slots) const {
        const int64_t T = qkv.size(0), nh = hq_ + hkv_, W = qkv.size(1);
        TORCH_CHECK(W == nh * d_ + hkv_ * dv_, "q/k/v projection width does not match the heads");
        torch::Tensor q = torch::empty({T, hq_, d_}, torch::kFloat32);
        const int64_t* ws = write_slots.data_ptr<int64_t>();
        for (int64_t t = 0; t < T; ++t) {
            float* row = qkv.data_ptr<float>() + t * W;
            if (qk_scale_.defined())
                rms_rows(row, qk_scale_.data_ptr<float>(), nh, row, nh, d_, eps_, round_);
            for (int64_t j = 0; j < nh; ++j)
                rope_row(row + j * d_, cos.data_ptr<float>() + t * rd_,
                         sin.data_ptr<float>() + t * rd_, rd_, round_);
            float* v = row + nh * d_;
            if (v_scale_ != 1.f)      // the cache holds scaled values
                for (int64_t i = 0; i < hkv_ * dv_; ++i) v[i] = rnd(v[i] * v_scale_, round_);
            std::memcpy(q.data_ptr<float>() + t * hq_ * d_, row, sizeof(float) * hq_ * d_);
            TORCH_CHECK(ws[t] >= 0 && ws[t] < kc.size(0) && ws[t] < vc.size(0), "write slot out of range");
            for (int64_t g = 0; g < hkv_; ++g) {
                write_cache(kc, ws[t], g, row + (hq_ + g) * d_, d_);
                write_cache(vc, ws[t], g, row + nh * d_ + g * dv_, dv_);
            }
        }
        return q;
    }

    // x + norm(y) (rounded like the plain path's post norm), or x + y without one.
    torch::Tensor residual(const torch::Tensor& x, torch::Tensor y, const torch::Tensor& norm) const {
        const int64_t T = x.size(0);
        if (norm.numel())
            rms_rows(y.data_ptr<float>(), norm.data_ptr<float>(), 1, y.data_ptr<float>(), T, H_,
                     eps_, round_);
        torch::Tensor out = torch::empty_like(x);
        const float* a = x.data_ptr<float>();
        const float* b = y.data_ptr<float>();
        float* o = out.data_ptr<float>();
        for (int64_t i = 0, n = x.numel(); i < n; ++i) o[i] = a[i] + b[i];
        return out;
    }

    QLinear qkv_, o_, gu_, down_;
    std::vector<torch::Tensor> norms_;
    torch::Tensor qk_scale_, sinks_;
    int64_t hq_, hkv_, d_, dv_, rd_, H_ = 0;
    float eps_, v_scale_;
    double scale_;
    bool gelu_, round_;
};

// The elementwise ops alone, for tests against a float64 reference.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale, double eps, bool round) {
    TORCH_CHECK(x.dim() == 2 && scale.dim() >= 1 && scale.size(-1) == x.size(1), "x [R, n], scale [..., n]");
    torch::Tensor xf = f32(x), s = f32(scale);
    const int64_t sr = s.numel() / x.size(1);
    TORCH_CHECK(x.size(0) % sr == 0, "rows must be a multiple of the scale's rows");
    torch::Tensor y = torch::empty_like(xf);
    rms_rows(xf.data_ptr<float>(), s.data_ptr<float>(), sr, y.data_ptr<float>(), x.size(0),
             x.size(1), static_cast<float>(eps), round);
    return y;
}

torch::Tensor act_and_mul(const torch::Tensor& gu, const std::string& act, bool round) {
    TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0, "gu must be [T, 2I]");
    TORCH_CHECK(act == "gelu_tanh" || act == "silu", "activation must be gelu_tanh or silu");
    torch::Tensor g = f32(gu);
    torch::Tensor m = torch::empty({g.size(0), g.size(1) / 2}, torch::kFloat32);
    act_mul(g.data_ptr<float>(), m.data_ptr<float>(), g.size(0), g.size(1) / 2,
            act == "gelu_tanh", round);
    return m;
}

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                   bool round) {
    TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && cos.sizes() == sin.sizes() &&
                cos.size(0) == x.size(0) && cos.size(1) == x.size(2) && x.size(2) % 2 == 0,
                "x [T, heads, d], tables [T, d]");
    torch::Tensor y = f32(x).clone(), c = f32(cos), s = f32(sin);
    const int64_t T = x.size(0), nh = x.size(1), d = x.size(2);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < nh; ++j)
            rope_row(y.data_ptr<float>() + (t * nh + j) * d, c.data_ptr<float>() + t * d,
                     s.data_ptr<float>() + t * d, d, round);
    return y;
}

// The module's name is the build's own plus `_decode_ops` (mimo_qkernels_avx2_decode_ops):
// Python caches extension modules by name, so two builds must not share one.
#define MIMO_CAT2(a, b) a##b
#define MIMO_CAT(a, b) MIMO_CAT2(a, b)
PYBIND11_MODULE(MIMO_CAT(TORCH_EXTENSION_NAME, _decode_ops), m) {
    pybind11::class_<DecodeLayer>(m, "DecodeLayer", pybind11::module_local())
        .def(pybind11::init<std::vector<torch::Tensor>, std::vector<int64_t>,
                            std::vector<torch::Tensor>, std::vector<int64_t>,
                            std::vector<torch::Tensor>, std::vector<int64_t>,
                            std::vector<torch::Tensor>, std::vector<int64_t>,
                            std::vector<torch::Tensor>, torch::Tensor, torch::Tensor,
                            int64_t, int64_t, int64_t, int64_t, int64_t, double, double, double,
                            std::string, bool>())
        .def("forward", &DecodeLayer::forward, "one decode step of the layer",
             py::call_guard<py::gil_scoped_release>());
    m.def("rms_norm", &rms_norm, "x * rsqrt(mean(x^2) + eps) * scale per row");
    m.def("act_and_mul", &act_and_mul, "act(gate) * up of [T, 2I]");
    m.def("rope", &rope, "rotate-half RoPE with sign-folded sin tables");
    m.def("decode_attention", &decode_attention, "decode attention by KV head, split along keys");
    m.attr("max_rep") = DECODE_MAX_REP;     // query heads per KV head decode_attention takes
}
