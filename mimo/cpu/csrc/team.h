// The threads of one OpenMP parallel region as a team running a sequence of steps: `sync`
// between steps (a barrier), `share` for a step's items taken in runs from a counter by
// whichever member asks next (a core slowed by other work takes fewer, as qmatmul.cpp's
// dynamic_for), `share_guided` the same with runs shrinking as the items run out. The
// fused decode layer runs a whole layer this way: a region per product and attention step
// (about six a layer), with serial work between them, cost about what the second core
// gained (docs/speed.md).
//
// Nothing inside a team may throw (an exception cannot leave an OpenMP region): check first.
#pragma once
#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cstdint>

struct Team {
    int id, size;
    void sync() const {
        if (size > 1) {
#pragma omp barrier
        }
    }
    // f(i0, i1) for runs [i0, i1) of at most `step` items of [0, n), counted on `next`
    // (zero before the step, one counter per step).
    template <typename F>
    void share(std::atomic<int64_t>& next, int64_t n, int64_t step, const F& f) const {
        for (int64_t i; (i = next.fetch_add(step, std::memory_order_relaxed)) < n;)
            f(i, std::min(n, i + step));
    }
    // f(i0, i1) for runs of [0, n) counted on `next` (zero before the step), each run
    // 1/size of the items left when it is taken, at least `least` (OpenMP's guided
    // schedule): a member's first run is long, later ones shorter, so a member slowed by
    // other work still takes less. A product's weights come cold from memory, and each new
    // run starts a new stream the prefetchers must find: with runs of 1/8 of a share the
    // 18 layers of a decode step took 0.4-0.7 ms longer (docs/speed.md).
    template <typename F>
    void share_guided(std::atomic<int64_t>& next, int64_t n, int64_t least, const F& f) const {
        int64_t i = next.load(std::memory_order_relaxed);
        while (i < n) {
            const int64_t step = std::max(least, (n - i + size - 1) / size);
            if (next.compare_exchange_weak(i, i + step, std::memory_order_relaxed)) {
                f(i, std::min(n, i + step));
                i = next.load(std::memory_order_relaxed);
            }
        }
    }
};

// f(team) on each of at most `threads` threads (one, inside another parallel region).
template <typename F>
void run_team(int threads, const F& f) {
#pragma omp parallel num_threads(threads)
    f(Team{omp_get_thread_num(), omp_get_num_threads()});
}
