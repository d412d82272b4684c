// Deadline arithmetic of one directed link, shared by the CPU emulator and the
// CUDA wait kernels (compiled for host and device).
//
// A message of b bytes that is ready at t on a link with bandwidth bw (bytes/s),
// a fixed per-message occupancy p and latency L, when the link is free from free_at
// (pipert.cost.LinkSpec is the same model):
//   occ     = p + b/bw
//   depart  = max(t, free_at)          FIFO: waits for the messages before it
//   free_at = depart + occ             the link is busy for the occupancy only
//   arrive  = depart + occ + L         so the next message departs during L
// All times are int64 nanoseconds of one clock.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PIPERT_HD __host__ __device__
#else
#define PIPERT_HD
#endif

namespace pipert {

struct LinkTiming {
  int64_t depart;
  int64_t free_at;  // = depart + occupancy: when the send side is done
  int64_t arrive;
};

// b/bw in ns, rounded to nearest; bw <= 0 or infinite means no occupancy.
PIPERT_HD inline int64_t occupancy_ns(double nbytes, double bytes_per_s) {
  if (!(bytes_per_s > 0.0) || bytes_per_s > 1e300 || nbytes <= 0.0) return 0;
  return static_cast<int64_t>(nbytes / bytes_per_s * 1e9 + 0.5);
}

PIPERT_HD inline LinkTiming link_schedule(int64_t free_at, int64_t ready, int64_t occupancy,
                                          int64_t latency) {
  const int64_t depart = ready > free_at ? ready : free_at;
  return LinkTiming{depart, depart + occupancy, depart + occupancy + latency};
}

// Ideal start of an item on a stream (the ideal clock of csrc/core/stream.h): the later
// of the previous item's ideal end and the item's enqueue time, never after now. The CPU
// stream workers start every item so; the CUDA wait kernels start a timed item so when
// the item before it on their stream was a timed kernel too (a chain), so back-to-back
// messages do not add one kernel launch each to the link's occupancy.
PIPERT_HD inline int64_t ideal_start(int64_t prev_ideal_end, int64_t enqueued, int64_t now) {
  const int64_t start = prev_ideal_end > enqueued ? prev_ideal_end : enqueued;
  return start < now ? start : now;
}

// When a message may be read on its receiver: its arrival (sender's clock) moved
// into the receiver's clock by offset = receiver clock - sender clock (0 when both
// read one clock, e.g. %globaltimer of GPUs in one host). Latency the receiver
// spent on its own work before reading is not waited again.
PIPERT_HD inline int64_t link_read_at(int64_t arrive, int64_t clock_offset) {
  return arrive + clock_offset;
}

}  // namespace pipert
