// The fused decode layer's Python module: `DecodeLayer` (decode_layer.cpp) and, for tests
// against a float64 reference, its elementwise steps (decode_math.h) and decode attention.
//
// Built into the same extension as qkernels.cpp, but as its own Python module
// (`<build>_decode_ops`, loaded from the same shared object by mimo/cpu/decode_ops.py).
#include "decode_layer.h"
#include "decode_math.h"
#include "kernels.h"

using namespace mimo_dec;

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
    const int64_t I = g.size(1) / 2;
    for (int64_t t = 0; t < g.size(0); ++t)
        act_mul_range(g.data_ptr<float>() + t * 2 * I, m.data_ptr<float>() + t * I, I, 0, I,
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
