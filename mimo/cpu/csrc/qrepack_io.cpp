// The 8-row tiles' layouts (qrepack.h) written from the GGUF's blocks and read back: the
// repack runs once at start-up; its inverse serves the reference path (dequantize) and
// select_rows. Plain scalar code: each output byte is an OR of bits placed by the layout.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "qrepack.h"
#include "kernels.h"

namespace mimo_q {
namespace {

using namespace x8;

// Q5_0 element e of a GGUF block: its nibble and fifth bit.
inline int nibble5(const uint8_t* blk, int e) { return e < 16 ? blk[6 + e] & 15 : blk[6 + e - 16] >> 4; }
inline int bit5(const uint8_t* blk, int e) {
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    return (qh >> e) & 1;
}

// Byte of register k (element 4k+e of a sub-block) for row r.
inline int lane(int r, int e) { return 32 * (e / 4) + 4 * r + e % 4; }

// Q4_K's 12 scale bytes <-> the 8 sub-blocks' 6-bit scales and mins (ggml's get_scale_min_k4).
void scales_of(const uint8_t* q, uint8_t* sc, uint8_t* m) {
    for (int j = 0; j < 8; ++j) {
        sc[j] = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m[j] = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

void scales_to(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
    for (int j = 0; j < 4; ++j) {
        q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

// Q6_K element e of sub-block s: where its low nibble and high 2 bits lie in a GGUF block.
inline uint8_t* q6_low(uint8_t* blk, int s, int e) { return blk + 64 * (s / 4) + 32 * (s % 2) + e; }
inline uint8_t* q6_high(uint8_t* blk, int s, int e) { return blk + 128 + 32 * (s / 4) + e; }
inline int q6_low_shift(int s) { return 4 * ((s % 4) >= 2); }

// One row r's GGUF block `blk` into its tile's block `d` (zeroed before), or back (`back`:
// `blk` zeroed before, `d` read).
template <int T>
void move(uint8_t* blk, uint8_t* d, int r, bool back) {
    using L = Layout<T>;
    auto put = [&](uint8_t* p, int v, int shift) { *p |= static_cast<uint8_t>(v << shift); };
    auto get = [](const uint8_t* p, int shift, int mask) { return (*p >> shift) & mask; };
    if constexpr (T == Q5_0X8) {
        if (!back) {
            std::memcpy(d + L::SCALES + 2 * r, blk, 2);
            for (int e = 0; e < 32; ++e) {
                put(d + L::BITS + 4 * r + e % 4, bit5(blk, e), e / 4);
                put(d + L::NIBBLES + lane(r, e % 16), nibble5(blk, e), e >= 16 ? 4 : 0);
            }
            return;
        }
        std::memcpy(blk, d + L::SCALES + 2 * r, 2);
        uint32_t qh = 0;
        for (int e = 0; e < 32; ++e) {
            qh |= static_cast<uint32_t>(get(d + L::BITS + 4 * r + e % 4, e / 4, 1)) << e;
            const int n = get(d + L::NIBBLES + lane(r, e % 16), e >= 16 ? 4 : 0, 15);
            put(blk + 6 + e % 16, n, e < 16 ? 0 : 4);
        }
        std::memcpy(blk + 2, &qh, 4);
    } else if constexpr (T == Q8_0X8) {
        if (!back) std::memcpy(d + L::SCALES + 2 * r, blk, 2); else std::memcpy(blk, d + L::SCALES + 2 * r, 2);
        for (int e = 0; e < 32; ++e) {
            if (!back) d[L::QUANTS + lane(r, e)] = blk[2 + e]; else blk[2 + e] = d[L::QUANTS + lane(r, e)];
        }
    } else if constexpr (T == Q4_KX8) {
        uint8_t sc[8], m[8];
        if (!back) {
            std::memcpy(d + L::D + 2 * r, blk, 2);
            std::memcpy(d + L::DMIN + 2 * r, blk + 2, 2);
            scales_of(blk + 4, sc, m);
        } else {
            std::memcpy(blk, d + L::D + 2 * r, 2);
            std::memcpy(blk + 2, d + L::DMIN + 2 * r, 2);
        }
        for (int s = 0; s < 8; ++s) {
            uint8_t* dsc = d + L::SC + 8 * s + r;
            uint8_t* dmn = d + L::MINS + 8 * s + r;
            if (!back) { *dsc = sc[s]; *dmn = m[s]; } else { sc[s] = *dsc; m[s] = *dmn; }
            for (int e = 0; e < 32; ++e) {
                uint8_t* g = blk + 16 + 32 * (s / 2) + e;           // GGUF: pairs share a byte
                uint8_t* t = d + L::NIBBLES + 256 * (s / 2) + lane(r, e);
                if (!back) put(t, get(g, 4 * (s & 1), 15), 4 * (s & 1));
                else put(g, get(t, 4 * (s & 1), 15), 4 * (s & 1));
            }
        }
        if (back) scales_to(sc, m, blk + 4);
    } else {
        uint8_t* gd = blk + 208;
        uint8_t* gsc = blk + 192;
        if (!back) std::memcpy(d + L::D + 2 * r, gd, 2); else std::memcpy(gd, d + L::D + 2 * r, 2);
        for (int i = 0; i < 16; ++i) {
            if (!back) d[L::SC + 8 * i + r] = gsc[i]; else gsc[i] = d[L::SC + 8 * i + r];
        }
        for (int s = 0; s < 8; ++s)
            for (int e = 0; e < 32; ++e) {
                uint8_t* lo = q6_low(blk, s, e);
                uint8_t* hi = q6_high(blk, s, e);
                uint8_t* tl = d + L::NIBBLES + 256 * (s / 2) + lane(r, e);
                uint8_t* th = d + L::HIGH + 256 * (s / 4) + lane(r, e);
                if (!back) {
                    put(tl, get(lo, q6_low_shift(s), 15), 4 * (s & 1));
                    put(th, get(hi, 2 * (s % 4), 3), 2 * (s % 4));
                } else {
                    put(lo, get(tl, 4 * (s & 1), 15), q6_low_shift(s));
                    put(hi, get(th, 2 * (s % 4), 3), 2 * (s % 4));
                }
            }
    }
}

// Every (tile, block) of `src` into `dst` (zeroed), in either direction.
template <int T>
void convert(const torch::Tensor& src, torch::Tensor& dst, bool back) {
    using L = Layout<T>;
    const torch::Tensor& gguf = back ? dst : src;
    const torch::Tensor& tiles = back ? src : dst;
    const int64_t N = src.size(0), nb = gguf.size(1) / L::GGUF_BYTES;
    const int64_t grb = gguf.size(1), trb = tiles.size(1);
    uint8_t* g0 = static_cast<uint8_t*>(gguf.data_ptr());
    uint8_t* t0 = static_cast<uint8_t*>(tiles.data_ptr());
    at::parallel_for(0, N / ROWS * nb, 64, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t g = i / nb, j = i % nb;
            for (int r = 0; r < ROWS; ++r)
                move<T>(g0 + (g * ROWS + r) * grb + L::GGUF_BYTES * j, t0 + g * ROWS * trb + L::BLOCK * j, r, back);
        }
    });
}

void check_rows8(const torch::Tensor& w, int64_t bytes) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
                "weights must be contiguous uint8 [N, row_bytes] blocks");
    TORCH_CHECK(w.size(0) % ROWS == 0, "a repacked weight needs a multiple of 8 rows, got ", w.size(0));
    TORCH_CHECK(w.size(1) % bytes == 0, "rows of ", w.size(1), " bytes are not whole blocks");
}

template <int T>
torch::Tensor run(const torch::Tensor& w, bool back) {
    using L = Layout<T>;
    check_rows8(w, back ? L::ROW_BYTES : L::GGUF_BYTES);
    const int64_t nb = w.size(1) / (back ? L::ROW_BYTES : L::GGUF_BYTES);
    torch::Tensor out = torch::zeros({w.size(0), nb * (back ? L::GGUF_BYTES : L::ROW_BYTES)}, torch::kUInt8);
    convert<T>(w, out, back);
    return out;
}

torch::Tensor dispatch(const torch::Tensor& w, int64_t qtype, bool back) {
    switch (repacked(static_cast<int>(qtype))) {
        case Q5_0X8: return run<Q5_0X8>(w, back);
        case Q8_0X8: return run<Q8_0X8>(w, back);
        case Q4_KX8: return run<Q4_KX8>(w, back);
        case Q6_KX8: return run<Q6_KX8>(w, back);
    }
    TORCH_CHECK(false, "no repacked layout for GGML type ", qtype);
    return {};
}

}  // namespace
}  // namespace mimo_q

torch::Tensor repack_x8(const torch::Tensor& w, int64_t qtype) { return mimo_q::dispatch(w, qtype, false); }
torch::Tensor unpack_x8(const torch::Tensor& p, int64_t qtype) { return mimo_q::dispatch(p, qtype, true); }
