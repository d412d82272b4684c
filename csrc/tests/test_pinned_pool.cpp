// Pinned pool: size classes, reuse after release, no double release, trim, stats.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/pinned_pool.h"
#include "tests/check.h"

using namespace pipert;

static int host_allocs = 0;
static void* counting_alloc(size_t n) {
  ++host_allocs;
  return std::malloc(n);
}
static void counting_free(void* p) { std::free(p); }

static void size_classes() {
  CHECK(PinnedPool::size_class(0) == 4096);
  CHECK(PinnedPool::size_class(4096) == 4096);
  CHECK(PinnedPool::size_class(4097) == 8192);
  CHECK(PinnedPool::size_class(1000000) == 1048576);
}

static void reuses_released_blocks() {
  host_allocs = 0;
  PinnedPool pool(&counting_alloc, &counting_free, false);
  PinnedBlock a = pool.acquire(5000);
  CHECK(a.capacity == 8192);
  std::memset(a.ptr, 1, a.capacity);
  PinnedBlock b = pool.acquire(5000);
  CHECK(b.ptr != a.ptr);
  pool.release(a.id);
  PinnedBlock c = pool.acquire(7000);  // same class: reuses a
  CHECK(c.id == a.id && c.ptr == a.ptr);
  PinnedBlock d = pool.acquire(100);  // other class: new block
  CHECK(d.capacity == 4096);
  PinnedStats s = pool.stats();
  CHECK(s.allocations == 3 && s.reuses == 1 && s.in_use == 3);
  CHECK(s.bytes_reserved == 8192 + 8192 + 4096);
  CHECK(host_allocs == 3);
  CHECK(!pool.page_locked());
}

static void double_buffer_cycle_allocates_twice() {
  // Alternating two held buffers (double buffering) over many steps allocates two blocks.
  host_allocs = 0;
  PinnedPool pool(&counting_alloc, &counting_free, false);
  PinnedBlock slot[2] = {pool.acquire(1 << 20), pool.acquire(1 << 20)};
  for (int step = 0; step < 50; ++step) {
    int k = step % 2;
    pool.release(slot[k].id);
    slot[k] = pool.acquire(1 << 20);
  }
  CHECK(host_allocs == 2);
  CHECK(pool.stats().reuses == 50);
}

static void release_and_trim() {
  PinnedPool pool;
  PinnedBlock a = pool.acquire(10);
  CHECK(reinterpret_cast<uintptr_t>(a.ptr) % 4096 == 0);
  pool.release(a.id);
  CHECK_THROWS(pool.release(a.id));  // double release
  CHECK_THROWS(pool.release(12345));
  PinnedBlock b = pool.acquire(10);
  CHECK(pool.trim() == 0);  // b is held
  pool.release(b.id);
  CHECK(pool.trim() == 4096);
  CHECK(pool.stats().bytes_reserved == 0);
  PinnedBlock c = pool.acquire(10);  // fresh allocation after trim
  CHECK(pool.stats().allocations == 2);
  pool.retain(c.id);  // e.g. a tensor over it outlives the release
  pool.release(c.id);
  CHECK(pool.trim() == 0);
  pool.unretain(c.id);
  CHECK(pool.trim() == 4096);
}

int main() {
  RUN(size_classes);
  RUN(reuses_released_blocks);
  RUN(double_buffer_cycle_allocates_twice);
  RUN(release_and_trim);
  return 0;
}
