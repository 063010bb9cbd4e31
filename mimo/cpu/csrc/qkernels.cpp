// Block-quantized matmuls on llama.cpp's recipe: activations quantized to 8 bits per block
// of 32 (float scale), weights kept in the GGUF's own blocks, integer dot products per
// 32-element sub-block, float scales applied per sub-block (per 16 for Q6_K).
//
// One source, built twice: with -mavx2 -mfma -mf16c (MIMO_ISA_AVX2) and with the AVX-512
// VNNI flags added (MIMO_ISA_VNNI), where the u8 x s8 dot is one vpdpbusd instead of
// vpmaddubsw + vpmaddwd. mimo/cpu/extension.py chooses the build from the CPU's flags.
//
// Every weight type is decoded, 32 elements at a time, into either signed int8 quants
// (value = scale * q) or unsigned ones with a min (value = scale * q - min); the signed dot
// uses the sign trick (|w| as u8, sign(w) applied to the activation), as ggml does.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

enum QType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

inline float fp16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// Bytes per block and elements per block of each supported type (ggml's block structs).
inline int block_bytes(int t) {
    switch (t) {
        case Q4_0: return 18; case Q4_1: return 20; case Q5_0: return 22; case Q5_1: return 24;
        case Q8_0: return 34; case Q4_K: return 144; case Q5_K: return 176; case Q6_K: return 210;
    }
    return 0;
}
inline int block_elems(int t) { return (t == Q4_K || t == Q5_K || t == Q6_K) ? 256 : 32; }

// A 32-element sub-block of weights: quants, a scale per int32 lane (lanes 0-3 cover
// elements 0-15, lanes 4-7 elements 16-31), and a min (0 for signed types).
struct Sub {
    __m256i q;
    __m256 scale;
    float min;
    bool is_signed;
};

inline __m256i nibbles32(const uint8_t* qs) {   // 16 bytes -> low nibbles, then high nibbles
    __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

inline __m256i bits32(const uint8_t* p) {       // 32 bits -> 0xFF where set, else 0
    uint32_t x;
    std::memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Sub-block s (of block_elems / 32) of the block at `b`.
template <int T>
inline Sub load_sub(const uint8_t* b, int s) {
    Sub r;
    r.min = 0.f;
    if constexpr (T == Q8_0) {
        r.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
        r.scale = _mm256_set1_ps(fp16(b));
        r.is_signed = true;
    } else if constexpr (T == Q4_0) {
        r.q = _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8));
        r.scale = _mm256_set1_ps(fp16(b));
        r.is_signed = true;
    } else if constexpr (T == Q4_1) {
        r.q = nibbles32(b + 4);
        r.scale = _mm256_set1_ps(fp16(b));
        r.min = -fp16(b + 2);
        r.is_signed = false;
    } else if constexpr (T == Q5_0) {
        __m256i hi = _mm256_andnot_si256(bits32(b + 2), _mm256_set1_epi8(static_cast<char>(0xF0)));
        r.q = _mm256_or_si256(nibbles32(b + 6), hi);   // (nibble | bit << 4) - 16, as int8
        r.scale = _mm256_set1_ps(fp16(b));
        r.is_signed = true;
    } else if constexpr (T == Q5_1) {
        __m256i hi = _mm256_and_si256(bits32(b + 4), _mm256_set1_epi8(0x10));
        r.q = _mm256_or_si256(nibbles32(b + 8), hi);
        r.scale = _mm256_set1_ps(fp16(b));
        r.min = -fp16(b + 2);
        r.is_signed = false;
    } else if constexpr (T == Q4_K || T == Q5_K) {
        const float d = fp16(b), dmin = fp16(b + 2);
        const uint8_t* scales = b + 4;
        const uint8_t* qs = b + (T == Q4_K ? 16 : 48);
        int sc, m;
        scale_min_k4(s, scales, &sc, &m);
        __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (s / 2)));
        if (s & 1) raw = _mm256_srli_epi16(raw, 4);
        __m256i q = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
        if constexpr (T == Q5_K) {
            __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
            __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(0x01));
            q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
        }
        r.q = q;
        r.scale = _mm256_set1_ps(d * sc);
        r.min = dmin * m;
        r.is_signed = false;
    } else if constexpr (T == Q6_K) {
        const uint8_t* ql = b + 64 * (s / 4);
        const uint8_t* qh = b + 128 + 32 * (s / 4);
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * (s / 4);
        const int quarter = s % 4;
        __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * (quarter & 1)));
        if (quarter >= 2) lo = _mm256_srli_epi16(lo, 4);
        lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
        __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
        h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * quarter), _mm256_set1_epi8(0x03));
        __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(h, 4));
        r.q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
        const float d = fp16(b + 208);
        const float s0 = d * sc[2 * quarter], s1 = d * sc[2 * quarter + 1];
        r.scale = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
        r.is_signed = true;
    }
    return r;
}

