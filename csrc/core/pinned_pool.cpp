#include "core/pinned_pool.h"

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

namespace pipert {

namespace {
void* host_alloc(size_t n) { return std::aligned_alloc(PinnedPool::kMinBlock, n); }
void host_free(void* p) { std::free(p); }
}  // namespace

PinnedPool::PinnedPool() : PinnedPool(&host_alloc, &host_free, false) {}

PinnedPool::PinnedPool(AllocFn alloc, FreeFn free, bool page_locked)
    : alloc_(alloc), free_(free), page_locked_(page_locked) {}

PinnedPool::~PinnedPool() {
  for (auto& kv : blocks_) free_(kv.second.ptr);
}

size_t PinnedPool::size_class(size_t nbytes) {
  size_t c = kMinBlock;
  while (c < nbytes) c <<= 1;
  return c;
}

PinnedBlock PinnedPool::acquire(size_t nbytes) {
  const size_t cap = size_class(nbytes);
  std::lock_guard<std::mutex> g(m_);
  auto& free_list = free_by_class_[cap];
  if (!free_list.empty()) {
    const int64_t id = free_list.back();
    free_list.pop_back();
    Entry& e = blocks_.at(id);
    e.held = true;
    ++stats_.reuses;
    ++stats_.in_use;
    return PinnedBlock{id, e.ptr, e.capacity};
  }
  void* p = alloc_(cap);
  if (!p) throw std::bad_alloc();
  const int64_t id = next_id_++;
  blocks_.emplace(id, Entry{p, cap, true});
  ++stats_.allocations;
  ++stats_.in_use;
  stats_.bytes_reserved += cap;
  return PinnedBlock{id, p, cap};
}

void PinnedPool::release(int64_t id) {
  std::lock_guard<std::mutex> g(m_);
  auto it = blocks_.find(id);
  if (it == blocks_.end() || !it->second.held)
    throw std::invalid_argument("pinned block " + std::to_string(id) + " is not held");
  it->second.held = false;
  --stats_.in_use;
  free_by_class_[it->second.capacity].push_back(id);
}

void PinnedPool::retain(int64_t id) {
  std::lock_guard<std::mutex> g(m_);
  ++blocks_.at(id).refs;
}

void PinnedPool::unretain(int64_t id) {
  std::lock_guard<std::mutex> g(m_);
  auto it = blocks_.find(id);
  if (it != blocks_.end() && it->second.refs > 0) --it->second.refs;
}

size_t PinnedPool::trim() {
  std::lock_guard<std::mutex> g(m_);
  size_t freed = 0;
  for (auto& kv : free_by_class_) {
    std::vector<int64_t> kept;
    for (int64_t id : kv.second) {
      auto it = blocks_.find(id);
      if (it->second.refs > 0) {  // a view still points at it
        kept.push_back(id);
        continue;
      }
      free_(it->second.ptr);
      freed += it->second.capacity;
      blocks_.erase(it);
    }
    kv.second = std::move(kept);
  }
  stats_.bytes_reserved -= freed;
  return freed;
}

PinnedStats PinnedPool::stats() const {
  std::lock_guard<std::mutex> g(m_);
  return stats_;
}

}  // namespace pipert
