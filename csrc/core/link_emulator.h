// Delay injection for directed links on the CPU.
//
// Invariants
// - Each directed link (src, dst) keeps one free_at; schedule() is the only writer
//   and applies link_schedule() under the emulator's mutex, so messages on a link
//   depart in the order schedule() is called for them (FIFO).
// - deliver() runs its callback on the timer thread at the arrival deadline.
// - enqueue_transfer() never blocks the host: it only enqueues stream items.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "core/link_math.h"
#include "core/stream.h"
#include "core/timer.h"

namespace pipert {

struct LinkParams {
  int64_t latency_ns = 0;
  double bandwidth = std::numeric_limits<double>::infinity();  // bytes per second
  int64_t per_message_ns = 0;  // fixed occupancy of every message
};

// Timing of one transfer, filled in by the send stream when it schedules the
// message (arrive != 0 from then on); the three fields are stored before arrive.
struct Transfer {
  std::atomic<int64_t> depart{0};
  std::atomic<int64_t> free_at{0};
  std::shared_ptr<std::atomic<int64_t>> arrive = std::make_shared<std::atomic<int64_t>>(0);
  SignalPtr sent;     // completes when the send side is done (link occupancy over)
  SignalPtr arrived;  // completes on the recv stream at the arrival deadline
};

// Per-link parameters and free_at; shared with in-flight stream items so that
// they stay valid even if the emulator object goes away first.
class LinkTable {
 public:
  LinkTable(int num_ranks, LinkParams default_params);
  int num_ranks() const { return n_; }
  size_t index(int src, int dst) const;  // throws std::out_of_range
  void set_link(int src, int dst, LinkParams params);
  LinkParams link(int src, int dst) const;
  int64_t free_at(int src, int dst) const;
  void reset();
  LinkTiming schedule(int src, int dst, double nbytes, int64_t ready_ns);

 private:
  const int n_;
  mutable std::mutex m_;
  std::vector<LinkParams> params_;
  std::vector<int64_t> free_at_;
};

class LinkEmulator {
 public:
  LinkEmulator(int num_ranks, LinkParams default_params);
  virtual ~LinkEmulator();

  int num_ranks() const { return table_->num_ranks(); }
  void set_link(int src, int dst, LinkParams params) { table_->set_link(src, dst, params); }
  LinkParams link(int src, int dst) const { return table_->link(src, dst); }
  int64_t free_at(int src, int dst) const { return table_->free_at(src, dst); }
  void reset() { table_->reset(); }  // every link free from time 0

  // Deadline math only: updates the link's free_at and returns the timing.
  LinkTiming schedule(int src, int dst, double nbytes, int64_t ready_ns) {
    return table_->schedule(src, dst, nbytes, ready_ns);
  }

  // Timer path: fn runs on the timer thread at the arrival deadline.
  LinkTiming deliver(int src, int dst, double nbytes, int64_t ready_ns, std::function<void()> fn);
  void drain();  // host waits until every deliver() callback ran
  std::string timer_error() const;

  // Stream path. With rendezvous, the message is ready when the send stream
  // reaches it and the recv stream has posted it (reached it too). The send stream
  // then waits for depart, runs copy (may be empty), and is busy until free_at;
  // the recv stream waits for the copy, then until arrive (>= free_at).
  std::shared_ptr<Transfer> enqueue_transfer(Stream& send, Stream& recv, int src, int dst,
                                             double nbytes, std::function<void()> copy,
                                             bool rendezvous = true);

 private:
  Timer& timer();

  std::shared_ptr<LinkTable> table_;
  mutable std::mutex timer_m_;
  std::unique_ptr<Timer> timer_;  // created on first deliver()
};

}  // namespace pipert
