// Minimal assertions for the C++ unit tests (no test framework dependency).
// A failed CHECK prints file:line and the expression and exits with code 1.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

#define CHECK_THROWS(stmt)                                                       \
  do {                                                                           \
    bool threw_ = false;                                                         \
    try {                                                                        \
      stmt;                                                                      \
    } catch (...) {                                                              \
      threw_ = true;                                                             \
    }                                                                            \
    if (!threw_) {                                                               \
      std::fprintf(stderr, "%s:%d: expected a throw: %s\n", __FILE__, __LINE__, #stmt); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

#define RUN(test)                    \
  do {                               \
    test();                          \
    std::printf("ok %s\n", #test);   \
  } while (0)

// Upper bounds on elapsed time: on a busy shared machine a thread can be preempted
// for milliseconds, so a timed test returns false on a missed bound and RUN_TIMED
// runs it up to 3 times; a systematic error misses every time. Lower bounds (never
// early) use CHECK and fail at once.
#define CHECK_SOON(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: timing bound missed: %s\n", __FILE__, __LINE__, #cond); \
      return false;                                                                      \
    }                                                                                    \
  } while (0)

#define RUN_TIMED(test)                                                        \
  do {                                                                         \
    int attempt_ = 1;                                                          \
    while (!test()) {                                                          \
      if (++attempt_ > 3) {                                                    \
        std::fprintf(stderr, "%s: timing bound missed 3 times\n", #test);      \
        std::exit(1);                                                          \
      }                                                                        \
    }                                                                          \
    std::printf("ok %s (attempt %d)\n", #test, attempt_);                      \
  } while (0)
