// One decoder layer's decode step in one call (decode_layer.cpp), bound to Python by
// decode_ops.cpp.
#pragma once
#include <torch/extension.h>
#include <string>
#include <vector>

#include "qproduct.h"

struct Team;     // team.h

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
                double scale, double v_scale, std::string act, bool round);

    // x [T, H] float32 -> the next residual [T, H]; writes row t's k/v at write_slots[t].
    // cos/sin: [T, (1,) d] RoPE tables; slots [T, L] int64, lens [T] int64 (attention.cpp).
    torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin, const torch::Tensor& k_cache,
                          const torch::Tensor& v_cache, const torch::Tensor& write_slots,
                          const torch::Tensor& slots, const torch::Tensor& lens) const;

private:
    struct Step;        // one forward's shared buffers and counters (decode_layer.cpp)
    void run(Step& s, const Team& team) const;
    void product(Step& s, const Team& team, const mimo_q::QProduct& p, const float* x,
                 float* y, int step) const;
    void head(Step& s, int64_t i) const;
    void residual(const float* x, const float* y, const torch::Tensor& norm, float* normed,
                  float* out, int64_t T, int64_t c0, int64_t c1) const;

    mimo_q::QProduct qkv_, o_, gu_, down_;
    std::vector<torch::Tensor> norms_;
    torch::Tensor qk_scale_, sinks_;
    int64_t hq_, hkv_, d_, dv_, rd_, H_ = 0, I_ = 0;
    float eps_, v_scale_;
    double scale_;
    bool gelu_, round_;
};
