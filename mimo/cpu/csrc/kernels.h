// The C++ interface of the kernels other sources of this extension call (qkernels.cpp,
// attention.cpp, decode_attention.cpp, prefill_attention.cpp, elementwise.cpp): declarations
// only, the signatures those files define and export.
#pragma once
#include <torch/extension.h>
#include <memory>
#include <string>
#include <vector>

// y [M, sum(N_i)] float32 = x [M, K] (contiguous float32) @ concat_i(W_i)^T, GGUF blocks.
torch::Tensor qlinear(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                      const std::vector<int64_t>& qtypes);

// GGUF blocks of `qtype` (Q5_0, Q4_K or Q6_K) [N, rb], N a multiple of 8, in the 8-row
// tiles' layout (type ids 106, 112, 114: qrepack.h), and back (qrepack_io.cpp).
torch::Tensor repack_x8(const torch::Tensor& w, int64_t qtype);
torch::Tensor unpack_x8(const torch::Tensor& p, int64_t qtype);

// q [B, Hq, D] float32 over the paged caches [S, Hkv, D] / [S, Hkv, Dv]: float32 [B, Hq, Dv].
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& slots,
                                     const torch::Tensor& lens, double scale,
                                     const torch::Tensor& sinks);

// The same by KV head, split along the keys (decode_attention.cpp); `round`: the softmax
// weights rounded to bfloat16 before the values, as the plain bfloat16 layer rounds them.
// At most DECODE_MAX_REP query heads per KV head (bound to Python as `max_rep`).
constexpr int64_t DECODE_MAX_REP = 16;
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                               const torch::Tensor& v_cache, const torch::Tensor& slots,
                               const torch::Tensor& lens, double scale,
                               const torch::Tensor& sinks, bool round);

// A prefill chunk q [n, Hq, D] bf16 over the span's keys (slots [L], query i sees keys
// (offset + i - window, offset + i]; window 0: all up to it): [n, Hq, Dv], written into
// `out` (float32 or bf16, contiguous) or, where out is empty, a new float32 tensor.
torch::Tensor prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                const torch::Tensor& v_cache, const torch::Tensor& slots,
                                int64_t offset, int64_t window, double scale,
                                const torch::Tensor& sinks, const torch::Tensor& out);
bool prefill_attention_ok();   // this build has it and the CPU runs it (AVX512-BF16)
// The same on oneDNN's brgemm (AMX tiles); prefill_attention_amx_ok: this build has it and
// torch's brgemm runs bf16 here.
torch::Tensor prefill_attention_amx(const torch::Tensor& q, const torch::Tensor& k_cache,
                                    const torch::Tensor& v_cache, const torch::Tensor& slots,
                                    int64_t offset, int64_t window, double scale,
                                    const torch::Tensor& sinks, const torch::Tensor& out);
bool prefill_attention_amx_ok();
// prefill_attention_amx for every prefill span of a step in one call: `spans` [S, 5] int64
// rows (row0, n, slot0, L, offset): queries q[row0, row0 + n) (q [T, Hq, D]) over keys
// slots[slot0, slot0 + L), written to the same rows of `out` [T, Hq, Dv] (float32 or bf16);
// other rows of out are left as they are.
void prefill_attention_amx_spans(const torch::Tensor& q, const torch::Tensor& k_cache,
                                 const torch::Tensor& v_cache, const torch::Tensor& slots,
                                 const torch::Tensor& spans, int64_t window, double scale,
                                 const torch::Tensor& sinks, torch::Tensor out);

// Refuses (naming `name`) anything but a contiguous 2-D bfloat16 or float32 CPU tensor.
void check_rows(const torch::Tensor& x, const char* name);
// x [R, n] (bf16 or f32) * rsqrt(mean(x^2) + eps) * scale[r % scale_rows], in x's dtype.
torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& scale, double eps);
// act(gate) * up of gu [T, 2I] in gu's dtype, each rounded to it as the plain layer rounds.
torch::Tensor act_mul_rows(const torch::Tensor& gu, const std::string& act);

// RMSNorm (per-head scale [heads, d]; empty: none) then rotate-half RoPE of the first
// heads * d columns of qkv [T, C], tables cos/sin [T, d] in its dtype: [T, heads, d].
torch::Tensor qk_norm_rope_rows(const torch::Tensor& qkv, int64_t heads, int64_t d,
                                const torch::Tensor& scale, double eps, const torch::Tensor& cos,
                                const torch::Tensor& sin);
// x [T, n] float32 + rms_norm(h, w1) (w1 empty: h itself), and rms_norm(that sum, w2) (w2
// empty: not computed, an empty tensor): {sum, normed}, the sum float32, normed float32 or,
// with y_bf16, rounded to bfloat16 (what the next bf16 matmul reads).
std::vector<torch::Tensor> add_rms_norm_rows(const torch::Tensor& x, const torch::Tensor& h,
                                             const torch::Tensor& w1, const torch::Tensor& w2,
                                             double eps, bool y_bf16);

// cache[slots[i]] = src[i] (rows: the first dim; src's rows each one contiguous block).
void write_rows(torch::Tensor& cache, const torch::Tensor& slots, const torch::Tensor& src);

// dequant.cpp: GGUF blocks (src[i], contiguous uint8) of GGML type qtypes[i] -> out[i]
// (contiguous float32 or bfloat16, as many values), on a thread of its own that starts at
// once; `wait` joins it (and raises its error). The handle keeps every tensor alive until
// then. `dequant_type`: whether a GGML type has a decoder here.
class DequantHandle {
public:
    explicit DequantHandle(std::shared_ptr<void> state) : state_(std::move(state)) {}
    DequantHandle(DequantHandle&&) = default;
    DequantHandle(const DequantHandle&) = delete;
    DequantHandle& operator=(const DequantHandle&) = delete;
    ~DequantHandle();
    void wait();
private:
    std::shared_ptr<void> state_;
};
DequantHandle start_dequantize(std::vector<torch::Tensor> src, std::vector<int64_t> qtypes,
                               std::vector<torch::Tensor> out);
bool dequant_type(int64_t qtype);
