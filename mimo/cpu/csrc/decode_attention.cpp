// Decode attention for the fused layer (decode_layer.cpp): one query per sequence over paged
// KV read in place, as attention.cpp's kernel computes it, but by KV head rather than by
// query head, and split along the keys:
// - the query heads that share a KV head (GQA) score each key row and add each value row
//   together, so every row is read and converted once, not once per query head;
// - a sequence whose KV heads are fewer than the threads (one stream of Gemma 3: a single
//   KV head) has its keys split into parts that run in parallel: scores first, then the
//   softmax's max over all parts, then each part's weighted values, summed at the end.
// `round`: the weights rounded to bfloat16 before they multiply the values, as the plain
// layer's bfloat16 attention does (torch's CPU SDPA rounds exp(s - max) and divides by the
// unrounded sum; the explicit softmax used with sinks rounds the normalised weights).
// Sinks: a per-head logit joining the softmax with no value.
// With `round` and bfloat16 caches, on a CPU with AVX512-BF16 (VNNI build), q is taken as
// bfloat16 (the plain layer's q is a bfloat16 tensor) and both products run on `vdpbf16ps`.
#include "attn_steps.h"
#include "kernels.h"
#include "vec_math.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t MAX_REP = DECODE_MAX_REP;     // query heads per KV head (kernels.h)
constexpr int64_t MIN_PART = 32;    // keys per part at least

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

// Scores of keys [l0, l1) for the rep query heads of KV head g: s[r * L + l].
template <typename T>
float score_part(const float* q, const T* kp, const int64_t* slots, int64_t l0, int64_t l1,
                 int64_t ks, int64_t g, int64_t rep, int64_t D, int64_t L, float scale, float* s) {
    float mx = -INFINITY;
    for (int64_t l = l0; l < l1; ++l) {
        const T* k = kp + slots[l] * ks + g * D;
        __m256 acc[MAX_REP];
        for (int64_t r = 0; r < rep; ++r) acc[r] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= D; i += 8) {
            const __m256 kv = load8(k + i);
            for (int64_t r = 0; r < rep; ++r) acc[r] = _mm256_fmadd_ps(load8(q + r * D + i), kv, acc[r]);
        }
        for (int64_t r = 0; r < rep; ++r) {
            float d = hsum(acc[r]);
            for (int64_t j = i; j < D; ++j) d += q[r * D + j] * to_f(k[j]);
            s[r * L + l] = d * scale;
            mx = std::max(mx, s[r * L + l]);
        }
    }
    return mx;
}

#if defined(MIMO_ISA_VNNI)
#define MIMO_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// The bfloat16 products (`round` with bfloat16 caches, where the CPU has AVX512-BF16):
// `vdpbf16ps` multiplies bfloat16 pairs exactly and adds them in float32, so with q and the
// weights already bfloat16 values (as the plain bfloat16 layer holds them) the results
// differ from the float32 loops only in the order of float32 sums, at about a third of
// the instructions.
bool bf16_ok() {
    static const bool ok = __builtin_cpu_supports("avx512bf16");
    return ok;
}

// Key and value rows are read by slot, pages apart: each loop asks for the row AHEAD keys on.
constexpr int64_t AHEAD = 8;
inline void prefetch_row(const at::BFloat16* p, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// Scores of keys [l0, l1) for the rep query heads of KV head g, qb: the heads' queries as
// bfloat16 [rep, D], D a multiple of 32.
MIMO_BF16 float score_bf16(const uint16_t* qb, const at::BFloat16* kp, const int64_t* slots,
                           int64_t l0, int64_t l1, int64_t ks, int64_t g, int64_t rep,
                           int64_t D, int64_t L, float scale, float* s) {
    float mx = -INFINITY;
    for (int64_t l = l0; l < l1; ++l) {
        const at::BFloat16* k = kp + slots[l] * ks + g * D;
        if (l + AHEAD < l1) prefetch_row(kp + slots[l + AHEAD] * ks + g * D, D);
        __m512 acc[MAX_REP];
        for (int64_t r = 0; r < rep; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 32) {
            const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + i);
            for (int64_t r = 0; r < rep; ++r)
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(qb + r * D + i), kv);
        }
        for (int64_t r = 0; r < rep; ++r) {
            s[r * L + l] = _mm512_reduce_add_ps(acc[r]) * scale;
            mx = std::max(mx, s[r * L + l]);
        }
    }
    return mx;
}

