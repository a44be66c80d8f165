/* Helpers shared by the C tests. Each failure prints file:line and exits non-zero. */
#ifndef DC_TESTS_COMMON_H
#define DC_TESTS_COMMON_H

#include <distcomm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CHECK(call): the call must return DC_SUCCESS; otherwise prints the call, its status name and
 * dc_last_error(), and exits with status 1. */
#define CHECK(call)                                                                        \
  do {                                                                                     \
    dc_status check_s_ = (call);                                                           \
    if (check_s_ != DC_SUCCESS) {                                                          \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,            \
              dc_status_name(check_s_), dc_last_error());                                  \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* CHECK_STATUS(call, expected): the call must return `expected` (for the failure paths). */
#define CHECK_STATUS(call, expected)                                                       \
  do {                                                                                     \
    dc_status check_s_ = (call);                                                           \
    if (check_s_ != (expected)) {                                                          \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s: %s\n", __FILE__, __LINE__,      \
              #call, dc_status_name(check_s_), dc_status_name(expected), dc_last_error()); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* EXPECT(cond, ...): cond must hold; otherwise prints it and a printf-style explanation. */
#define EXPECT(cond, ...)                                                                  \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);                  \
      fprintf(stderr, __VA_ARGS__);                                                        \
      fprintf(stderr, "\n");                                                               \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#endif /* DC_TESTS_COMMON_H */