// int32 lanes of sum(u[i] * s[i]) over groups of 4 bytes: u unsigned, s signed.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#ifdef MIMO_ISA_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Activations quantized per block of 32: int8 quants, float scale, and scale * sum(quants)
// (for the weight types with a min).
struct QAct {
    const int8_t* q;
    const float* d;
    const float* dsum;
    int64_t K;
};

constexpr int MT = 8;   // activation rows per tile

// out[m * ldo + n] for rows n of one weight row range and NM activation rows (a compile-time
// count, so that the accumulators stay in registers).
template <int T, int NM>
void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QAct* a,
              float* out, int64_t ldo) {
    constexpr int mt = NM;
    const int subs = block_elems(T) / 32;
    const int bb = block_bytes(T);
    const int64_t nblocks = a[0].K / block_elems(T);
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        __m256 acc[MT];
        float macc[MT];
        for (int m = 0; m < mt; ++m) { acc[m] = _mm256_setzero_ps(); macc[m] = 0.f; }
        for (int64_t ib = 0; ib < nblocks; ++ib) {
            const uint8_t* blk = row + ib * bb;
            for (int s = 0; s < subs; ++s) {
                const Sub sub = load_sub<T>(blk, s);
                const int64_t j = ib * subs + s;          // 32-element block index
                const __m256i uq = sub.is_signed ? _mm256_sign_epi8(sub.q, sub.q) : sub.q;
                for (int m = 0; m < mt; ++m) {
                    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[m].q + 32 * j));
                    if (sub.is_signed) x = _mm256_sign_epi8(x, sub.q);
                    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(uq, x));
                    acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(sub.scale, _mm256_set1_ps(a[m].d[j])), p, acc[m]);
                    if (!sub.is_signed) macc[m] += sub.min * a[m].dsum[j];
                }
            }
        }
        for (int m = 0; m < mt; ++m) out[m * ldo + n] = hsum(acc[m]) - macc[m];
    }
}

#ifdef MIMO_ISA_VNNI
// Q8_0 two blocks at a time in 512-bit registers: the head (most of a decode step's bytes)
// and every batched step over it do half the dot, convert and scale instructions. AVX-512
// has no vpsignb: the activation is negated under the weight's sign mask instead.
inline __m512 halves(float lo, float hi) {   // [lo x8, hi x8], AVX-512F only (no DQ)
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)),
                                               _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
}

template <int NM>
void dot_rows_q8_0_512(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                       const QAct* a, float* out, int64_t ldo) {
    const int64_t nb = a[0].K / 32;
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        __m512 acc[NM];
        for (int m = 0; m < NM; ++m) acc[m] = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 2 <= nb; j += 2) {
            const uint8_t* b0 = row + 34 * j;
            const __m512i q = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))),
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 36)), 1);
            const __mmask64 neg = _mm512_movepi8_mask(q);
            const __m512i uq = _mm512_abs_epi8(q);
            const __m512 dw = halves(fp16(b0), fp16(b0 + 34));
            for (int m = 0; m < NM; ++m) {
                __m512i x = _mm512_loadu_si512(a[m].q + 32 * j);
                x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), uq, x));
                const __m512 dx = halves(a[m].d[j], a[m].d[j + 1]);
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), p, acc[m]);
            }
        }
        float tail[NM] = {};
        if (j < nb) {                                   // an odd last block
            const Sub sub = load_sub<Q8_0>(row + 34 * j, 0);
            const __m256i uq = _mm256_sign_epi8(sub.q, sub.q);
            for (int m = 0; m < NM; ++m) {
                __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[m].q + 32 * j));
                x = _mm256_sign_epi8(x, sub.q);
                const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(uq, x));
                tail[m] = hsum(_mm256_mul_ps(_mm256_mul_ps(sub.scale, _mm256_set1_ps(a[m].d[j])), p));
            }
        }
        for (int m = 0; m < NM; ++m) out[m * ldo + n] = _mm512_reduce_add_ps(acc[m]) + tail[m];
    }
}
#endif

using RowsFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const QAct*, float*, int64_t);
struct DotFn {
    RowsFn by_rows[MT + 1];    // by the number of activation rows, 1..MT
};

