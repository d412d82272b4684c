// Timer thread: callbacks run in deadline order (ties in submission order), never early.
#include <atomic>
#include <mutex>
#include <vector>

#include "core/clock.h"
#include "core/timer.h"
#include "tests/check.h"

using namespace pipert;

static void runs_in_deadline_order_never_early() {
  Timer t;
  std::mutex m;
  std::vector<std::pair<int, int64_t>> fired;  // (tag, time fired)
  const int64_t base = now_ns() + 20'000'000;
  const int64_t offsets[] = {30, 10, 20, 10, 0};  // ms; tags 0..4
  for (int i = 0; i < 5; ++i) {
    const int64_t dl = base + offsets[i] * 1'000'000;
    t.at(dl, [&, i] {
      std::lock_guard<std::mutex> g(m);
      fired.push_back({i, now_ns()});
    });
  }
  t.drain();
  CHECK(t.pending() == 0);
  CHECK(fired.size() == 5);
  const int expect[] = {4, 1, 3, 2, 0};  // by deadline, tie 1 before 3
  for (int k = 0; k < 5; ++k) {
    CHECK(fired[k].first == expect[k]);
    CHECK(fired[k].second >= base + offsets[expect[k]] * 1'000'000);
  }
}

static bool earlier_item_added_later_preempts() {
  Timer t;
  std::atomic<int64_t> late_fired{0}, early_fired{0};
  const int64_t now = now_ns();
  t.at(now + 100'000'000, [&] { late_fired = now_ns(); });
  t.at(now + 10'000'000, [&] { early_fired = now_ns(); });
  t.drain();
  CHECK(early_fired >= now + 10'000'000);
  CHECK_SOON(early_fired < now + 60'000'000);  // did not wait behind the later item
  CHECK(late_fired >= now + 100'000'000);
  return true;
}

static void callback_errors_are_kept() {
  Timer t;
  t.at(now_ns(), [] { throw std::runtime_error("late"); });
  t.drain();
  CHECK(t.error() == "late");
}

int main() {
  RUN(runs_in_deadline_order_never_early);
  RUN_TIMED(earlier_item_added_later_preempts);
  RUN(callback_errors_are_kept);
  return 0;
}