inline uint32_t bits16(float w) {     // a bfloat16 value's 16 bits
    uint32_t u;
    std::memcpy(&u, &w, 4);
    return u >> 16;
}

// acc [rep, Dv] += the weights s (bfloat16 values) times the value rows of keys [l0, l1):
// two keys per `vdpbf16ps` (their rows interleaved), 64 values of 4 heads at a time.
MIMO_BF16 void values_bf16(const at::BFloat16* vp, const int64_t* slots, int64_t l0, int64_t l1,
                           int64_t vs, int64_t g, int64_t rep, int64_t Dv, int64_t L,
                           const float* s, float* acc) {
    constexpr int64_t RH = 4, CH = 4;
    for (int64_t r0 = 0; r0 < rep; r0 += RH) {
        const int64_t nr = std::min(RH, rep - r0);
        for (int64_t i0 = 0; i0 < Dv; i0 += 16 * CH) {
            const int64_t nc = std::min(CH, (Dv - i0) / 16);
            __m512 a[RH][CH];
            for (auto& ar : a) for (auto& x : ar) x = _mm512_setzero_ps();
            for (int64_t l = l0; l < l1; l += 2) {
                const bool two = l + 1 < l1;
                const at::BFloat16* v0 = vp + slots[l] * vs + g * Dv + i0;
                const at::BFloat16* v1 = two ? vp + slots[l + 1] * vs + g * Dv + i0 : v0;
                if (i0 == 0 && r0 == 0)
                    for (int64_t a2 = l + AHEAD; a2 < std::min(l + AHEAD + 2, l1); ++a2)
                        prefetch_row(vp + slots[a2] * vs + g * Dv, Dv);
                __m512i vv[CH];
                for (int64_t c = 0; c < nc; ++c) {
                    const __m512i x0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + 16 * c)));
                    const __m512i x1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v1 + 16 * c)));
                    vv[c] = _mm512_or_si512(x0, _mm512_slli_epi32(x1, 16));
                }
                for (int64_t r = 0; r < nr; ++r) {
                    const float* sr = s + (r0 + r) * L;
                    const uint32_t w = bits16(sr[l]) | (two ? bits16(sr[l + 1]) << 16 : 0u);
                    const __m512bh wb = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
                    for (int64_t c = 0; c < nc; ++c) a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh)vv[c], wb);
                }
            }
            for (int64_t r = 0; r < nr; ++r)
                for (int64_t c = 0; c < nc; ++c) {
                    float* o = acc + (r0 + r) * Dv + i0 + 16 * c;
                    _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), a[r][c]));
                }
        }
    }
}
#endif

// The bfloat16 paths apply: bfloat16 caches, weights and q rounded to bfloat16, a CPU and
// build with AVX512-BF16, head dims the loops take.
template <typename T>
bool bf16_path(bool round, int64_t D, int64_t Dv) {
#if defined(MIMO_ISA_VNNI)
    return std::is_same_v<T, at::BFloat16> && round && D % 32 == 0 && Dv % 16 == 0 && bf16_ok();
#else
    (void)round; (void)D; (void)Dv;
    return false;
#endif
}

template <typename T>
bool bf16_values(const T* vp, const int64_t* slots, int64_t l0, int64_t l1, int64_t vs, int64_t g,
                 int64_t rep, int64_t Dv, int64_t L, bool round, const float* s, float* acc) {
#if defined(MIMO_ISA_VNNI)
    if constexpr (std::is_same_v<T, at::BFloat16>) {
        if (!(round && Dv % 16 == 0 && bf16_ok())) return false;
        values_bf16(vp, slots, l0, l1, vs, g, rep, Dv, L, s, acc);
        return true;
    }
#endif
    (void)vp; (void)slots; (void)l0; (void)l1; (void)vs; (void)g; (void)rep; (void)Dv; (void)L;
    (void)round; (void)s; (void)acc;
    return false;
}

