// Monotonic clock and precise sleeps shared by streams and timers.
// Invariant: every time in the core is int64 nanoseconds of std::chrono::steady_clock
// (CLOCK_MONOTONIC on Linux, the same clock as Python's time.perf_counter()).
#pragma once

#include <chrono>
#include <cstdint>

namespace pipert {

// Sleeps end with a spin of spin_ns before the deadline (the OS sleep covers the
// rest). Adaptive by default: 25 us + 1/32 of the wait, at most 100 us. Linux OS
// sleeps with 1 ns timer slack wake ~15-20 us late after short waits and ~40-60 us
// after waits of milliseconds (busy 2-core machine); a longer spin costs compute.
constexpr int64_t kMinSpinNs = 25'000;
constexpr int64_t kMaxSpinNs = 100'000;
// In the spin phase, the thread yields its core while more than this is left.
constexpr int64_t kYieldUntilNs = 5'000;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Returns at or after deadline_ns (never before): an OS sleep until
// deadline - spin, then a spin on the clock. spin_ns < 0: adaptive (above).
void sleep_until_ns(int64_t deadline_ns, int64_t spin_ns = -1);

// Makes the calling thread's OS sleeps wake closer to their target (Linux timer
// slack 1 ns instead of 50 us). No-op elsewhere.
void use_precise_timer_slack();

// Best effort: for priority < 0 (CUDA-style: lower is higher), nice value
// max(-20, 5 * priority) for the calling thread, so timing threads wake promptly on
// a busy machine. Silently keeps the default when not permitted.
void set_thread_priority(int priority);

}  // namespace pipert
