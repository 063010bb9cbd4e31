// AMX-INT8 for the 512-bit tiles (qtile512.cpp): whether this process uses the tile unit, the
// tiles' configuration for one call, and the hand-back afterwards. VNNI build only.
//
// The tile configuration is per thread and shared with oneDNN, whose primitives load their
// own and whose brgemm (torch's `cpublas::brgemm`: the prefill attention's, the CPU flash
// kernel's) may keep one loaded until its caller calls `brgemm_release`. So every call here
// loads its own, and when done releases the tiles and resets torch's brgemm too.
#pragma once
#include <immintrin.h>
#include <cstdint>

namespace mimo_q {
namespace amx {

// Activation rows a call takes to the tile unit: chunks of 16 only. Each sub-block's tile
// round trip costs the same for 2 rows as for 16, and below 16 the vector dots were as fast
// or faster (measured in docs/cpu_kernels.md).
constexpr int ROWS = 16;

struct Scratch {              // one sub-block's transposed weights and the products' integers
    alignas(64) int8_t b[8 * 64];
    alignas(64) int32_t c[2 * 16 * 16];
};

bool usable();                // the CPU has AMX-TILE and AMX-INT8 and the OS lets us use them
bool on();                    // usable and not switched off (set_enabled)
bool set_enabled(bool yes);   // returns on()

// Tiles for M activation rows: A in 0 (and 1 for the halves of HALVES types), the weights'
// sub-block in 2 (and 3), the integer products in 4 (and 5).
#ifdef __AMX_TILE__
inline void configure(int M, bool halves) {
    struct alignas(64) Config {
        uint8_t palette = 1, start_row = 0, reserved[14] = {};
        uint16_t colsb[16] = {};
        uint8_t rows[16] = {};
    } c;
    auto set = [&](int t, int rows, int colsb) {
        c.rows[t] = static_cast<uint8_t>(rows);
        c.colsb[t] = static_cast<uint16_t>(colsb);
    };
    if (halves) {
        set(0, M, 16); set(1, M, 16); set(2, 4, 64); set(3, 4, 64); set(4, M, 64); set(5, M, 64);
    } else {
        set(0, M, 32); set(2, 8, 64); set(4, M, 64);
    }
    // Not _tile_loadconfig: GCC 12's tells the compiler it reads 8 bytes of the 64, and the
    // rows and widths written above were dropped as dead stores (then every tile load faults).
    __asm__ volatile("ldtilecfg %0" : : "m"(c));
}
#endif

void release();               // the tiles released, torch's brgemm told to configure anew

}  // namespace amx
}  // namespace mimo_q