// Weights of keys [l0, l1) in place (exp(s - mx[r]), rounded and/or scaled by inv[r] as
// asked), their unrounded sums added to sum[r], their weighted values to acc [rep, Dv].
template <typename T>
void value_part(const T* vp, const int64_t* slots, int64_t l0, int64_t l1, int64_t vs,
                int64_t g, int64_t rep, int64_t Dv, int64_t L, const float* mx, const float* inv,
                bool round, float* s, float* sum, float* acc) {
    for (int64_t r = 0; r < rep; ++r) {
        float* sr = s + r * L;
        int64_t l = l0;
        __m256 tot = _mm256_setzero_ps();
        for (; l + 8 <= l1; l += 8) {
            const __m256 e = mimo_vec::exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + l), _mm256_set1_ps(mx[r])));
            tot = _mm256_add_ps(tot, e);
            _mm256_storeu_ps(sr + l, e);
        }
        float t = hsum(tot);
        for (; l < l1; ++l) {
            alignas(32) float v[8] = {sr[l] - mx[r]};
            _mm256_store_ps(v, mimo_vec::exp8(_mm256_load_ps(v)));
            sr[l] = v[0];
            t += v[0];
        }
        sum[r] = t;
        if (!inv && !round) continue;
        const __m256 f = _mm256_set1_ps(inv ? inv[r] : 1.f);
        for (l = l0; l + 8 <= l1; l += 8) {
            const __m256 w = inv ? _mm256_mul_ps(_mm256_loadu_ps(sr + l), f) : _mm256_loadu_ps(sr + l);
            _mm256_storeu_ps(sr + l, round ? mimo_vec::bf16_round8(w) : w);
        }
        for (; l < l1; ++l) {
            const float w = inv ? sr[l] * inv[r] : sr[l];
            sr[l] = round ? static_cast<float>(c10::BFloat16(w)) : w;
        }
    }
    if (bf16_values(vp, slots, l0, l1, vs, g, rep, Dv, L, round, s, acc)) return;
    for (int64_t l = l0; l < l1; ++l) {
        const T* v = vp + slots[l] * vs + g * Dv;
        int64_t i = 0;
        for (; i + 8 <= Dv; i += 8) {
            const __m256 vv = load8(v + i);
            for (int64_t r = 0; r < rep; ++r) {
                float* o = acc + r * Dv + i;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(s[r * L + l]), vv, _mm256_loadu_ps(o)));
            }
        }
        for (; i < Dv; ++i)
            for (int64_t r = 0; r < rep; ++r) acc[r * Dv + i] += s[r * L + l] * to_f(v[i]);
    }
}

}  // namespace

