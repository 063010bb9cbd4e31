// QProduct and QActs (qproduct.h): the weights' checks and the dispatch of a run of weight
// rows to the build's kernels, shared by qlinear, qgemm, qtopk and the fused decode layer.
#include "qproduct.h"

#include <algorithm>

namespace mimo_q {

void check_weight(const torch::Tensor& w, int64_t qtype, int64_t K) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
                "weights must be contiguous uint8 [N, row_bytes] GGUF blocks");
    const int t = static_cast<int>(qtype);
    const int bb = block_bytes(t);
    TORCH_CHECK(bb > 0, "unsupported GGML type ", qtype);
    TORCH_CHECK(K % block_elems(t) == 0 && w.size(1) == K / block_elems(t) * bb,
                "weight rows of ", w.size(1), " bytes do not hold K=", K, " elements of type ", qtype);
    TORCH_CHECK(!is_x8(t) || w.size(0) % 8 == 0,
                "a repacked weight needs a multiple of 8 rows");
}

void run_rows(int t, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const QAct* a,
              int64_t M, float* out, int64_t ldo) {
    if (!rows_x8(t, w, rb, n0, n1, a, M, out, ldo) &&
        !tiles512(t, w, rb, n0, n1, a, M, out, ldo) &&
        !tiles256(t, w, rb, n0, n1, a, M, out, ldo))
        rows256(t, w, rb, n0, n1, a, M, out, ldo);
}

QProduct::QProduct(std::vector<torch::Tensor> ws, std::vector<int64_t> qtypes, int64_t K)
    : ws_(std::move(ws)), types_(std::move(qtypes)), K_(K) {
    TORCH_CHECK(ws_.size() == types_.size() && !ws_.empty(), "one GGML type per weight part");
    for (size_t i = 0; i < ws_.size(); ++i) {
        check_weight(ws_[i], types_[i], K);
        col_.push_back(col_.back() + ws_[i].size(0));
        first_tile_.push_back(first_tile_.back() + (ws_[i].size(0) + TILE - 1) / TILE);
    }
}

void QProduct::run(const QAct* a, int64_t M, int64_t t0, int64_t t1, float* y) const {
    const int64_t N = col_.back();
    for (size_t i = 0; i < ws_.size(); ++i) {
        const int64_t p0 = std::max(t0, first_tile_[i]), p1 = std::min(t1, first_tile_[i + 1]);
        if (p0 >= p1) continue;
        const int64_t n = ws_[i].size(0);
        const int64_t n0 = (p0 - first_tile_[i]) * TILE, n1 = std::min(n, (p1 - first_tile_[i]) * TILE);
        run_rows(static_cast<int>(types_[i]), ws_[i].data_ptr<uint8_t>(), ws_[i].size(1), n0, n1,
                 a, M, y + col_[i], N);
    }
}

QProduct::Tile QProduct::tile(int64_t t) const {
    const size_t i = std::upper_bound(first_tile_.begin(), first_tile_.end(), t)
                     - first_tile_.begin() - 1;
    const int64_t n0 = (t - first_tile_[i]) * TILE;
    return {i, n0, std::min(ws_[i].size(0), n0 + TILE), col_[i]};
}

std::pair<int64_t, int64_t> QProduct::columns(int64_t t0, int64_t t1) const {
    auto col = [&](int64_t t) {     // the first column of tile t (N for t = tiles())
        if (t >= tiles()) return N();
        const Tile r = tile(t);
        return r.col + r.n0;
    };
    return {col(t0), col(t1)};
}

const QAct* QActs::quantize(const float* x, int64_t M, int64_t K) {
    const int64_t nb = M * (K / 32);
    if (static_cast<int64_t>(q_.size()) < M * K) q_.resize(M * K);
    if (static_cast<int64_t>(d_.size()) < nb) {
        d_.resize(nb);
        dsum_.resize(nb);
        isum16_.resize(2 * nb);
    }
    for (int64_t b = 0; b < nb; ++b)
        quantize_block(x + 32 * b, q_.data() + 32 * b, d_.data() + b, dsum_.data() + b,
                       isum16_.data() + 2 * b);
    rows_.resize(M);
    for (int64_t m = 0; m < M; ++m)
        rows_[m] = QAct{q_.data() + m * K, d_.data() + m * (K / 32), dsum_.data() + m * (K / 32),
                        isum16_.data() + m * (K / 16), K};
    return rows_.data();
}

}  // namespace mimo_q
