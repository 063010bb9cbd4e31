// GGUF blocks -> dense weights (float32 or bfloat16) on a thread of its own, without the
// GIL: start-up loads the tokenizer meanwhile, which holds the GIL for about a second, so
// the dense copies the Python decoders made after it are now made beside it.
//
// Each type's arithmetic is the `gguf` package's numpy code, op for op in float32 (as
// mimo/models/gguf_dequant.py's torch decoders, which tests hold to the package): products
// and differences rounded separately (no fused multiply-add: this file is compiled without
// contraction), then cast to bfloat16 as torch casts (round to nearest even).
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "kernels.h"

#pragma GCC optimize("fp-contract=off")

namespace {

enum : int64_t { F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                 Q6_K = 14, BF16 = 30 };

struct Layout { int64_t elems, bytes; };

Layout layout(int64_t t) {
    switch (t) {
        case F16: return {1, 2}; case BF16: return {1, 2};
        case Q4_0: return {32, 18}; case Q4_1: return {32, 20}; case Q5_0: return {32, 22};
        case Q5_1: return {32, 24}; case Q8_0: return {32, 34};
        case Q4_K: return {256, 144}; case Q5_K: return {256, 176}; case Q6_K: return {256, 210};
    }
    return {0, 0};
}

inline float f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (gguf_dequant._k_scales).
inline void k_scale(const uint8_t* s, int j, float* sc, float* mn) {
    if (j < 4) {
        *sc = float(s[j] & 63);
        *mn = float(s[4 + j] & 63);
    } else {
        *sc = float((s[4 + j] & 15) | ((s[j - 4] >> 2) & 0x30));
        *mn = float((s[4 + j] >> 4) | ((s[j] >> 2) & 0x30));
    }
}

// One block's values, in the package's order, into v.
void block(int64_t t, const uint8_t* b, float* v) {
    switch (t) {
        case F16: v[0] = f16(b); return;
        case BF16: {
            uint32_t u = uint32_t(b[0] | (b[1] << 8)) << 16;
            std::memcpy(v, &u, 4);
            return;
        }
        case Q4_0: case Q4_1: {
            const float d = f16(b), m = t == Q4_1 ? f16(b + 2) : 0.0f;
            const uint8_t* qs = b + (t == Q4_0 ? 2 : 4);
            for (int h = 0; h < 2; ++h) {          // low nibbles, then high ones
                if (t == Q4_0) {
                    for (int i = 0; i < 16; ++i) v[h * 16 + i] = d * float(((qs[i] >> (4 * h)) & 15) - 8);
                } else {
                    for (int i = 0; i < 16; ++i) v[h * 16 + i] = d * float((qs[i] >> (4 * h)) & 15) + m;
                }
            }
            return;
        }
        case Q5_0: case Q5_1: {
            const float d = f16(b), m = t == Q5_1 ? f16(b + 2) : 0.0f;
            const int lo = t == Q5_0 ? 6 : 8;
            uint32_t qh;
            std::memcpy(&qh, b + lo - 4, 4);          // bit i: value i's fifth bit
            for (int h = 0; h < 2; ++h) {
                for (int i = 0; i < 16; ++i) {
                    const int e = h * 16 + i;
                    const int q = ((b[lo + i] >> (4 * h)) & 15) | (int((qh >> e) & 1) << 4);
                    v[e] = t == Q5_0 ? d * float(q - 16) : d * float(q) + m;
                }
            }
            return;
        }
        case Q8_0: {
            const float d = f16(b);
            for (int i = 0; i < 32; ++i) v[i] = float(int8_t(b[2 + i])) * d;
            return;
        }
        case Q4_K: case Q5_K: {
            const float d = f16(b), dmin = f16(b + 2);
            const uint8_t* qs = b + (t == Q4_K ? 16 : 48);
            for (int j = 0; j < 8; ++j) {        // sub-blocks of 32: nibbles of 32 bytes
                float sc, mn;
                k_scale(b + 4, j, &sc, &mn);
                const float dl = d * sc, ml = dmin * mn;
                const uint8_t* g = qs + (j >> 1) * 32;
                for (int i = 0; i < 32; ++i) {
                    int q = (g[i] >> ((j & 1) * 4)) & 15;
                    if (t == Q5_K) q |= ((b[16 + i] >> j) & 1) << 4;
                    const float p = dl * float(q);
                    v[j * 32 + i] = p - ml;
                }
            }
            return;
        }
        case Q6_K: {
            const float d = f16(b + 208);
            for (int g = 0; g < 2; ++g) {            // halves of 128 values
                for (int s = 0; s < 4; ++s) {        // runs of 32: nibble (s / 2), qh bits 2s
                    const uint8_t* ql = b + g * 64 + (s & 1) * 32;
                    const uint8_t* qh = b + 128 + g * 32;
                    for (int half = 0; half < 2; ++half) {
                        const int e0 = g * 128 + s * 32 + half * 16;
                        const float dl = d * float(int8_t(b[192 + (e0 >> 4)]));
                        for (int i = 0; i < 16; ++i) {
                            const int j = half * 16 + i;
                            const int q = ((ql[j] >> (4 * (s >> 1))) & 15) | (((qh[j] >> (2 * s)) & 3) << 4);
                            v[e0 + i] = dl * float(q - 32);
                        }
                    }
                }
            }
            return;
        }
    }
}

// float32 -> bfloat16 bits as c10::BFloat16 rounds (to nearest even; NaN -> 0x7FC0), in a
// form the compiler vectorizes.
inline void to_bf16(const float* v, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, &v[i], 4);
        const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        out[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t(0x7FC0) : uint16_t(r);
    }
}

