#include "core/stream.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "core/clock.h"
#include "core/link_math.h"

namespace pipert {

namespace {
// Set by Stream::run around each task; tls_in_stream is false on other threads.
thread_local bool tls_in_stream = false;
thread_local int64_t tls_ideal_start = 0;
thread_local int64_t tls_ideal_end = -1;
}  // namespace

int64_t stream_ideal_now() { return tls_in_stream ? tls_ideal_start : now_ns(); }

void stream_ideal_done(int64_t t_ns) {
  if (tls_in_stream) tls_ideal_end = t_ns;
}

// ---- Signal ----

void Signal::complete(int64_t t_ns, const std::string& error, int64_t ideal_ns) {
  {
    std::lock_guard<std::mutex> g(m_);
    if (done_) return;  // set once
    done_ = true;
    t_ns_ = t_ns;
    ideal_ns_ = ideal_ns < 0 ? t_ns : ideal_ns;
    error_ = error;
  }
  cv_.notify_all();
}

void Signal::wait() const {
  std::unique_lock<std::mutex> g(m_);
  cv_.wait(g, [this] { return done_; });
}

bool Signal::query() const {
  std::lock_guard<std::mutex> g(m_);
  return done_;
}

int64_t Signal::time_ns() const {
  std::lock_guard<std::mutex> g(m_);
  return done_ ? t_ns_ : 0;
}

int64_t Signal::ideal_ns() const {
  std::lock_guard<std::mutex> g(m_);
  return done_ ? ideal_ns_ : 0;
}

std::string Signal::error() const {
  std::lock_guard<std::mutex> g(m_);
  return error_;
}

// ---- Event ----

void Event::record(Stream& stream) { set_signal(stream.mark()); }

void Event::set_signal(SignalPtr signal) {
  std::lock_guard<std::mutex> g(m_);
  sig_ = std::move(signal);
}

SignalPtr Event::signal() const {
  std::lock_guard<std::mutex> g(m_);
  return sig_;
}

bool Event::query() const {
  SignalPtr s = signal();
  return !s || s->query();
}

void Event::synchronize() const {
  SignalPtr s = signal();
  if (!s) return;
  s->wait();
  std::string err = s->error();
  if (!err.empty()) throw std::runtime_error(err);
}

int64_t Event::time_ns() const {
  SignalPtr s = signal();
  return s ? s->time_ns() : 0;
}

int64_t Event::ideal_ns() const {
  SignalPtr s = signal();
  return s ? s->ideal_ns() : 0;
}

// ---- EventPool ----

std::shared_ptr<Event> EventPool::acquire() {
  std::lock_guard<std::mutex> g(m_);
  if (free_.empty()) {
    ++created_;
    return std::make_shared<Event>();
  }
  auto e = std::move(free_.back());
  free_.pop_back();
  e->set_signal(nullptr);  // a reused event starts as never recorded
  return e;
}

void EventPool::release(std::shared_ptr<Event> event) {
  if (!event) return;
  std::lock_guard<std::mutex> g(m_);
  free_.push_back(std::move(event));
}

size_t EventPool::free_count() const {
  std::lock_guard<std::mutex> g(m_);
  return free_.size();
}

// ---- Stream ----

Stream::Stream(std::string name, int priority) : name_(std::move(name)), priority_(priority) {
  worker_ = std::thread([this] { run(); });
}

Stream::~Stream() { close(); }

void Stream::push(Item item) {
  {
    std::lock_guard<std::mutex> g(m_);
    if (closing_) throw std::runtime_error("stream '" + name_ + "' is closed");
    enqueued_.fetch_add(1, std::memory_order_relaxed);
    item.stamp = now_ns();
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
}

void Stream::enqueue(Task fn) { push(Item{std::move(fn), nullptr}); }

namespace {
// Sleeps the stream until t (ideal end of the item).
void timed_until(int64_t t) {
  sleep_until_ns(t);
  stream_ideal_done(t);
}

Stream::Task delay_until_cell_task(std::shared_ptr<std::atomic<int64_t>> deadline) {
  return [deadline] { timed_until(std::max(stream_ideal_now(), deadline->load(std::memory_order_acquire))); };
}

Stream::Task wait_task(SignalPtr signal) {
  return [signal] {
    signal->wait();
    std::string err = signal->error();
    if (!err.empty()) throw std::runtime_error(err);  // errors propagate along waits
    stream_ideal_done(std::max(stream_ideal_now(), signal->ideal_ns()));
  };
}
}  // namespace

void Stream::enqueue_delay_ns(int64_t ns) {
  enqueue([ns] { timed_until(stream_ideal_now() + ns); });
}

void Stream::enqueue_delay_until_ns(int64_t deadline) {
  enqueue([deadline] { timed_until(std::max(stream_ideal_now(), deadline)); });
}

void Stream::enqueue_delay_until_cell(std::shared_ptr<std::atomic<int64_t>> deadline) {
  enqueue(delay_until_cell_task(std::move(deadline)));
}

SignalPtr Stream::Batch::mark() {
  auto s = std::make_shared<Signal>();
  items_.push_back(Item{Task(), s});
  return s;
}

void Stream::Batch::wait(SignalPtr signal) {
  if (signal) enqueue(wait_task(std::move(signal)));
}

void Stream::Batch::delay_until_cell(std::shared_ptr<std::atomic<int64_t>> deadline) {
  enqueue(delay_until_cell_task(std::move(deadline)));
}

void Stream::submit(Batch&& batch) {
  {
    std::lock_guard<std::mutex> g(m_);
    if (closing_) throw std::runtime_error("stream '" + name_ + "' is closed");
    const int64_t stamp = now_ns();
    for (Item& item : batch.items_) {
      item.stamp = stamp;
      queue_.push_back(std::move(item));
    }
    enqueued_.fetch_add(batch.items_.size(), std::memory_order_relaxed);
  }
  batch.items_.clear();
  cv_.notify_one();
}

void Stream::enqueue_copy(void* dst, const void* src, size_t nbytes) {
  enqueue([dst, src, nbytes] { std::memcpy(dst, src, nbytes); });
}

void Stream::enqueue_spin_ns(int64_t ns) {
  enqueue([ns] {
    const int64_t end = stream_ideal_now() + ns;
    sleep_until_ns(end, ns + 1);  // spin the whole time, no OS sleep
    stream_ideal_done(end);
  });
}

SignalPtr Stream::mark() {
  auto s = std::make_shared<Signal>();
  push(Item{Task(), s});
  return s;
}

void Stream::record(Event& event) { event.set_signal(mark()); }

void Stream::wait(const Event& event) { wait(event.signal()); }

void Stream::wait(SignalPtr signal) {
  if (signal) enqueue(wait_task(std::move(signal)));
}

void Stream::synchronize() {
  SignalPtr s = mark();
  s->wait();
  std::string err = s->error();
  if (!err.empty()) throw std::runtime_error(err);
}

bool Stream::query() const {
  return finished_.load(std::memory_order_acquire) == enqueued_.load(std::memory_order_acquire);
}

bool Stream::on_worker() const { return worker_.get_id() == std::this_thread::get_id(); }

bool Stream::closed() const {
  std::lock_guard<std::mutex> g(m_);
  return closing_;
}

std::string Stream::error() const {
  std::lock_guard<std::mutex> g(m_);
  return error_;
}

void Stream::close() {
  {
    std::lock_guard<std::mutex> g(m_);
    if (closing_ && !worker_.joinable()) return;
    closing_ = true;
  }
  cv_.notify_one();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void Stream::run() {
  use_precise_timer_slack();
  set_thread_priority(priority_);
  for (;;) {
    Item item;
    std::string err;
    {
      std::unique_lock<std::mutex> g(m_);
      cv_.wait(g, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      err = error_;
    }
    const int64_t t_pop = now_ns();  // when the stream reached the item
    const int64_t start = ideal_start(ideal_, item.stamp, t_pop);
    if (item.sig) {
      ideal_ = start;
      finished_.fetch_add(1, std::memory_order_release);  // before waking waiters: query() holds
      item.sig->complete(t_pop, err, start);
      continue;
    } else if (!err.empty()) {
      ideal_ = t_pop;  // skipped
    } else {
      tls_in_stream = true;
      tls_ideal_start = start;
      tls_ideal_end = -1;
      try {
        item.fn();
      } catch (abi::__forced_unwind&) {
        throw;  // the thread is being ended (pthread_exit, e.g. Python finalizing): let it end
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(m_);
        error_ = "stream '" + name_ + "': " + e.what();
      } catch (...) {
        std::lock_guard<std::mutex> g(m_);
        error_ = "stream '" + name_ + "': unknown error";
      }
      tls_in_stream = false;
      ideal_ = tls_ideal_end >= 0 ? tls_ideal_end : now_ns();
    }
    item = Item{};  // drop captured state before reporting completion
    finished_.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace pipert
