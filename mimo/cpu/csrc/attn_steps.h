// decode_attention (decode_attention.cpp) as the steps that compute it, for callers that
// run them in parallel themselves: score(u) for every u < units(), then maxes() once, then
// values(u) for every u, then combine() once, each step begun only when the one before has
// finished on every thread. decode_attention runs them as two parallel regions; the fused
// decode layer (decode_layer.cpp) inside its team's one region.
#pragma once
#include <torch/extension.h>
#include <vector>

class DecodeAttnSteps {
public:
    // decode_attention's arguments, checked here (the steps check nothing), and the work
    // split for `threads`. q is read by score(), out [B, Hq, Dv] float32 written by combine():
    // the caller may fill q after this and before the first score().
    DecodeAttnSteps(const torch::Tensor& q, const torch::Tensor& k_cache,
                    const torch::Tensor& v_cache, const torch::Tensor& slots,
                    const torch::Tensor& lens, double scale, const torch::Tensor& sinks,
                    bool round, int64_t threads, torch::Tensor out);
    int64_t units() const { return units_; }
    void score(int64_t u);
    void maxes();
    void values(int64_t u);
    void combine();

private:
    template <typename T> void score_t(int64_t u);
    template <typename T> void values_t(int64_t u);
    struct Unit {
        int64_t b, g, h0, l0, l1;     // sequence, KV head, its first query head, keys [l0, l1)
    };
    Unit unit(int64_t u) const;

    torch::Tensor q_, kc_, vc_, slots_, lens_, sinks_, out_;
    int64_t B_, Hq_, D_, Hkv_, Dv_, L_, rep_, split_, units_;
    float scale_;
    bool round_, bf16_cache_, bf16_;
    bool norm_first_ = false;         // sinks with rounding: weights normalised before values
    const float* sk_ = nullptr;       // sinks, float32, or none
    std::vector<float> s_, part_max_, sums_, mx_, inv_, acc_;
};
