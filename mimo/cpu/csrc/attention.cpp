// Decode attention over paged KV: one query token per sequence, keys and values read in
// place from the pool through each sequence's slot list (no gathered copy), GQA, value
// head dims that differ from the key's, and attention sinks (a per-head logit that joins
// the softmax with no value). Built with the same flags as qkernels.cpp.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float to_f(float x) { return x; }
inline float to_f(at::BFloat16 x) { return static_cast<float>(x); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), acc);
    float s = hsum(acc);
    for (; i < D; ++i) s += q[i] * to_f(k[i]);
    return s;
}

template <typename T>
inline void axpy(float a, const T* v, float* out, int64_t D) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= D; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(av, load8(v + i), _mm256_loadu_ps(out + i)));
    for (; i < D; ++i) out[i] += a * to_f(v[i]);
}

template <typename T>
void decode(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc,
            const torch::Tensor& slots, const torch::Tensor& lens, double scale,
            const float* sinks, torch::Tensor& out) {
    const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
    const int64_t Hkv = kc.size(1), Dv = vc.size(2), L = slots.size(1);
    const int64_t rep = Hq / Hkv;
    const T* kp = kc.data_ptr<T>();
    const T* vp = vc.data_ptr<T>();
    const int64_t* sp = slots.data_ptr<int64_t>();
    const int64_t* lp = lens.data_ptr<int64_t>();
    const float* qp = q.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t ks = kc.stride(0), vs = vc.stride(0);
    at::parallel_for(0, B * Hq, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> s(L);
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t b = t / Hq, h = t % Hq, g = h / rep;
            const int64_t n = lp[b];
            const float* qh = qp + (b * Hq + h) * D;
            float mx = sinks ? sinks[h] : -INFINITY;
            for (int64_t l = 0; l < n; ++l) {
                s[l] = dot(qh, kp + sp[b * L + l] * ks + g * D, D) * static_cast<float>(scale);
                mx = std::max(mx, s[l]);
            }
            float den = sinks ? std::exp(sinks[h] - mx) : 0.f;
            float* o = op + (b * Hq + h) * Dv;
            std::memset(o, 0, sizeof(float) * Dv);
            for (int64_t l = 0; l < n; ++l) {
                const float p = std::exp(s[l] - mx);
                den += p;
                axpy(p, vp + sp[b * L + l] * vs + g * Dv, o, Dv);
            }
            const float inv = den > 0.f ? 1.f / den : 0.f;
            for (int64_t i = 0; i < Dv; ++i) o[i] *= inv;
        }
    });
}

}  // namespace

// q [B, Hq, D] float32; k_cache [S, Hkv, D], v_cache [S, Hkv, Dv] (float32 or bfloat16,
// rows contiguous); slots [B, L] int64 (row b reads its first lens[b]); sinks [Hq] or
// empty. Returns float32 [B, Hq, Dv].
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& slots,
                                     const torch::Tensor& lens, double scale,
                                     const torch::Tensor& sinks) {
    TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(),
                "q must be contiguous float32 [B, Hq, D]");
    TORCH_CHECK(k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.size(2) == q.size(2),
                "caches must be [slots, Hkv, D] and [slots, Hkv, Dv] with q's D");
    TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "caches differ in dtype");
    TORCH_CHECK(k_cache.stride(2) == 1 && k_cache.stride(1) == k_cache.size(2) &&
                v_cache.stride(2) == 1 && v_cache.stride(1) == v_cache.size(2),
                "cache rows must be contiguous");
    TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "query heads must be a multiple of KV heads");
    TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == torch::kInt64 && slots.is_contiguous()
                && slots.size(0) == q.size(0), "slots must be contiguous int64 [B, L]");
    TORCH_CHECK(lens.dim() == 1 && lens.scalar_type() == torch::kInt64 && lens.size(0) == q.size(0),
                "lens must be int64 [B]");
    const int64_t L = slots.size(1), S = k_cache.size(0);
    auto la = lens.accessor<int64_t, 1>();
    for (int64_t b = 0; b < lens.size(0); ++b) TORCH_CHECK(la[b] >= 0 && la[b] <= L, "bad length");
    auto sa = slots.accessor<int64_t, 2>();
    for (int64_t b = 0; b < slots.size(0); ++b)
        for (int64_t l = 0; l < la[b]; ++l) TORCH_CHECK(sa[b][l] >= 0 && sa[b][l] < S, "slot out of range");
    const float* sk = nullptr;
    torch::Tensor sinks_f;
    if (sinks.numel() > 0) {
        TORCH_CHECK(sinks.numel() == q.size(1), "one sink per query head");
        sinks_f = sinks.to(torch::kFloat32).contiguous();
        sk = sinks_f.data_ptr<float>();
    }
    torch::Tensor out = torch::empty({q.size(0), q.size(1), v_cache.size(2)}, torch::kFloat32);
    if (k_cache.scalar_type() == torch::kFloat32)
        decode<float>(q, k_cache, v_cache, slots, lens, scale, sk, out);
    else if (k_cache.scalar_type() == torch::kBFloat16)
        decode<at::BFloat16>(q, k_cache, v_cache, slots, lens, scale, sk, out);
    else
        TORCH_CHECK(false, "caches must be float32 or bfloat16");
    return out;
}
