#include "core/timer.h"

#include <chrono>

#include "core/clock.h"

namespace pipert {

Timer::Timer() { worker_ = std::thread([this] { run(); }); }

Timer::~Timer() { close(); }

void Timer::at(int64_t deadline_ns, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> g(m_);
    heap_.push(Item{deadline_ns, seq_++, std::move(fn)});
  }
  cv_.notify_one();
}

size_t Timer::pending() const {
  std::lock_guard<std::mutex> g(m_);
  return heap_.size() + (running_item_ ? 1 : 0);
}

void Timer::drain() {
  std::unique_lock<std::mutex> g(m_);
  idle_cv_.wait(g, [this] { return heap_.empty() && !running_item_; });
}

void Timer::close() {
  {
    std::lock_guard<std::mutex> g(m_);
    closing_ = true;
  }
  cv_.notify_one();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

std::string Timer::error() const {
  std::lock_guard<std::mutex> g(m_);
  return error_;
}

void Timer::run() {
  use_precise_timer_slack();
  set_thread_priority(-5);
  std::unique_lock<std::mutex> g(m_);
  for (;;) {
    if (heap_.empty()) {
      if (closing_) return;
      cv_.wait(g, [this] { return closing_ || !heap_.empty(); });
      continue;
    }
    const int64_t deadline = heap_.top().deadline;
    const int64_t coarse = deadline - kMaxSpinNs;  // then sleep_until_ns does the rest
    if (now_ns() < coarse) {
      // Wakes early when an earlier item arrives; re-examines the top then.
      cv_.wait_until(g, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(coarse)));
      continue;
    }
    g.unlock();
    sleep_until_ns(deadline);  // spin phase, without the lock
    g.lock();
    // The top may have changed to an earlier (already due) item: run the top.
    Item item = heap_.top();
    if (item.deadline > now_ns()) continue;
    heap_.pop();
    running_item_ = true;
    g.unlock();
    try {
      item.fn();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> eg(m_);
      if (error_.empty()) error_ = e.what();
    } catch (...) {
      std::lock_guard<std::mutex> eg(m_);
      if (error_.empty()) error_ = "unknown error";
    }
    item.fn = nullptr;
    g.lock();
    running_item_ = false;
    if (heap_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace pipert
