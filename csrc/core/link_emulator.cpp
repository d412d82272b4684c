#include "core/link_emulator.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/clock.h"

namespace pipert {

LinkTable::LinkTable(int num_ranks, LinkParams default_params)
    : n_(num_ranks),
      params_(static_cast<size_t>(num_ranks) * static_cast<size_t>(num_ranks), default_params),
      free_at_(static_cast<size_t>(num_ranks) * static_cast<size_t>(num_ranks), 0) {
  if (num_ranks <= 0) throw std::invalid_argument("LinkEmulator needs at least one rank");
}

size_t LinkTable::index(int src, int dst) const {
  if (src < 0 || src >= n_ || dst < 0 || dst >= n_)
    throw std::out_of_range("link " + std::to_string(src) + "->" + std::to_string(dst) +
                            " outside " + std::to_string(n_) + " ranks");
  return static_cast<size_t>(src) * static_cast<size_t>(n_) + static_cast<size_t>(dst);
}

void LinkTable::set_link(int src, int dst, LinkParams params) {
  if (params.latency_ns < 0 || params.per_message_ns < 0 || !(params.bandwidth > 0))
    throw std::invalid_argument("link latency and per-message time must be >= 0, bandwidth > 0");
  std::lock_guard<std::mutex> g(m_);
  params_[index(src, dst)] = params;
}

LinkParams LinkTable::link(int src, int dst) const {
  std::lock_guard<std::mutex> g(m_);
  return params_[index(src, dst)];
}

int64_t LinkTable::free_at(int src, int dst) const {
  std::lock_guard<std::mutex> g(m_);
  return free_at_[index(src, dst)];
}

void LinkTable::reset() {
  std::lock_guard<std::mutex> g(m_);
  for (auto& f : free_at_) f = 0;
}

LinkTiming LinkTable::schedule(int src, int dst, double nbytes, int64_t ready_ns) {
  std::lock_guard<std::mutex> g(m_);
  const size_t i = index(src, dst);
  const LinkParams& p = params_[i];
  LinkTiming t = link_schedule(free_at_[i], ready_ns, p.per_message_ns + occupancy_ns(nbytes, p.bandwidth),
                               p.latency_ns);
  free_at_[i] = t.free_at;
  return t;
}

LinkEmulator::LinkEmulator(int num_ranks, LinkParams default_params)
    : table_(std::make_shared<LinkTable>(num_ranks, default_params)) {}

LinkEmulator::~LinkEmulator() {
  if (timer_) timer_->close();
}

Timer& LinkEmulator::timer() {
  std::lock_guard<std::mutex> g(timer_m_);
  if (!timer_) timer_ = std::make_unique<Timer>();
  return *timer_;
}

LinkTiming LinkEmulator::deliver(int src, int dst, double nbytes, int64_t ready_ns,
                                 std::function<void()> fn) {
  LinkTiming t = schedule(src, dst, nbytes, ready_ns);
  timer().at(t.arrive, std::move(fn));
  return t;
}

void LinkEmulator::drain() {
  Timer* t;
  {
    std::lock_guard<std::mutex> g(timer_m_);
    t = timer_.get();
  }
  if (t) t->drain();
}

std::string LinkEmulator::timer_error() const {
  std::lock_guard<std::mutex> g(timer_m_);
  return timer_ ? timer_->error() : std::string();
}

std::shared_ptr<Transfer> LinkEmulator::enqueue_transfer(Stream& send, Stream& recv, int src, int dst,
                                                         double nbytes, std::function<void()> copy,
                                                         bool rendezvous) {
  (void)table_->index(src, dst);  // validate before enqueuing anything
  if (send.closed() || recv.closed())  // one side alone would leave the other waiting
    throw std::runtime_error("transfer on a closed stream");
  auto tr = std::make_shared<Transfer>();
  // Both sides are built first and submitted in one go each (one wake-up per stream).
  Stream::Batch s, r;
  if (rendezvous) s.wait(r.mark());  // ready once the recv is posted too
  s.enqueue([table = table_, tr, src, dst, nbytes, copy = std::move(copy)] {
    // Ready at the stream's ideal time: overhead of earlier items does not delay it.
    LinkTiming t = table->schedule(src, dst, nbytes, stream_ideal_now());
    tr->depart.store(t.depart);
    tr->free_at.store(t.free_at);
    tr->arrive->store(t.arrive, std::memory_order_release);
    sleep_until_ns(t.depart);
    if (copy) copy();
    stream_ideal_done(t.depart);
  });
  // The receiver waits for the data (copied), which is due at depart, not for the end
  // of the occupancy: so a receiver that keeps up never blocks on a condition variable
  // between messages, only sleeps to each arrival.
  SignalPtr copied = s.mark();
  s.enqueue([tr] {
    const int64_t f = tr->free_at.load();
    sleep_until_ns(f);
    stream_ideal_done(f);
  });
  tr->sent = s.mark();
  r.wait(copied);
  r.delay_until_cell(tr->arrive);
  tr->arrived = r.mark();
  recv.submit(std::move(r));
  send.submit(std::move(s));
  return tr;
}

}  // namespace pipert
