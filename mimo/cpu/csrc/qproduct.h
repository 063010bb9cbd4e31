// A product on GGUF blocks, y [M, N] = x [M, K] @ concat_i(W_i)^T, with its weights checked
// once and its work in one list of tiles of TILE weight rows (every part's, in order), any
// run of which one thread computes: qlinear splits that list over a parallel region, the
// fused decode layer (decode_layer.cpp) over a team already running. Each output is
// computed by the same code whoever runs its tile, so results do not depend on the split.
#pragma once
#include <torch/extension.h>
#include <algorithm>
#include <utility>
#include <vector>

#include "qcommon.h"

namespace mimo_q {

constexpr int64_t TILE = 16;          // weight rows per work item (the 512-bit tile's height)

// Refuses a weight that is not contiguous uint8 [N, row_bytes] blocks of qtype holding K.
void check_weight(const torch::Tensor& w, int64_t qtype, int64_t K);

// out[m * ldo + n] = row n of W . activation row m, for n in [n0, n1), m < M: the build's
// best path for the type (8-row tiles, 512-bit tiles, 256-bit tiles, rows).
void run_rows(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
              const QAct* a, int64_t M, float* out, int64_t ldo);

class QProduct {
public:
    QProduct() = default;
    QProduct(std::vector<torch::Tensor> ws, std::vector<int64_t> qtypes, int64_t K);
    int64_t K() const { return K_; }
    int64_t N() const { return col_.back(); }
    int64_t tiles() const { return first_tile_.back(); }
    // Tiles per run when `threads` take runs from a counter: 1/8 of an even share, so a
    // slower thread takes fewer.
    int64_t run_tiles(int64_t threads) const { return std::max<int64_t>(1, tiles() / (8 * threads)); }
    // y[m * N + n] for the rows n of tiles [t0, t1), against activation rows a[0, M).
    void run(const QAct* a, int64_t M, int64_t t0, int64_t t1, float* y) const;
    // The columns of y that tiles [t0, t1) write: one range (parts are concatenated).
    std::pair<int64_t, int64_t> columns(int64_t t0, int64_t t1) const;
    // Tile t < tiles(): its part (the index into the weights), its rows [n0, n1) of that
    // part, and the part's first column of y.
    struct Tile {
        size_t part;
        int64_t n0, n1, col;
    };
    Tile tile(int64_t t) const;

private:
    std::vector<torch::Tensor> ws_;
    std::vector<int64_t> types_, first_tile_{0}, col_{0};
    int64_t K_ = 0;
};

// Activation rows quantized per block of 32 (quantize_block), in buffers kept between calls:
// one QActs per thread that quantizes.
class QActs {
public:
    // x [M, K] float32 rows, K a multiple of 32 (checked by the caller) -> M QAct rows.
    const QAct* quantize(const float* x, int64_t M, int64_t K);

private:
    std::vector<int8_t> q_;
    std::vector<float> d_, dsum_;
    std::vector<int32_t> isum16_;
    std::vector<QAct> rows_;
};

}  // namespace mimo_q
