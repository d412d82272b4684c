// Wait-until-deadline kernels for link delay injection and a spin kernel for
// calibrated compute. See delay_kernels.h for the contract.
#include <cuda_runtime.h>

#include "core/delay_kernels.h"
#include "core/link_math.h"

namespace {

__device__ __forceinline__ int64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<int64_t>(t);
}

// Returns at or after deadline. __nanosleep(t) sleeps for roughly [0, 2t], so
// sleeping half of what is left never overshoots by design; the last
// microsecond is a spin on the timer.
__device__ void sleep_until_ns(int64_t deadline) {
  for (;;) {
    const int64_t left = deadline - globaltimer_ns();
    if (left <= 0) return;
#if __CUDA_ARCH__ >= 700  // __nanosleep exists from Volta on; older chips spin
    if (left > 2000) {
      const int64_t half = left / 2;
      __nanosleep(static_cast<unsigned>(half < 1000000 ? half : 1000000));
    }
#endif
  }
}

// The kernel's ideal start (delay_kernels.h, chains).
__device__ int64_t start_ns(const int64_t* ideal, int64_t enqueued) {
  const int64_t now = globaltimer_ns();
  return ideal != nullptr && enqueued >= 0 ? pipert::ideal_start(*ideal, enqueued, now) : now;
}

__global__ void k_sleep_for(int64_t ns, int64_t* ideal, int64_t enqueued) {
  const int64_t end = start_ns(ideal, enqueued) + ns;
  if (ideal != nullptr) *ideal = end;
  sleep_until_ns(end);
}

__global__ void k_wait_until(int64_t deadline) { sleep_until_ns(deadline); }

__global__ void k_wait_until_ptr(const int64_t* deadline) {
  sleep_until_ns(*static_cast<const volatile int64_t*>(deadline));
}

__global__ void k_link_send(int64_t* free_at, int64_t occupancy, int64_t latency, int64_t* timing_out,
                            int64_t* ideal, int64_t enqueued) {
  const pipert::LinkTiming t = pipert::link_schedule(*free_at, start_ns(ideal, enqueued), occupancy, latency);
  *free_at = t.free_at;
  if (ideal != nullptr) *ideal = t.free_at;
  timing_out[0] = t.depart;
  timing_out[1] = t.free_at;
  timing_out[2] = t.arrive;
  // Kernel completion makes these writes visible to later work ordered after it.
  sleep_until_ns(t.free_at);
}

__global__ void k_link_recv(const int64_t* timing, int64_t clock_offset) {
  const volatile int64_t* t = timing;
  sleep_until_ns(pipert::link_read_at(t[2], clock_offset));
}

__global__ void k_spin(int64_t ns) {
  __shared__ int64_t end;
  if (threadIdx.x == 0) end = globaltimer_ns() + ns;
  __syncthreads();
  while (globaltimer_ns() < end) {
  }
}

__global__ void k_globaltimer(int64_t* out) { *out = globaltimer_ns(); }

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

extern "C" {

int pipert_cuda_sleep_for(void* stream, int64_t ns, int64_t* ideal, int64_t enqueued_ns) {
  k_sleep_for<<<1, 1, 0, as_stream(stream)>>>(ns, ideal, enqueued_ns);
  return static_cast<int>(cudaGetLastError());
}

int pipert_cuda_wait_until(void* stream, int64_t deadline_ns) {
  k_wait_until<<<1, 1, 0, as_stream(stream)>>>(deadline_ns);
  return static_cast<int>(cudaGetLastError());
}

int pipert_cuda_wait_until_ptr(void* stream, const int64_t* deadline) {
  k_wait_until_ptr<<<1, 1, 0, as_stream(stream)>>>(deadline);
  return static_cast<int>(cudaGetLastError());
}

int pipert_cuda_link_send(void* stream, int64_t* free_at, int64_t occupancy_ns, int64_t latency_ns,
                          int64_t* timing_out, int64_t* ideal, int64_t enqueued_ns) {
  k_link_send<<<1, 1, 0, as_stream(stream)>>>(free_at, occupancy_ns, latency_ns, timing_out, ideal, enqueued_ns);
  return static_cast<int>(cudaGetLastError());
}

int pipert_cuda_link_recv(void* stream, const int64_t* timing, int64_t clock_offset_ns) {
  k_link_recv<<<1, 1, 0, as_stream(stream)>>>(timing, clock_offset_ns);
  return static_cast<int>(cudaGetLastError());
}

int pipert_cuda_spin(void* stream, int64_t ns, int blocks) {
  k_spin<<<blocks > 0 ? blocks : 1, 32, 0, as_stream(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}

int pipert_cuda_globaltimer(void* stream, int64_t* out) {
  k_globaltimer<<<1, 1, 0, as_stream(stream)>>>(out);
  return static_cast<int>(cudaGetLastError());
}

void* pipert_cuda_host_alloc(size_t nbytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, nbytes, cudaHostAllocDefault) != cudaSuccess) return nullptr;
  return p;
}

void pipert_cuda_host_free(void* ptr) { cudaFreeHost(ptr); }

const char* pipert_cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // extern "C"