DecodeAttnSteps::DecodeAttnSteps(const torch::Tensor& q, const torch::Tensor& k_cache,
                                 const torch::Tensor& v_cache, const torch::Tensor& slots,
                                 const torch::Tensor& lens, double scale,
                                 const torch::Tensor& sinks, bool round, int64_t threads,
                                 torch::Tensor out)
    : q_(q), kc_(k_cache), vc_(v_cache), slots_(slots), lens_(lens), out_(std::move(out)),
      scale_(static_cast<float>(scale)), round_(round) {
    TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(),
                "q must be contiguous float32 [B, Hq, D]");
    TORCH_CHECK(k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.size(2) == q.size(2) &&
                k_cache.size(1) == v_cache.size(1), "caches must be [S, Hkv, D] and [S, Hkv, Dv]");
    TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "caches differ in dtype");
    TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32 ||
                k_cache.scalar_type() == torch::kBFloat16, "caches must be float32 or bfloat16");
    TORCH_CHECK(k_cache.stride(2) == 1 && k_cache.stride(1) == k_cache.size(2) &&
                v_cache.stride(2) == 1 && v_cache.stride(1) == v_cache.size(2),
                "cache rows must be contiguous");
    TORCH_CHECK(q.size(1) % k_cache.size(1) == 0 && q.size(1) / k_cache.size(1) <= MAX_REP,
                "query heads must be a multiple of KV heads, at most 16 per KV head");
    TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == torch::kInt64 && slots.is_contiguous()
                && slots.size(0) == q.size(0), "slots must be contiguous int64 [B, L]");
    TORCH_CHECK(lens.dim() == 1 && lens.scalar_type() == torch::kInt64 && lens.is_contiguous() &&
                lens.size(0) == q.size(0), "lens must be int64 [B]");
    B_ = q.size(0), Hq_ = q.size(1), D_ = q.size(2);
    Hkv_ = k_cache.size(1), Dv_ = v_cache.size(2), L_ = slots.size(1), rep_ = Hq_ / Hkv_;
    TORCH_CHECK(out_.scalar_type() == torch::kFloat32 && out_.is_contiguous() &&
                out_.numel() == B_ * Hq_ * Dv_, "out must be contiguous float32 [B, Hq, Dv]");
    const int64_t S = std::min(k_cache.size(0), v_cache.size(0));
    const int64_t* lp = lens.data_ptr<int64_t>();
    const int64_t* sp = slots.data_ptr<int64_t>();
    for (int64_t b = 0; b < B_; ++b) {
        TORCH_CHECK(lp[b] >= 0 && lp[b] <= L_, "bad length");
        for (int64_t l = 0; l < lp[b]; ++l)
            TORCH_CHECK(sp[b * L_ + l] >= 0 && sp[b * L_ + l] < S, "slot out of range");
    }
    if (sinks.numel() > 0) {
        TORCH_CHECK(sinks.numel() == Hq_, "one sink per query head");
        sinks_ = sinks.to(torch::kFloat32).contiguous();
        sk_ = sinks_.data_ptr<float>();
    }
    // with sinks the plain layer rounds normalised weights: their sum is needed first
    norm_first_ = sk_ && round_;
    bf16_cache_ = k_cache.scalar_type() == torch::kBFloat16;
    bf16_ = bf16_cache_ ? bf16_path<at::BFloat16>(round, D_, Dv_) : false;
    // parts per (sequence, KV head): enough for every thread when there are few heads
    split_ = std::max<int64_t>(1, (threads + B_ * Hkv_ - 1) / (B_ * Hkv_));
    units_ = B_ * Hkv_ * split_;
    s_.resize(B_ * Hq_ * L_);
    part_max_.resize(units_);
    sums_.resize(units_ * rep_);
    mx_.resize(B_ * Hq_);
    inv_.resize(B_ * Hq_);
    acc_.assign(units_ * rep_ * Dv_, 0.f);
}

DecodeAttnSteps::Unit DecodeAttnSteps::unit(int64_t u) const {
    Unit r;
    r.b = u / (Hkv_ * split_);
    r.g = u / split_ % Hkv_;
    r.h0 = r.b * Hq_ + r.g * rep_;
    const int64_t n = lens_.data_ptr<int64_t>()[r.b], p = u % split_;
    const int64_t np = std::max<int64_t>(1, std::min(split_, n / MIN_PART));
    r.l0 = p < np ? n * p / np : n;
    r.l1 = p < np ? n * (p + 1) / np : n;
    return r;
}

void DecodeAttnSteps::score(int64_t u) {
    if (bf16_cache_) score_t<at::BFloat16>(u);
    else score_t<float>(u);
}

void DecodeAttnSteps::values(int64_t u) {
    if (bf16_cache_) values_t<at::BFloat16>(u);
    else values_t<float>(u);
}

template <typename T>
void DecodeAttnSteps::score_t(int64_t u) {
    const auto [b, g, h0, l0, l1] = unit(u);
    const T* kp = kc_.data_ptr<T>();
    const int64_t* sp = slots_.data_ptr<int64_t>() + b * L_;
    const float* qp = q_.data_ptr<float>() + h0 * D_;
#if defined(MIMO_ISA_VNNI)
    if constexpr (std::is_same_v<T, at::BFloat16>)
        if (bf16_) {
            thread_local std::vector<uint16_t> qb;     // the heads' q rounded to bfloat16
            qb.resize(rep_ * D_);
            for (int64_t i = 0; i < rep_ * D_; ++i) qb[i] = c10::BFloat16(qp[i]).x;
            part_max_[u] = score_bf16(qb.data(), kp, sp, l0, l1, kc_.stride(0), g, rep_, D_, L_, scale_,
                                      s_.data() + h0 * L_);
            return;
        }
#endif
    part_max_[u] = score_part(qp, kp, sp, l0, l1, kc_.stride(0), g, rep_, D_, L_, scale_,
                              s_.data() + h0 * L_);
}

