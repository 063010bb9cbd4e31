// amx_tiles.h: the CPU and OS checks, the switch, the hand-back to torch's brgemm.
#include "amx_tiles.h"

#ifdef MIMO_ISA_VNNI
#include <ATen/native/CPUBlas.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>

namespace mimo_q {
namespace amx {
namespace {

bool probe() {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1))
        return false;                                  // AMX-TILE, AMX-INT8
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;   // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;     // XTILECFG, XTILEDATA enabled
    // Linux hands the tile data to a process that asks (ARCH_REQ_XCOMP_PERM, XTILEDATA);
    // asking again, or after oneDNN did, is harmless.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

std::atomic<bool> enabled{true};

}  // namespace

bool usable() {
    static const bool ok = probe();
    return ok;
}

bool on() { return enabled.load(std::memory_order_relaxed) && usable(); }

bool set_enabled(bool yes) {
    enabled.store(yes, std::memory_order_relaxed);
    return on();
}

void release() {
    _tile_release();
    at::native::cpublas::brgemm_release();
}

}  // namespace amx
}  // namespace mimo_q

#else

namespace mimo_q {
namespace amx {
bool usable() { return false; }
bool on() { return false; }
bool set_enabled(bool) { return false; }
void release() {}
}  // namespace amx
}  // namespace mimo_q

#endif
