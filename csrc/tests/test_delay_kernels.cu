// CUDA delay kernels on a real GPU. Exits 77 (ctest: skipped) without a device.
#include <cuda_runtime.h>

#include <cstdio>

#include "core/delay_kernels.h"
#include "tests/check.h"

static int64_t read_timer(cudaStream_t s, int64_t* d) {
  int64_t h = 0;
  CHECK(pipert_cuda_globaltimer(s, d) == 0);
  CHECK(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  return h;
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  int64_t* d = nullptr;
  CHECK(cudaMalloc(&d, 8 * sizeof(int64_t)) == cudaSuccess);
  CHECK(cudaMemset(d, 0, 8 * sizeof(int64_t)) == cudaSuccess);

  // sleep_for: stream-side duration within a loose bound
  int64_t t0 = read_timer(s, d + 7);
  CHECK(pipert_cuda_sleep_for(s, 2'000'000, nullptr, -1) == 0);
  int64_t t1 = read_timer(s, d + 7);
  CHECK(t1 - t0 >= 2'000'000);
  CHECK(t1 - t0 < 2'000'000 + 1'000'000);

  // link_send twice on a link with 1 ms occupancy and 3 ms latency: FIFO on the device
  CHECK(pipert_cuda_link_send(s, d, 1'000'000, 3'000'000, d + 1, nullptr, -1) == 0);
  CHECK(pipert_cuda_link_send(s, d, 1'000'000, 3'000'000, d + 4, nullptr, -1) == 0);
  CHECK(pipert_cuda_wait_until_ptr(s, d + 6) == 0);  // d[6] = 0: returns at once
  int64_t h[6];
  CHECK(cudaMemcpyAsync(h, d, 6 * sizeof(int64_t), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(h[2] == h[1] + 1'000'000 && h[3] == h[2] + 3'000'000);
  CHECK(h[4] >= h[2]);  // second departs after the first's occupancy
  CHECK(h[0] == h[5]);  // free_at tracks the last message

  // link_recv: waits for the arrival moved by the clock offset (here 1 ms later)
  t0 = read_timer(s, d + 7);
  CHECK(pipert_cuda_link_send(s, d, 0, 2'000'000, d + 1, nullptr, -1) == 0);
  CHECK(pipert_cuda_link_recv(s, d + 1, 1'000'000) == 0);
  t1 = read_timer(s, d + 7);
  CHECK(t1 - t0 >= 3'000'000);
  CHECK(t1 - t0 < 3'000'000 + 1'000'000);
  // a chain of two messages enqueued before the first departs: the second departs exactly
  // when the first's occupancy ends (no kernel launch gap), as on a CPU stream worker
  int64_t* ideal = d + 7;
  const int64_t enq = read_timer(s, d + 6);
  CHECK(pipert_cuda_sleep_for(s, 1'000'000, ideal, -1) == 0);  // starts the chain: ideal end
  CHECK(pipert_cuda_link_send(s, d, 500'000, 0, d + 1, ideal, enq) == 0);
  CHECK(pipert_cuda_link_send(s, d, 500'000, 0, d + 4, ideal, enq) == 0);
  CHECK(cudaMemcpyAsync(h, d, 6 * sizeof(int64_t), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(h[4] == h[2]);                        // back to back: departs at the first's free_at
  CHECK(h[5] == h[1] + 2 * 500'000);          // two occupancies after the first departure
  CHECK(h[1] >= enq + 1'000'000);             // the chain starts after the gate's ideal end
  std::printf("ok cuda delay kernels\n");
  return 0;
}
