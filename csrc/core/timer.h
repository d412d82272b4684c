// One thread that runs callbacks at absolute steady-clock deadlines.
// Invariants: callbacks run one at a time, earliest deadline first, ties in
// submission order, never before their deadline.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

namespace pipert {

class Timer {
 public:
  Timer();
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  void at(int64_t deadline_ns, std::function<void()> fn);
  size_t pending() const;
  void drain();  // host waits until nothing is pending
  void close();  // runs what is pending (at its deadline), then joins
  std::string error() const;  // first error thrown by a callback

 private:
  struct Item {
    int64_t deadline;
    uint64_t seq;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Item& a, const Item& b) const {
      return a.deadline != b.deadline ? a.deadline > b.deadline : a.seq > b.seq;
    }
  };
  void run();

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::priority_queue<Item, std::vector<Item>, Later> heap_;
  uint64_t seq_ = 0;
  bool running_item_ = false;
  bool closing_ = false;
  std::string error_;
  std::thread worker_;
};

}  // namespace pipert
