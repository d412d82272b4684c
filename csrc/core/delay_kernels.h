// C interface to the CUDA delay kernels (delay_kernels.cu). No CUDA types here,
// so callers compile without CUDA headers: streams are cudaStream_t passed as
// void*, results are cudaError_t values as int (0 = success).
//
// Clock: every deadline is in %globaltimer nanoseconds of the device that runs
// the kernel. Each kernel is one thread (spin: one warp per block) and enqueues
// no host synchronisation, so the host never blocks and no compute SMs are
// taken beyond one resident thread while a wait is pending.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// Chains (every timed kernel below takes `ideal` and `enqueued_ns`): `ideal` is a
// device word of the stream (null: no chain) that each timed kernel sets to its ideal
// end. With enqueued_ns >= 0 (the host's enqueue time in this device's clock; the item
// before this one on the stream was a timed kernel writing `ideal`), the kernel starts,
// ideally, at ideal_start(*ideal, enqueued_ns, now) of link_math.h instead of now, as a
// CPU stream worker does; with enqueued_ns < 0 at now.

// Sleeps the stream for ns from when the kernel (ideally) starts.
int pipert_cuda_sleep_for(void* stream, int64_t ns, int64_t* ideal, int64_t enqueued_ns);
// Sleeps the stream until deadline_ns (absolute).
int pipert_cuda_wait_until(void* stream, int64_t deadline_ns);
// Sleeps the stream until *deadline (device memory), read when the kernel starts.
int pipert_cuda_wait_until_ptr(void* stream, const int64_t* deadline);
// One message on one directed link, all on the device: ready = the kernel's (ideal)
// start, timing = link_schedule(*free_at, ready, occupancy, latency), *free_at updated,
// timing_out[0..2] = depart, free_at, arrive; then sleeps until free_at.
// Invariant: only one stream (the link's send stream) uses a given free_at.
int pipert_cuda_link_send(void* stream, int64_t* free_at, int64_t occupancy_ns, int64_t latency_ns,
                          int64_t* timing_out, int64_t* ideal, int64_t enqueued_ns);
// The receiver side of link_send across processes: timing[0..2] as link_send wrote
// them on the sender (the sender's clock; the three words travel with the message),
// sleeps until link_read_at(timing[2], clock_offset_ns) of this device's clock.
int pipert_cuda_link_recv(void* stream, const int64_t* timing, int64_t clock_offset_ns);
// Busy compute: `blocks` blocks of one warp each spin for ns (calibrated compute).
int pipert_cuda_spin(void* stream, int64_t ns, int blocks);
// *out = %globaltimer when the kernel runs (for host <-> device clock mapping).
int pipert_cuda_globaltimer(void* stream, int64_t* out);

// Page-locked host memory for the pinned pool; null on failure.
void* pipert_cuda_host_alloc(size_t nbytes);
void pipert_cuda_host_free(void* ptr);
const char* pipert_cuda_error_string(int code);

}  // extern "C"
