// Link deadline math (FIFO occupancy, pipelining during latency) and the CPU
// delivery paths (timer callbacks, stream transfers with rendezvous).
#include <atomic>
#include <cstring>
#include <vector>

#include "core/clock.h"
#include "core/link_emulator.h"
#include "core/link_math.h"
#include "tests/check.h"

using namespace pipert;

static constexpr int64_t kMs = 1'000'000;

static void math_fifo_and_pipelining() {
  // 1 MB/ms = 1e9 B/s, latency 5 ms.
  LinkEmulator em(2, LinkParams{5 * kMs, 1e9});
  LinkTiming a = em.schedule(0, 1, 2e6, 0);  // occupies 2 ms
  CHECK(a.depart == 0 && a.free_at == 2 * kMs && a.arrive == 7 * kMs);
  LinkTiming b = em.schedule(0, 1, 1e6, 1 * kMs);  // ready while busy: waits
  CHECK(b.depart == 2 * kMs && b.free_at == 3 * kMs && b.arrive == 8 * kMs);
  CHECK(b.depart < a.arrive);  // in flight during a's latency
  LinkTiming c = em.schedule(0, 1, 1e6, 10 * kMs);  // link idle: departs when ready
  CHECK(c.depart == 10 * kMs && c.arrive == 16 * kMs);
  // The reverse direction is a separate link (full duplex).
  LinkTiming r = em.schedule(1, 0, 1e6, 0);
  CHECK(r.depart == 0);
  CHECK(em.free_at(0, 1) == 11 * kMs);
  em.reset();
  CHECK(em.free_at(0, 1) == 0);
}

static void math_per_pair_and_errors() {
  LinkEmulator em(3, LinkParams{});
  LinkTiming t = em.schedule(0, 2, 1e12, 7);  // infinite bandwidth, no latency
  CHECK(t.depart == 7 && t.arrive == 7);
  em.set_link(0, 2, LinkParams{kMs, 1e6});
  CHECK(em.link(0, 2).latency_ns == kMs);
  CHECK(em.link(2, 0).latency_ns == 0);
  t = em.schedule(0, 2, 1000, 100);  // 1 ms occupancy
  CHECK(t.free_at == 100 + kMs && t.arrive == 100 + 2 * kMs);
  CHECK(occupancy_ns(3, 2e9) == 2);  // 1.5 ns rounds to 2
  em.set_link(1, 2, LinkParams{kMs, 1e9, 2 * kMs});  // + 2 ms per message
  t = em.schedule(1, 2, 1e6, 0);
  CHECK(t.free_at == 3 * kMs && t.arrive == 4 * kMs);
  CHECK_THROWS(em.set_link(0, 1, LinkParams{0, 1.0, -1}));
  CHECK_THROWS(em.schedule(0, 3, 1, 0));
  CHECK_THROWS(em.set_link(0, 1, LinkParams{-1, 1.0}));
}

static bool deliver_fires_at_arrival() {
  LinkEmulator em(2, LinkParams{3 * kMs, 1e9});  // 1 MB = 1 ms occupancy
  std::vector<std::atomic<int64_t>> fired(3);
  std::vector<LinkTiming> timing;
  const int64_t t0 = now_ns();
  for (int i = 0; i < 3; ++i)
    timing.push_back(em.deliver(0, 1, 1e6, t0, [&fired, i] { fired[i] = now_ns(); }));
  em.drain();
  for (int i = 0; i < 3; ++i) {
    CHECK(timing[i].arrive == t0 + (i + 1) * kMs + 3 * kMs);
    CHECK(fired[i] >= timing[i].arrive);
    CHECK_SOON(fired[i] < timing[i].arrive + 5 * kMs);  // loose
  }
  return true;
}