template <int T>
DotFn make_dot() {
    return DotFn{{nullptr, dot_rows<T, 1>, dot_rows<T, 2>, dot_rows<T, 3>, dot_rows<T, 4>,
                  dot_rows<T, 5>, dot_rows<T, 6>, dot_rows<T, 7>, dot_rows<T, 8>}};
}

DotFn dot_fn(int t) {
#ifdef MIMO_ISA_VNNI
    if (t == Q8_0)
        return DotFn{{nullptr, dot_rows_q8_0_512<1>, dot_rows_q8_0_512<2>, dot_rows_q8_0_512<3>,
                      dot_rows_q8_0_512<4>, dot_rows_q8_0_512<5>, dot_rows_q8_0_512<6>,
                      dot_rows_q8_0_512<7>, dot_rows_q8_0_512<8>}};
#endif
    switch (t) {
        case Q4_0: return make_dot<Q4_0>(); case Q4_1: return make_dot<Q4_1>();
        case Q5_0: return make_dot<Q5_0>(); case Q5_1: return make_dot<Q5_1>();
        case Q8_0: return make_dot<Q8_0>(); case Q4_K: return make_dot<Q4_K>();
        case Q5_K: return make_dot<Q5_K>(); case Q6_K: return make_dot<Q6_K>();
    }
    TORCH_CHECK(false, "unsupported GGML type ", t);
}

// Quantize rows of x [M, K] (float32, K a multiple of 32).
struct Quantized {
    torch::Tensor q, d, dsum;
    std::vector<QAct> acts;
};

Quantized quantize_rows(const torch::Tensor& x) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "activations must be a contiguous float32 [M, K] tensor");
    const int64_t M = x.size(0), K = x.size(1);
    TORCH_CHECK(K % 32 == 0, "K must be a multiple of 32, got ", K);
    Quantized r;
    r.q = torch::empty({M, K}, torch::kInt8);
    r.d = torch::empty({M, K / 32}, torch::kFloat32);
    r.dsum = torch::empty({M, K / 32}, torch::kFloat32);
    const float* xp = x.data_ptr<float>();
    int8_t* qp = r.q.data_ptr<int8_t>();
    float* dp = r.d.data_ptr<float>();
    float* sp = r.dsum.data_ptr<float>();
    at::parallel_for(0, M * (K / 32), 256, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            const float* v = xp + 32 * b;
            __m256 amax = _mm256_setzero_ps();
            const __m256 sign = _mm256_set1_ps(-0.0f);
            for (int i = 0; i < 32; i += 8)
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float am = _mm_cvtss_f32(m4);
            const float d = am / 127.f;
            const float id = am > 0.f ? 127.f / am : 0.f;
            int sum = 0;
            for (int i = 0; i < 32; i += 8) {
                __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(id)));
                alignas(32) int32_t t[8];
                _mm256_store_si256(reinterpret_cast<__m256i*>(t), qi);
                for (int k = 0; k < 8; ++k) { qp[32 * b + i + k] = static_cast<int8_t>(t[k]); sum += t[k]; }
            }
            dp[b] = d;
            sp[b] = d * static_cast<float>(sum);
        }
    });
    r.acts.resize(M);
    for (int64_t m = 0; m < M; ++m)
        r.acts[m] = QAct{qp + m * K, dp + m * (K / 32), sp + m * (K / 32), K};
    return r;
}

void check_weight(const torch::Tensor& w, int64_t qtype, int64_t K) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
                "weights must be contiguous uint8 [N, row_bytes] GGUF blocks");
    const int bb = block_bytes(static_cast<int>(qtype));
    TORCH_CHECK(bb > 0, "unsupported GGML type ", qtype);
    TORCH_CHECK(K % block_elems(static_cast<int>(qtype)) == 0 && w.size(1) == K / block_elems(qtype) * bb,
                "weight rows of ", w.size(1), " bytes do not hold K=", K, " elements of type ", qtype);
}

// Rows [n0, n1) of every activation row, tiled by MT activation rows.
void run_rows(const DotFn& f, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1,
              const std::vector<QAct>& acts, float* out, int64_t ldo) {
    const int64_t M = static_cast<int64_t>(acts.size());
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
        const int mt = static_cast<int>(std::min<int64_t>(MT, M - m0));
        f.by_rows[mt](w, rb, n0, n1, acts.data() + m0, out + m0 * ldo, ldo);
    }
}

}  // namespace

