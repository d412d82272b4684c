// CPU streams: one worker thread per stream runs its work items in FIFO order.
// Events are completion signals recorded into a stream (CUDA event semantics).
//
// Invariants
// - A stream runs items strictly in enqueue order, one at a time.
// - Nothing here blocks the host except Stream::synchronize, Event::synchronize
//   and Signal::wait; stream-side waits block only the waiting stream's worker.
// - Errors are sticky per stream: after an item throws, later items are skipped,
//   but markers still complete (carrying the error), so no waiter hangs.
// - Ideal clock: each stream keeps the time its last item would have ended without
//   emulation overhead (thread wake-ups, queue hand-offs). An item starts, ideally,
//   at max(previous item's ideal end, its enqueue time). Delays, spins and transfers
//   count from the ideal start, so timed items do not accumulate overhead; any other
//   work ends, ideally, when it really ends; a wait ends, ideally, at the ideal time
//   of the record it waited for. Always: ideal time <= real time. Event times are
//   real times (when the worker reached the record).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pipert {

// Ideal start of the item running on the calling stream worker (now_ns() on any
// other thread), and how a timed item reports its ideal end.
int64_t stream_ideal_now();
void stream_ideal_done(int64_t t_ns);

// Set once; observed by any number of waiters.
class Signal {
 public:
  void complete(int64_t t_ns, const std::string& error, int64_t ideal_ns = -1);  // -1: = t_ns
  void wait() const;
  bool query() const;
  int64_t time_ns() const;   // completion time; 0 while pending
  int64_t ideal_ns() const;  // ideal completion time (<= time_ns); 0 while pending
  std::string error() const;

 private:
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  int64_t t_ns_ = 0;
  int64_t ideal_ns_ = 0;
  std::string error_;
};
using SignalPtr = std::shared_ptr<Signal>;

class Stream;

// Handle to its most recent record. record() replaces the signal; wait, query and
// synchronize use the signal current at call time. Never recorded = complete.
class Event {
 public:
  void record(Stream& stream);
  void set_signal(SignalPtr signal);
  SignalPtr signal() const;
  bool query() const;
  void synchronize() const;  // throws std::runtime_error with the stream's error
  int64_t time_ns() const;   // completion time of the current record; 0 if pending/never
  int64_t ideal_ns() const;  // ideal completion time of the current record; 0 if pending/never

 private:
  mutable std::mutex m_;
  SignalPtr sig_;
};

// Reuses Event objects (on the CPU they are cheap; the pool exists so that the
// executor has one event API for CPU and CUDA).
class EventPool {
 public:
  std::shared_ptr<Event> acquire();
  void release(std::shared_ptr<Event> event);
  size_t created() const { return created_; }
  size_t free_count() const;

 private:
  mutable std::mutex m_;
  std::vector<std::shared_ptr<Event>> free_;
  size_t created_ = 0;
};

class Stream {
 public:
  using Task = std::function<void()>;
  struct Item {
    Task fn;            // empty for markers
    SignalPtr sig;      // set for markers
    int64_t stamp = 0;  // enqueue time
  };

  // Items built off the stream and submitted at once (one lock, one wake-up):
  // what a transfer enqueues on each side.
  class Batch {
   public:
    void enqueue(Task fn) { items_.push_back(Item{std::move(fn), nullptr}); }
    SignalPtr mark();
    void wait(SignalPtr signal);  // as Stream::wait
    void delay_until_cell(std::shared_ptr<std::atomic<int64_t>> deadline);

   private:
    friend class Stream;
    std::vector<Item> items_;
  };

  explicit Stream(std::string name = "stream", int priority = 0);
  virtual ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void enqueue(Task fn);
  void enqueue_delay_ns(int64_t ns);             // from when the stream reaches it
  void enqueue_delay_until_ns(int64_t deadline);  // absolute, steady clock
  // Deadline read when the stream reaches the item (written by earlier work).
  void enqueue_delay_until_cell(std::shared_ptr<std::atomic<int64_t>> deadline);
  void enqueue_copy(void* dst, const void* src, size_t nbytes);
  void enqueue_spin_ns(int64_t ns);  // busy for ns: stands in for compute

  SignalPtr mark();          // a signal that completes when the stream reaches it
  void record(Event& event);
  void wait(const Event& event);
  void wait(SignalPtr signal);  // null = no-op

  void submit(Batch&& batch);  // the batch's items, in order, as if enqueued one by one

  void synchronize();  // host waits for all enqueued work; throws on sticky error
  bool query() const;  // all enqueued work done
  void close();        // drains the queue and joins the worker; idempotent

  bool closed() const;
  bool on_worker() const;  // called from this stream's own worker thread (inside one of its items)
  const std::string& name() const { return name_; }
  int priority() const { return priority_; }
  std::string error() const;

 private:
  void push(Item item);
  void run();

  const std::string name_;
  const int priority_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool closing_ = false;
  std::string error_;
  int64_t ideal_ = 0;  // worker only: ideal end of the last item
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> finished_{0};
  std::thread worker_;
};

}  // namespace pipert