static void stream_transfer_rendezvous_and_copy() {
  LinkEmulator em(2, LinkParams{4 * kMs, 1e9});
  Stream send("send"), recv("recv");
  std::vector<char> src(16, 'x'), dst(16, 0);
  // The receiver posts 10 ms late: the message departs only then.
  const int64_t t0 = now_ns();
  recv.enqueue_delay_ns(10 * kMs);
  auto tr = em.enqueue_transfer(send, recv, 0, 1, 2e6,
                                [&] { std::memcpy(dst.data(), src.data(), src.size()); });
  tr->arrived->wait();
  tr->sent->wait();
  CHECK(tr->depart >= t0 + 10 * kMs);
  CHECK(tr->free_at == tr->depart + 2 * kMs);
  CHECK(tr->arrive->load() == tr->free_at + 4 * kMs);
  CHECK(tr->sent->time_ns() >= tr->free_at);
  CHECK(tr->arrived->time_ns() >= tr->arrive->load());
  CHECK(dst[15] == 'x');
}

static bool stream_transfers_pipeline() {
  // k back-to-back messages: last arrival = first depart + k*occupancy + latency.
  LinkEmulator em(2, LinkParams{5 * kMs, 1e9});
  Stream send("send"), recv("recv");
  std::vector<std::shared_ptr<Transfer>> trs;
  for (int i = 0; i < 4; ++i) trs.push_back(em.enqueue_transfer(send, recv, 0, 1, 1e6, nullptr, false));
  recv.synchronize();
  for (int i = 1; i < 4; ++i) CHECK(trs[i]->depart >= trs[i - 1]->free_at);  // FIFO
  // each departs within 1 ms of its predecessor's occupancy end, i.e. during its latency
  for (int i = 1; i < 4; ++i) CHECK_SOON(trs[i]->depart < trs[i - 1]->arrive->load());
  const int64_t span = trs[3]->arrived->time_ns() - trs[0]->depart;
  CHECK(span >= 9 * kMs);
  CHECK_SOON(span < 9 * kMs + 5 * kMs);  // loose
  return true;
}

static void transfer_on_closed_stream_throws() {
  LinkEmulator em(2, LinkParams{});
  Stream send("send"), recv("recv");
  recv.close();
  CHECK_THROWS(em.enqueue_transfer(send, recv, 0, 1, 1.0, nullptr));
  CHECK(send.query());  // nothing was left half-enqueued on the open side
}

// The receiver side of a cross-process message: the arrival moved into its own clock.
static void math_read_at_clock_offset() {
  const pipert::LinkTiming t = pipert::link_schedule(0, 1000, 50, 400);
  CHECK(pipert::link_read_at(t.arrive, 0) == 1450);     // one clock
  CHECK(pipert::link_read_at(t.arrive, -300) == 1150);  // the receiver's clock is 300 ns behind
}

static void math_ideal_start() {
  // the later of the previous item's ideal end and the enqueue time, never after now
  CHECK(ideal_start(5 * kMs, 3 * kMs, 9 * kMs) == 5 * kMs);  // queued behind the previous item
  CHECK(ideal_start(2 * kMs, 3 * kMs, 9 * kMs) == 3 * kMs);  // enqueued after the stream went idle
  CHECK(ideal_start(12 * kMs, 3 * kMs, 9 * kMs) == 9 * kMs);  // clamped to now
  // back-to-back messages of one link from a chain: each departs when the previous one's
  // occupancy ends, however late its kernel (or worker) started
  int64_t ideal = 0, free_at = 0;
  for (int k = 0; k < 3; ++k) {
    const int64_t late_now = ideal + 4'000;  // 4 us of launch gap after the previous item
    const LinkTiming t = link_schedule(free_at, ideal_start(ideal, 0, late_now), kMs, 0);
    CHECK(t.depart == k * kMs);
    free_at = ideal = t.free_at;
  }
}

int main() {
  RUN(math_fifo_and_pipelining);
  RUN(math_ideal_start);
  RUN(math_per_pair_and_errors);
  RUN(math_read_at_clock_offset);
  RUN_TIMED(deliver_fires_at_arrival);
  RUN(stream_transfer_rendezvous_and_copy);
  RUN_TIMED(stream_transfers_pipeline);
  RUN(transfer_on_closed_stream_throws);
  return 0;
}