// `blocks` blocks from src into f32 (or, where it is null, bf16), a run of them at a time.
void decode(int64_t t, const uint8_t* src, int64_t blocks, float* f32, uint16_t* bf16) {
    const Layout l = layout(t);
    constexpr int64_t RUN = 4096;                     // float32 values per run (16 KiB)
    const int64_t per = std::max<int64_t>(1, RUN / l.elems);
    float v[RUN];
    for (int64_t k0 = 0; k0 < blocks; k0 += per) {
        const int64_t k1 = std::min(blocks, k0 + per);
        float* dst = f32 != nullptr ? f32 + k0 * l.elems : v;
        for (int64_t k = k0; k < k1; ++k) block(t, src + k * l.bytes, dst + (k - k0) * l.elems);
        if (f32 == nullptr) to_bf16(v, bf16 + k0 * l.elems, (k1 - k0) * l.elems);
    }
}

// The work of one `start_dequantize`: its thread, the tensors it reads and writes (held
// until it is joined), and the first error.
struct Dequantizer {
    std::vector<torch::Tensor> src, out;
    std::vector<int64_t> qtypes;
    std::thread thread;
    std::string error;

    void run() {
        try {
            for (size_t i = 0; i < src.size(); ++i) {
                const bool f32 = out[i].scalar_type() == torch::kFloat32;
                decode(qtypes[i], src[i].data_ptr<uint8_t>(),
                       src[i].numel() / layout(qtypes[i]).bytes,
                       f32 ? out[i].data_ptr<float>() : nullptr,
                       f32 ? nullptr : reinterpret_cast<uint16_t*>(out[i].data_ptr<c10::BFloat16>()));
            }
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
};

}  // namespace

bool dequant_type(int64_t qtype) { return layout(qtype).elems > 0; }

DequantHandle start_dequantize(std::vector<torch::Tensor> src, std::vector<int64_t> qtypes,
                               std::vector<torch::Tensor> out) {
    TORCH_CHECK(src.size() == qtypes.size() && src.size() == out.size(),
                "src, qtypes and out must be as long as each other");
    for (size_t i = 0; i < src.size(); ++i) {
        const Layout l = layout(qtypes[i]);
        TORCH_CHECK(l.elems > 0, "no decoder for GGML type ", qtypes[i]);
        TORCH_CHECK(src[i].scalar_type() == torch::kUInt8 && src[i].is_contiguous() &&
                    src[i].device().is_cpu(), "src must be contiguous uint8 CPU tensors");
        TORCH_CHECK((out[i].scalar_type() == torch::kFloat32 ||
                     out[i].scalar_type() == torch::kBFloat16) && out[i].is_contiguous() &&
                    out[i].device().is_cpu(), "out must be contiguous float32 or bfloat16 CPU tensors");
        TORCH_CHECK(src[i].numel() % l.bytes == 0 &&
                    src[i].numel() / l.bytes * l.elems == out[i].numel(),
                    "tensor ", i, ": ", src[i].numel(), " bytes of GGML type ", qtypes[i],
                    " are not ", out[i].numel(), " values");
    }
    auto d = std::make_shared<Dequantizer>();
    d->src = std::move(src);
    d->qtypes = std::move(qtypes);
    d->out = std::move(out);
    Dequantizer* raw = d.get();
    d->thread = std::thread([raw] { raw->run(); });
    return DequantHandle(std::move(d));
}

void DequantHandle::wait() {
    if (!state_) return;
    auto* d = static_cast<Dequantizer*>(state_.get());
    if (d->thread.joinable()) d->thread.join();
    const std::string error = d->error;
    state_.reset();
    TORCH_CHECK(error.empty(), "dequantizing failed: ", error);
}

DequantHandle::~DequantHandle() {
    if (state_) {                // never waited for: the thread still reads and writes
        auto* d = static_cast<Dequantizer*>(state_.get());
        if (d->thread.joinable()) d->thread.join();
    }
}
