#pragma once
// Shared by the libFuzzer targets of tests/fuzz: invariant checks that stop the run (libFuzzer then
// saves the input as a crash artifact). Standard library and ferry/status.h only.

#include <cstdio>
#include <cstdlib>

#include "ferry/status.h"

// Aborts with the failed condition, file and line when `cond` is false.
#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

// Aborts with the status when a step that must succeed (re-decoding what was just encoded) fails.
#define FUZZ_CHECK_OK(expr)                                                     \
  do {                                                                          \
    const ::ferry::Status _fuzz_s = (expr);                                     \
    if (!_fuzz_s.ok()) {                                                        \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   _fuzz_s.ToString().c_str());                                 \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
