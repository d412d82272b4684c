// A pool of host staging buffers, allocated once per size class and reused.
//
// Invariants
// - Capacities are size classes: powers of two, at least kMinBlock bytes.
// - A block is either free or held by exactly one acquirer; release() of a block
//   that is not held throws (no double release).
// - Memory is returned to the allocator only by trim() (free blocks that nobody
//   retains) or by the destructor; a held or retained block's memory stays valid.
//   retain/unretain count outside views of a block (e.g. tensors over it).
// - page_locked() says whether the allocator gives page-locked (CUDA pinned)
//   memory; the default allocator gives ordinary 4 KiB-aligned host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace pipert {

struct PinnedBlock {
  int64_t id = -1;
  void* ptr = nullptr;
  size_t capacity = 0;
};

struct PinnedStats {
  size_t allocations = 0;     // blocks obtained from the allocator
  size_t reuses = 0;          // acquires served from a free block
  size_t bytes_reserved = 0;  // capacity of all blocks the pool owns
  size_t in_use = 0;          // blocks currently held
};

class PinnedPool {
 public:
  using AllocFn = void* (*)(size_t);
  using FreeFn = void (*)(void*);
  static constexpr size_t kMinBlock = 4096;

  PinnedPool();  // ordinary host memory
  PinnedPool(AllocFn alloc, FreeFn free, bool page_locked);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  static size_t size_class(size_t nbytes);
  PinnedBlock acquire(size_t nbytes);  // throws std::bad_alloc if the allocator fails
  void release(int64_t id);
  void retain(int64_t id);
  void unretain(int64_t id);
  size_t trim();  // frees every free, unretained block; returns bytes freed
  PinnedStats stats() const;
  bool page_locked() const { return page_locked_; }

 private:
  struct Entry {
    void* ptr;
    size_t capacity;
    bool held;
    int refs = 0;  // outside views (retain/unretain)
  };
  AllocFn alloc_;
  FreeFn free_;
  bool page_locked_;
  mutable std::mutex m_;
  std::map<int64_t, Entry> blocks_;
  std::map<size_t, std::vector<int64_t>> free_by_class_;
  int64_t next_id_ = 0;
  PinnedStats stats_;
};

}  // namespace pipert