void DecodeAttnSteps::maxes() {
    // one max per (sequence, KV head) over its parts and sinks (a common shift: the weights
    // are then exactly exp(s - max) whatever the split)
    for (int64_t bg = 0; bg < B_ * Hkv_; ++bg) {
        float m = -INFINITY;
        for (int64_t p = 0; p < split_; ++p) m = std::max(m, part_max_[bg * split_ + p]);
        for (int64_t r = 0; r < rep_; ++r) {
            const int64_t bh = bg * rep_ + r;    // = b * Hq + g * rep + r
            mx_[bh] = sk_ ? std::max(m, sk_[bh % Hq_]) : m;
        }
    }
    if (norm_first_) {
        const int64_t* lens = lens_.data_ptr<int64_t>();
        for (int64_t bh = 0; bh < B_ * Hq_; ++bh) {
            const int64_t n = lens[bh / Hq_];
            double den = std::exp(static_cast<double>(sk_[bh % Hq_]) - mx_[bh]);
            for (int64_t l = 0; l < n; ++l) den += std::exp(static_cast<double>(s_[bh * L_ + l]) - mx_[bh]);
            inv_[bh] = static_cast<float>(1.0 / den);
        }
    }
}

template <typename T>
void DecodeAttnSteps::values_t(int64_t u) {
    const auto [b, g, h0, l0, l1] = unit(u);
    value_part(vc_.data_ptr<T>(), slots_.data_ptr<int64_t>() + b * L_, l0, l1, vc_.stride(0), g,
               rep_, Dv_, L_, mx_.data() + h0, norm_first_ ? inv_.data() + h0 : nullptr, round_,
               s_.data() + h0 * L_, sums_.data() + u * rep_, acc_.data() + u * rep_ * Dv_);
}

void DecodeAttnSteps::combine() {
    float* op = out_.data_ptr<float>();
    for (int64_t bg = 0; bg < B_ * Hkv_; ++bg)
        for (int64_t r = 0; r < rep_; ++r) {
            const int64_t bh = bg * rep_ + r;
            float den = sk_ ? std::exp(sk_[bh % Hq_] - mx_[bh]) : 0.f;
            float* o = op + bh * Dv_;
            std::fill(o, o + Dv_, 0.f);
            for (int64_t p = 0; p < split_; ++p) {
                const int64_t u = bg * split_ + p;
                den += sums_[u * rep_ + r];
                for (int64_t i = 0; i < Dv_; ++i) o[i] += acc_[(u * rep_ + r) * Dv_ + i];
            }
            const float f = norm_first_ ? 1.f : (den > 0.f ? 1.f / den : 0.f);
            for (int64_t i = 0; i < Dv_; ++i) o[i] *= f;
        }
}

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                               const torch::Tensor& v_cache, const torch::Tensor& slots,
                               const torch::Tensor& lens, double scale,
                               const torch::Tensor& sinks, bool round) {
    TORCH_CHECK(q.dim() == 3 && v_cache.dim() == 3, "q must be [B, Hq, D], v_cache [S, Hkv, Dv]");
    torch::Tensor out = torch::empty({q.size(0), q.size(1), v_cache.size(2)}, torch::kFloat32);
    DecodeAttnSteps a(q, k_cache, v_cache, slots, lens, scale, sinks, round,
                      at::get_num_threads(), out);
    at::parallel_for(0, a.units(), 1, [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) a.score(u);
    });
    a.maxes();
    at::parallel_for(0, a.units(), 1, [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) a.values(u);
    });
    a.combine();
    return out;
}
