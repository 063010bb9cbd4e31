// Elementwise ops of the plain layers on CPU (prefill-sized steps above all), in the
// activation dtype (bfloat16 or float32) and parallel over rows: one pass each where torch's bfloat16 path makes several (rms_norm: a
// float32 copy, the square, the mean, rsqrt, two products and the cast back; the gated MLP:
// the activation, then its product with up, each written out).
//
// The plain layers are the reference and these round where they round: the norm in float32
// ((x * rrms) * w) rounded once to the dtype; the activation rounded to the dtype, then its
// product with up rounded again. They differ from torch only by the order of the float32
// sum of squares and by a few ulp of tanh/exp before rounding.
#include "kernels.h"
#include "rows_io.h"
#include "vec_math.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>

namespace {

using mimo_vec::act8;
using mimo_rows::as_dtype;
using mimo_rows::load8;
#ifdef __AVX512F__
using mimo_rows::load16;
using mimo_rows::store16;
#endif
using mimo_rows::one_lane;
using mimo_rows::store8;
using mimo_rows::tail_load;
using mimo_rows::tail_store;

template <typename T>
void rms_rows(const T* x, const float* scale, int64_t scale_rows, T* y, int64_t rows,
              int64_t n, float eps) {
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* xr = x + r * n;
            const float* w = scale + (r % scale_rows) * n;
            T* yr = y + r * n;
            mimo_rows::norm_row(xr, w, n, eps, false, yr);
        }
    });
}

template <typename T>
void act_rows(const T* gu, T* m, int64_t rows, int64_t I, bool gelu, bool bf16) {
    at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* g = gu + r * 2 * I;
            const T* u = g + I;
            T* mr = m + r * I;
            int64_t i = 0;
#ifdef __AVX512F__
            // 16 lanes where the build has them: the same operations per element as below.
            for (; i + 16 <= I; i += 16) {
                store16(mr + i, _mm512_mul_ps(as_dtype(mimo_vec::act16(load16(g + i), gelu), bf16),
                                              load16(u + i)));
            }
#endif
            for (; i + 8 <= I; i += 8)
                store8(mr + i, _mm256_mul_ps(as_dtype(act8(load8(g + i), gelu), bf16), load8(u + i)));
            for (; i < I; ++i)
                tail_store(mr + i, _mm256_mul_ps(as_dtype(act8(one_lane(tail_load(g + i)), gelu), bf16),
                                                 one_lane(tail_load(u + i))));
        }
    });
}


}  // namespace

void check_rows(const torch::Tensor& x, const char* name) {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && !x.is_cuda() &&
                (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat32),
                name, " must be a contiguous 2-D bfloat16 or float32 CPU tensor");
}

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& scale, double eps) {
    check_rows(x, "x");
    TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() &&
                scale.dim() >= 1 && scale.size(-1) == x.size(1),
                "scale must be contiguous float32 [..., n] with n = x's columns");
    const int64_t sr = scale.numel() / x.size(1);
    TORCH_CHECK(sr > 0 && x.size(0) % sr == 0, "rows must be a multiple of the scale's rows");
    torch::Tensor y = torch::empty_like(x);
    const float e = static_cast<float>(eps);
    if (x.scalar_type() == torch::kBFloat16)
        rms_rows(x.data_ptr<at::BFloat16>(), scale.data_ptr<float>(), sr,
                 y.data_ptr<at::BFloat16>(), x.size(0), x.size(1), e);
    else
        rms_rows(x.data_ptr<float>(), scale.data_ptr<float>(), sr, y.data_ptr<float>(),
                 x.size(0), x.size(1), e);
    return y;
}

torch::Tensor act_mul_rows(const torch::Tensor& gu, const std::string& act) {
    check_rows(gu, "gu");
    TORCH_CHECK(gu.size(1) % 2 == 0, "gu must be [T, 2I] (gate columns, then up)");
    TORCH_CHECK(act == "gelu_tanh" || act == "silu", "activation must be gelu_tanh or silu");
    const int64_t I = gu.size(1) / 2;
    torch::Tensor m = torch::empty({gu.size(0), I}, gu.options());
    const bool gelu = act == "gelu_tanh";
    if (gu.scalar_type() == torch::kBFloat16)
        act_rows(gu.data_ptr<at::BFloat16>(), m.data_ptr<at::BFloat16>(), gu.size(0), I, gelu, true);
    else
        act_rows(gu.data_ptr<float>(), m.data_ptr<float>(), gu.size(0), I, gelu, false);
    return m;
}
