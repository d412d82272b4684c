#include "core/clock.h"

#include <thread>

#if defined(__linux__)
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace pipert {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

void sleep_until_ns(int64_t deadline_ns, int64_t spin_ns) {
  if (spin_ns < 0) {
    const int64_t adaptive = kMinSpinNs + (deadline_ns - now_ns()) / 32;
    spin_ns = adaptive < kMaxSpinNs ? adaptive : kMaxSpinNs;
  }
  const int64_t coarse = deadline_ns - spin_ns;
  if (now_ns() < coarse) {
#if defined(__linux__)
    timespec ts{static_cast<time_t>(coarse / 1'000'000'000), static_cast<long>(coarse % 1'000'000'000)};
    // CLOCK_MONOTONIC is steady_clock's clock; retry on signal interruption.
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0) {
    }
#else
    std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(coarse)));
#endif
  }
  // Spin phase: yield the core while more than a few microseconds are left, so that
  // a busy machine does not see a thread hogging a core (and preempt it for a whole
  // time slice); pause-spin only at the very end.
  for (int64_t left = deadline_ns - now_ns(); left > 0; left = deadline_ns - now_ns()) {
    if (left > kYieldUntilNs) {
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
  }
}

void use_precise_timer_slack() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}

void set_thread_priority(int priority) {
#if defined(__linux__)
  if (priority < 0) {
    const int nice = priority * 5 < -20 ? -20 : priority * 5;
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice);
  }
#else
  (void)priority;
#endif
}

}  // namespace pipert
