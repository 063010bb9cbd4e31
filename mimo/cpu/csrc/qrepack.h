// The 8-row tiles' layouts: GGUF Q5_0, Q8_0, Q4_K and Q6_K weights repacked so that a tile's
// 32-element sub-block loads already transposed, one int32 lane per weight row (register k,
// byte 4r+e = row r's element 4k+e). The AVX2 build's decode otherwise spends most of a
// block gathering each row's bits and transposing (qtile256.cpp) or on one row at a time
// with a float step per sub-block (qkernels.cpp); llama.cpp repacks its AVX2 weights for
// the same reason. qrepack256.cpp multiplies these layouts; qrepack_io.cpp writes them from
// the GGUF's blocks and reads them back. No torch headers.
//
// Tile g is rows 8g..8g+7, bytes [8g rb, 8g rb + 8 rb) of the repacked tensor (rb: its
// row bytes); its block i starts at BLOCK * i. Offsets inside a tile's block:
//
// Q5_0 (22 bytes a row-block, as the GGUF's):
//   [0, 16)     the rows' fp16 scales
//   [16, 48)    fifth bits: byte 4r+e, bit k = that of row r's element 4k+e
//   [48, 176)   nibbles: register i = 0..3, byte 4r+e = row r's nibble of element 4i+e |
//               that of element 4(i+4)+e << 4
// Q8_0 (34 bytes a row-block, as the GGUF's):
//   [0, 16)     the rows' fp16 scales
//   [16, 272)   quants: register k = 0..7, byte 4r+e = row r's int8 quant of element 4k+e
// Q4_K (148 bytes a row-block against the GGUF's 144: the 6-bit scales unpacked):
//   [0, 16)     the rows' fp16 d; [16, 32) their fp16 dmin
//   [32, 96)    byte 8s+r: row r's scale of sub-block s; [96, 160) the same for the mins
//   [160, 1184) per pair p of sub-blocks, 8 registers: sub-block 2p's nibble | 2p+1's << 4
// Q6_K (210 bytes a row-block, as the GGUF's):
//   [0, 16)     the rows' fp16 d
//   [16, 144)   byte 8i+r: row r's int8 scale of elements 16i..16i+15
//   [144, 1168) per pair p of sub-blocks, 8 registers: the low nibbles, as Q4_K's
//   [1168, 1680) per group h of 4 sub-blocks, 8 registers: sub-block 4h+q's high 2 bits << 2q
#pragma once
#include <cstdint>

#include "qcommon.h"

namespace mimo_q::x8 {

constexpr int64_t ROWS = 8;

template <int T> struct Layout;
// Sizes from qcommon.h's block_bytes, which the products' checks read too.
template <int T, int G> struct Sizes {
    static constexpr int GGUF_BYTES = block_bytes(G), ROW_BYTES = block_bytes(T);
    static constexpr int BLOCK = ROWS * ROW_BYTES;
};
template <> struct Layout<Q5_0X8> : Sizes<Q5_0X8, Q5_0> {
    static constexpr int SCALES = 0, BITS = 16, NIBBLES = 48;
};
template <> struct Layout<Q8_0X8> : Sizes<Q8_0X8, Q8_0> {
    static constexpr int SCALES = 0, QUANTS = 16;
};
template <> struct Layout<Q4_KX8> : Sizes<Q4_KX8, Q4_K> {
    static constexpr int D = 0, DMIN = 16, SC = 32, MINS = 96, NIBBLES = 160;
};
template <> struct Layout<Q6_KX8> : Sizes<Q6_KX8, Q6_K> {
    static constexpr int D = 0, SC = 16, NIBBLES = 144, HIGH = 1168;
};
static_assert(Layout<Q5_0X8>::BLOCK == 176 && Layout<Q8_0X8>::BLOCK == 272 && Layout<Q4_KX8>::BLOCK == 1184 &&
              Layout<Q6_KX8>::BLOCK == 1680, "the offsets above assume these block sizes");

// The repacked type of a GGML type, 0 where it has none.
constexpr int repacked(int ggml) {
    return ggml == Q5_0 ? Q5_0X8 : ggml == Q8_0 ? Q8_0X8 : ggml == Q4_K ? Q4_KX8 : ggml == Q6_K ? Q6_KX8 : 0;
}

}  // namespace mimo_q::x8