// y [M, sum(N_i)] = x [M, K] @ concat_i(W_i)^T, each W_i in its own GGUF type.
torch::Tensor qlinear(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                      const std::vector<int64_t>& qtypes) {
    TORCH_CHECK(ws.size() == qtypes.size() && !ws.empty(), "one GGML type per weight part");
    const int64_t K = x.size(1), M = x.size(0);
    int64_t N = 0;
    for (size_t i = 0; i < ws.size(); ++i) { check_weight(ws[i], qtypes[i], K); N += ws[i].size(0); }
    Quantized qa = quantize_rows(x);
    torch::Tensor y = torch::empty({M, N}, torch::kFloat32);
    float* yp = y.data_ptr<float>();
    int64_t col = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
        DotFn f = dot_fn(static_cast<int>(qtypes[i]));
        const uint8_t* w = ws[i].data_ptr<uint8_t>();
        const int64_t rb = ws[i].size(1), n = ws[i].size(0);
        float* out = yp + col;
        at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
            run_rows(f, w, rb, n0, n1, qa.acts, out, N);
        });
        col += n;
    }
    return y;
}

// The k best columns of x @ W^T per row (scores descending, ties to the lower index),
// without writing the [M, N] scores: each chunk of weight rows keeps its own candidates.
std::vector<torch::Tensor> qtopk(const torch::Tensor& x, const torch::Tensor& w, int64_t qtype,
                                 int64_t k) {
    const int64_t K = x.size(1), M = x.size(0), N = w.size(0);
    check_weight(w, qtype, K);
    TORCH_CHECK(k >= 1 && k <= N, "k must lie in [1, N]");
    Quantized qa = quantize_rows(x);
    DotFn f = dot_fn(static_cast<int>(qtype));
    const uint8_t* wp = w.data_ptr<uint8_t>();
    const int64_t rb = w.size(1);
    constexpr int64_t CH = 256;                       // weight rows scored per pass
    const int64_t chunks = (N + CH - 1) / CH;
    const int64_t groups = std::min<int64_t>(chunks, 4 * at::get_num_threads());
    // candidates[g][m]: (score, index) pairs, at most k, of group g
    std::vector<std::vector<std::vector<std::pair<float, int64_t>>>> cand(
        groups, std::vector<std::vector<std::pair<float, int64_t>>>(M));
    auto better = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
        std::vector<float> buf(M * CH);
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t c0 = chunks * g / groups, c1 = chunks * (g + 1) / groups;
            auto& mine = cand[g];
            for (int64_t c = c0; c < c1; ++c) {
                const int64_t n0 = c * CH, n1 = std::min(N, n0 + CH);
                run_rows(f, wp + n0 * rb, rb, 0, n1 - n0, qa.acts, buf.data(), CH);
                for (int64_t m = 0; m < M; ++m) {
                    auto& h = mine[m];
                    for (int64_t n = 0; n < n1 - n0; ++n) {
                        std::pair<float, int64_t> e{buf[m * CH + n], n0 + n};
                        if (static_cast<int64_t>(h.size()) < k) {
                            h.push_back(e);
                            std::push_heap(h.begin(), h.end(), better);   // worst on top
                        } else if (better(e, h.front())) {
                            std::pop_heap(h.begin(), h.end(), better);
                            h.back() = e;
                            std::push_heap(h.begin(), h.end(), better);
                        }
                    }
                }
            }
        }
    });
    torch::Tensor vals = torch::empty({M, k}, torch::kFloat32);
    torch::Tensor idx = torch::empty({M, k}, torch::kInt64);
    for (int64_t m = 0; m < M; ++m) {
        std::vector<std::pair<float, int64_t>> all;
        for (int64_t g = 0; g < groups; ++g) all.insert(all.end(), cand[g][m].begin(), cand[g][m].end());
        std::partial_sort(all.begin(), all.begin() + k, all.end(), better);
        for (int64_t i = 0; i < k; ++i) {
            vals[m][i] = all[i].first;
            idx[m][i] = all[i].second;
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
    m.def("qlinear", &qlinear, "x @ concat(W_i)^T with GGUF-block weights");
    m.def("qtopk", &qtopk, "top-k columns of x @ W^T per row, scores never written");
    m.def("quantize_q8", &quantize_q8, "activations -> int8 blocks of 32 and their scales");
    m.def("paged_decode_attention", &paged_decode_attention,
          "one query per sequence over paged KV read in place (GQA, sinks)");
    m.def("isa", &isa, "the instruction set this build was compiled for");
}
