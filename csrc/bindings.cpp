// pipert._C: Python bindings of the C++ core (csrc/core) and, when built with
// CUDA (PIPERT_WITH_CUDA), of the delay kernels.
//
// Invariants
// - Python times are float seconds of the steady clock (= time.perf_counter());
//   the core works in int64 ns.
// - Every Python object captured by core work is held in a PyCallable, whose
//   call and destruction take the GIL; nothing else in the core touches Python.
// - Calls that can wait (synchronize, close, drain) release the GIL, so stream
//   workers can run Python callables meanwhile.
// Only the ATen headers used here (Tensor, from_blob): <ATen/ATen.h> would double the
// compile time of this file.
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <stdexcept>
#include <string>

#include "core/clock.h"
#include "core/link_emulator.h"
#include "core/pinned_pool.h"
#include "core/stream.h"
#ifdef PIPERT_WITH_CUDA
#include "core/delay_kernels.h"
#endif

namespace py = pybind11;
using namespace pipert;

namespace {

int64_t to_ns(double seconds) { return static_cast<int64_t>(std::llround(seconds * 1e9)); }
double to_s(int64_t ns) { return static_cast<double>(ns) / 1e9; }  // correctly rounded

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// A Python callable run from a core thread.
struct PyCallable {
  py::object fn;
  explicit PyCallable(py::object f) : fn(std::move(f)) {}
  ~PyCallable() {
    if (!fn) return;
    if (!python_alive()) {
      fn.release();  // leak at interpreter exit rather than touch a dead runtime
      return;
    }
    py::gil_scoped_acquire g;
    fn = py::object();
  }
  void operator()() const {
    if (!python_alive()) return;
    py::gil_scoped_acquire g;
    try {
      fn();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(std::string(py::str(e.type().attr("__name__"))) + ": " +
                               std::string(py::str(e.value())));
    }
  }
};

std::function<void()> wrap(py::object fn) {
  if (fn.is_none()) return nullptr;
  if (!PyCallable_Check(fn.ptr())) throw py::type_error("expected a callable");
  auto c = std::make_shared<PyCallable>(std::move(fn));
  return [c] { (*c)(); };
}

// A tensor copy dst.copy_(src) run on a stream worker, without the GIL.
std::function<void()> tensor_copy(at::Tensor dst, at::Tensor src) {
  return [dst, src]() mutable {
    c10::AutoGradMode no_grad(false);
    dst.copy_(src);
  };
}

// Destructors that join threads must not hold the GIL: the threads may need it.
template <class F>
void without_gil(F f) {
  if (python_alive() && PyGILState_Check()) {
    py::gil_scoped_release r;
    f();
  } else {
    f();
  }
}

struct PyStream : Stream {
  using Stream::Stream;
  ~PyStream() override {
    without_gil([this] { close(); });
  }
};

// Every stream made from Python, so that all of them are closed (their workers joined) before the
// interpreter finalizes: a worker that takes the GIL while Python finalizes is ended by
// pthread_exit, which aborts the process when it unwinds through a destructor (close_streams, run
// at exit by pipert._ext). Deletions handed to a thread of their own are counted until done.
struct StreamRegistry {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::weak_ptr<Stream>> streams;
  int deleting = 0;
};

StreamRegistry& registry() {
  static auto* r = new StreamRegistry();  // never destroyed: threads may use it during exit
  return *r;
}

void delete_stream(Stream* s) {
  if (!s->on_worker()) {
    delete s;
    return;
  }
  // The last reference dropped inside one of the stream's own items (Python's garbage collector
  // runs on whichever thread allocates): the worker cannot join itself, so a thread of its own
  // deletes the stream, joining the worker once that item is done.
  StreamRegistry& r = registry();
  {
    std::lock_guard<std::mutex> g(r.m);
    ++r.deleting;
  }
  std::thread([s, &r] {
    delete s;
    std::lock_guard<std::mutex> g(r.m);
    --r.deleting;
    r.cv.notify_all();
  }).detach();
}

std::shared_ptr<Stream> make_stream(std::string name, int priority) {
  std::shared_ptr<Stream> s(new PyStream(std::move(name), priority), delete_stream);
  StreamRegistry& r = registry();
  std::lock_guard<std::mutex> g(r.m);
  auto& v = r.streams;
  v.erase(std::remove_if(v.begin(), v.end(), [](const std::weak_ptr<Stream>& w) { return w.expired(); }), v.end());
  v.push_back(s);
  return s;
}

// Closes every live stream made from Python and waits (up to timeout_s) for deletions in
// flight; called without the GIL. Returns the number of streams closed.
int close_streams(double timeout_s) {
  StreamRegistry& r = registry();
  std::vector<std::shared_ptr<Stream>> live;
  {
    std::lock_guard<std::mutex> g(r.m);
    for (auto& w : r.streams) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->close();
  std::unique_lock<std::mutex> g(r.m);
  r.cv.wait_for(g, std::chrono::duration<double>(timeout_s), [&r] { return r.deleting == 0; });
  return static_cast<int>(live.size());
}

struct PyLinkEmulator : LinkEmulator {
  using LinkEmulator::LinkEmulator;
  ~PyLinkEmulator() override {
    without_gil([this] { drain(); });
  }
};

py::object event_time(const Event& e) {
  const int64_t t = e.time_ns();
  return t == 0 ? py::none() : py::cast(to_s(t));
}

py::object event_ideal_time(const Event& e) {
  const int64_t t = e.ideal_ns();
  return t == 0 ? py::none() : py::cast(to_s(t));
}

std::shared_ptr<Event> event_of(SignalPtr s) {
  auto e = std::make_shared<Event>();
  e->set_signal(std::move(s));
  return e;
}

py::tuple timing_tuple(const LinkTiming& t) {
  return py::make_tuple(to_s(t.depart), to_s(t.free_at), to_s(t.arrive));
}

std::function<void()> copy_of(py::object copy) {
  if (copy.is_none()) return nullptr;
  if (py::isinstance<py::tuple>(copy)) {
    auto t = copy.cast<py::tuple>();
    if (t.size() != 2) throw py::value_error("copy must be a callable or a (dst, src) tensor pair");
    return tensor_copy(t[0].cast<at::Tensor>(), t[1].cast<at::Tensor>());
  }
  return wrap(copy);
}

// One op of a batched issue list; see streams.py StreamSet.issue for the format.
void issue_one(const py::tuple& op) {
  const std::string kind = op[0].cast<std::string>();
  Stream& s = op[1].cast<Stream&>();
  if (kind == "run") {
    s.enqueue(wrap(op[2]));
  } else if (kind == "record") {
    op[2].cast<Event&>().record(s);
  } else if (kind == "wait") {
    s.wait(op[2].cast<const Event&>());
  } else if (kind == "delay") {
    s.enqueue_delay_ns(to_ns(op[2].cast<double>()));
  } else if (kind == "delay_until") {
    s.enqueue_delay_until_ns(to_ns(op[2].cast<double>()));
  } else if (kind == "spin") {
    s.enqueue_spin_ns(to_ns(op[2].cast<double>()));
  } else if (kind == "copy") {
    s.enqueue(tensor_copy(op[2].cast<at::Tensor>(), op[3].cast<at::Tensor>()));
  } else {
    throw py::value_error("unknown op kind '" + kind + "'");
  }
}

#ifdef PIPERT_WITH_CUDA
void cuda_check(int code, const char* what) {
  if (code != 0) throw std::runtime_error(std::string(what) + ": " + pipert_cuda_error_string(code));
}
void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pipert C++ core: CPU streams and events, link delay emulation, pinned pool";
#ifdef PIPERT_WITH_CUDA
  m.attr("HAS_CUDA") = true;
#else
  m.attr("HAS_CUDA") = false;
#endif
  m.def("now", [] { return to_s(now_ns()); }, "steady-clock seconds (the clock of every deadline)");
  m.def("stream_ideal_now", [] { return to_s(stream_ideal_now()); },
        "ideal start of the item running on this stream worker (now() elsewhere)");
  m.def("stream_ideal_done", [](double t) { stream_ideal_done(to_ns(t)); },
        "a timed item on this stream worker reports its ideal end");
  m.def("sleep_until", [](double t) { sleep_until_ns(to_ns(t)); }, py::call_guard<py::gil_scoped_release>());

  py::class_<Event, std::shared_ptr<Event>>(m, "Event")
      .def(py::init<>())
      .def("record", [](Event& e, Stream& s) { e.record(s); })
      .def("query", &Event::query)
      .def("synchronize", &Event::synchronize, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("time", &event_time)
      .def_property_readonly("ideal_time", &event_ideal_time)
      .def("elapsed_time", [](const Event& a, const Event& b) {
        if (!a.query() || !b.query() || a.time_ns() == 0 || b.time_ns() == 0)
          throw std::runtime_error("elapsed_time needs two completed, recorded events");
        return to_s(b.time_ns() - a.time_ns());
      });

  py::class_<EventPool, std::shared_ptr<EventPool>>(m, "EventPool")
      .def(py::init<>())
      .def("acquire", &EventPool::acquire)
      .def("release", &EventPool::release)
      .def_property_readonly("created", &EventPool::created)
      .def_property_readonly("free_count", &EventPool::free_count);

  py::class_<Stream, std::shared_ptr<Stream>>(m, "Stream")
      .def(py::init([](std::string name, int priority) {
             return make_stream(std::move(name), priority);
           }), py::arg("name") = "stream", py::arg("priority") = 0)
      .def_property_readonly("name", &Stream::name)
      .def_property_readonly("priority", &Stream::priority)
      .def_property_readonly("error", &Stream::error)
      .def("enqueue", [](Stream& s, py::object fn) { s.enqueue(wrap(std::move(fn))); })
      .def("enqueue_delay", [](Stream& s, double dt) { s.enqueue_delay_ns(to_ns(dt)); })
      .def("enqueue_delay_until", [](Stream& s, double t) { s.enqueue_delay_until_ns(to_ns(t)); })
      .def("enqueue_spin", [](Stream& s, double dt) { s.enqueue_spin_ns(to_ns(dt)); })
      .def("enqueue_copy", [](Stream& s, at::Tensor dst, at::Tensor src) { s.enqueue(tensor_copy(dst, src)); })
      .def("record", [](Stream& s, std::shared_ptr<Event> e) {
            if (!e) e = std::make_shared<Event>();
            e->record(s);
            return e;
          }, py::arg("event") = nullptr)
      .def("wait", [](Stream& s, const Event& e) { s.wait(e); })
      .def("synchronize", &Stream::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("query", &Stream::query)
      .def("close", &Stream::close, py::call_guard<py::gil_scoped_release>());

  m.def("close_streams", &close_streams, py::arg("timeout") = 10.0, py::call_guard<py::gil_scoped_release>(),
        "Close every live stream made from Python (joining its worker); run at interpreter exit.");

  m.def("issue", [](const py::sequence& ops) {
    for (const auto& op : ops) issue_one(op.cast<py::tuple>());
  }, "Enqueue a list of (kind, stream, args...) ops in order.");

  py::class_<Transfer, std::shared_ptr<Transfer>>(m, "Transfer")
      .def_property_readonly("sent", [](const Transfer& t) { return event_of(t.sent); })
      .def_property_readonly("arrived", [](const Transfer& t) { return event_of(t.arrived); })
      .def_property_readonly("depart", [](const Transfer& t) {
        return t.arrive->load() != 0 ? py::cast(to_s(t.depart.load())) : py::none();  // known at depart
      })
      .def_property_readonly("free_at", [](const Transfer& t) {
        return t.arrive->load() != 0 ? py::cast(to_s(t.free_at.load())) : py::none();  // known at depart
      })
      .def_property_readonly("arrive", [](const Transfer& t) {
        return t.arrive->load() != 0 ? py::cast(to_s(t.arrive->load())) : py::none();  // known at depart
      });

  py::class_<LinkEmulator, std::shared_ptr<LinkEmulator>>(m, "LinkEmulator")
      .def(py::init([](int n, double latency, double bandwidth, double per_message) {
             return std::shared_ptr<LinkEmulator>(std::make_shared<PyLinkEmulator>(
                 n, LinkParams{to_ns(latency), bandwidth, to_ns(per_message)}));
           }), py::arg("num_ranks"), py::arg("latency") = 0.0, py::arg("bandwidth") = INFINITY,
           py::arg("per_message") = 0.0)
      .def_property_readonly("num_ranks", &LinkEmulator::num_ranks)
      .def("set_link", [](LinkEmulator& em, int s, int d, double lat, double bw, double per_message) {
        em.set_link(s, d, LinkParams{to_ns(lat), bw, to_ns(per_message)});
      }, py::arg("src"), py::arg("dst"), py::arg("latency"), py::arg("bandwidth"), py::arg("per_message") = 0.0)
      .def("link", [](const LinkEmulator& em, int s, int d) {
        LinkParams p = em.link(s, d);
        return py::make_tuple(to_s(p.latency_ns), p.bandwidth, to_s(p.per_message_ns));
      })
      .def("free_at", [](const LinkEmulator& em, int s, int d) { return to_s(em.free_at(s, d)); })
      .def("reset", &LinkEmulator::reset)
      .def("schedule", [](LinkEmulator& em, int s, int d, double nbytes, double ready) {
        return timing_tuple(em.schedule(s, d, nbytes, to_ns(ready)));
      })
      .def("deliver", [](LinkEmulator& em, int s, int d, double nbytes, double ready, py::object fn) {
        return timing_tuple(em.deliver(s, d, nbytes, to_ns(ready), wrap(std::move(fn))));
      })
      .def("drain", &LinkEmulator::drain, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("timer_error", &LinkEmulator::timer_error)
      .def("enqueue_transfer", [](LinkEmulator& em, Stream& send, Stream& recv, int s, int d,
                                  double nbytes, py::object copy, bool rendezvous) {
        return em.enqueue_transfer(send, recv, s, d, nbytes, copy_of(std::move(copy)), rendezvous);
      }, py::arg("send"), py::arg("recv"), py::arg("src"), py::arg("dst"), py::arg("nbytes"),
         py::arg("copy") = py::none(), py::arg("rendezvous") = true);

  py::class_<PinnedPool, std::shared_ptr<PinnedPool>>(m, "PinnedPool")
      .def(py::init([](bool page_locked) {
             if (!page_locked) return std::make_shared<PinnedPool>();
#ifdef PIPERT_WITH_CUDA
             return std::make_shared<PinnedPool>(&pipert_cuda_host_alloc, &pipert_cuda_host_free, true);
#else
             throw std::runtime_error("pipert._C was built without CUDA: no page-locked memory");
#endif
           }), py::arg("page_locked") = false)
      .def_property_readonly("page_locked", &PinnedPool::page_locked)
      .def_static("size_class", &PinnedPool::size_class)
      .def("acquire", [](std::shared_ptr<PinnedPool> pool, size_t nbytes) {
        PinnedBlock b = pool->acquire(nbytes);
        // The tensor keeps the pool alive and retains its block (trim() keeps it); the
        // block stays held until release(id), whatever happens to the tensor.
        pool->retain(b.id);
        const int64_t id = b.id;
        at::Tensor t = at::from_blob(b.ptr, {static_cast<int64_t>(b.capacity)},
                                     [pool, id](void*) { pool->unretain(id); },
                                     at::TensorOptions().dtype(at::kByte));
        return py::make_tuple(b.id, t);
      })
      .def("release", &PinnedPool::release)
      .def("trim", &PinnedPool::trim)
      .def("stats", [](const PinnedPool& p) {
        PinnedStats s = p.stats();
        py::dict d;
        d["allocations"] = s.allocations;
        d["reuses"] = s.reuses;
        d["bytes_reserved"] = s.bytes_reserved;
        d["in_use"] = s.in_use;
        return d;
      });

#ifdef PIPERT_WITH_CUDA
  // Raw CUDA entry points; pipert/runtime/streams.py and links.py validate the
  // arguments (stream handles from torch.cuda.Stream.cuda_stream, device pointers).
  // ideal/enqueued: the chain of delay_kernels.h (0 / -1: none)
  m.def("cuda_sleep_for", [](uintptr_t s, int64_t ns, uintptr_t ideal, int64_t enqueued) {
    cuda_check(pipert_cuda_sleep_for(as_ptr(s), ns, static_cast<int64_t*>(as_ptr(ideal)), enqueued), "sleep_for");
  }, py::arg("stream"), py::arg("ns"), py::arg("ideal") = 0, py::arg("enqueued") = -1);
  m.def("cuda_wait_until", [](uintptr_t s, int64_t t) { cuda_check(pipert_cuda_wait_until(as_ptr(s), t), "wait_until"); });
  m.def("cuda_wait_until_ptr", [](uintptr_t s, uintptr_t p) {
    cuda_check(pipert_cuda_wait_until_ptr(as_ptr(s), static_cast<const int64_t*>(as_ptr(p))), "wait_until_ptr");
  });
  m.def("cuda_link_send", [](uintptr_t s, uintptr_t free_at, int64_t occ, int64_t lat, uintptr_t timing,
                             uintptr_t ideal, int64_t enqueued) {
    cuda_check(pipert_cuda_link_send(as_ptr(s), static_cast<int64_t*>(as_ptr(free_at)), occ, lat,
                                     static_cast<int64_t*>(as_ptr(timing)), static_cast<int64_t*>(as_ptr(ideal)),
                                     enqueued), "link_send");
  }, py::arg("stream"), py::arg("free_at"), py::arg("occupancy"), py::arg("latency"), py::arg("timing"),
     py::arg("ideal") = 0, py::arg("enqueued") = -1);
  m.def("cuda_link_recv", [](uintptr_t s, uintptr_t timing, int64_t offset) {
    cuda_check(pipert_cuda_link_recv(as_ptr(s), static_cast<const int64_t*>(as_ptr(timing)), offset), "link_recv");
  });
  m.def("cuda_spin", [](uintptr_t s, int64_t ns, int blocks) { cuda_check(pipert_cuda_spin(as_ptr(s), ns, blocks), "spin"); });
  m.def("cuda_globaltimer", [](uintptr_t s, uintptr_t out) {
    cuda_check(pipert_cuda_globaltimer(as_ptr(s), static_cast<int64_t*>(as_ptr(out))), "globaltimer");
  });
#endif
}
