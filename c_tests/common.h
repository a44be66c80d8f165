/* Helpers shared by the C tests. Each failure prints file:line and exits non-zero. */
#ifndef DC_TESTS_COMMON_H
#define DC_TESTS_COMMON_H

#include <distcomm.h>
#include <math.h>
#include <stdint.h>
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
    if (check_s_ != DC_SUCCESS && dc_last_error()[0] == '\0') {                           \
      fprintf(stderr, "%s:%d: %s failed without a dc_last_error() message\n", __FILE__,    \
              __LINE__, #call);                                                            \
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

/* ---- element access for every dtype, and joining the job ---- */

#define DC_UNUSED __attribute__((unused))

static int dc_test_rank DC_UNUSED = -1;

/* FAIL(...): prints the rank, file:line and a printf-style message, and exits non-zero. */
#define FAIL(...)                                                                  \
  do {                                                                             \
    fprintf(stderr, "FAIL rank %d %s:%d: ", dc_test_rank, __FILE__, __LINE__);     \
    fprintf(stderr, __VA_ARGS__);                                                  \
    fprintf(stderr, "\n");                                                         \
    exit(1);                                                                       \
  } while (0)

static const int ALL_DTYPES[] DC_UNUSED = {DC_INT8,    DC_UINT8,   DC_INT32,   DC_UINT32, DC_INT64,
                                 DC_UINT64,  DC_FLOAT16, DC_FLOAT32, DC_FLOAT64, DC_BFLOAT16};
#define N_DTYPES 10
static const char *DTYPE_NAMES[] DC_UNUSED = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                    "uint64",  "float16", "float32", "float64", "bfloat16"};

static inline size_t dtype_size(int dt) {
  switch (dt) {
    case DC_INT8: case DC_UINT8: return 1;
    case DC_FLOAT16: case DC_BFLOAT16: return 2;
    case DC_INT32: case DC_UINT32: case DC_FLOAT32: return 4;
    default: return 8;
  }
}

static inline int dtype_is_float(int dt) {
  return dt == DC_FLOAT16 || dt == DC_FLOAT32 || dt == DC_FLOAT64 || dt == DC_BFLOAT16;
}

static inline int dtype_is_signed(int dt) {
  return dt == DC_INT8 || dt == DC_INT32 || dt == DC_INT64 || dtype_is_float(dt);
}

static inline uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return (uint16_t)half;
}

static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = -1;
      do { e++; mant <<= 1; } while (!(mant & 0x400u));
      x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  uint32_t lsb = (x >> 16) & 1;
  x += 0x7fffu + lsb;
  return (uint16_t)(x >> 16);
}

static inline float bf16_to_float(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* Stores `v` (an integer-valued or real number) as element i of buf. Integers wrap. */
static inline void set_elem(void *buf, int dt, size_t i, double v) {
  switch (dt) {
    case DC_INT8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
    case DC_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case DC_INT32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
    case DC_UINT32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case DC_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DC_UINT64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case DC_FLOAT16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case DC_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DC_FLOAT64: ((double *)buf)[i] = v; break;
    case DC_BFLOAT16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
  }
}

static inline double get_elem(const void *buf, int dt, size_t i) {
  switch (dt) {
    case DC_INT8: return ((const int8_t *)buf)[i];
    case DC_UINT8: return ((const uint8_t *)buf)[i];
    case DC_INT32: return ((const int32_t *)buf)[i];
    case DC_UINT32: return ((const uint32_t *)buf)[i];
    case DC_INT64: return (double)((const int64_t *)buf)[i];
    case DC_UINT64: return (double)((const uint64_t *)buf)[i];
    case DC_FLOAT16: return half_to_float(((const uint16_t *)buf)[i]);
    case DC_FLOAT32: return ((const float *)buf)[i];
    case DC_FLOAT64: return ((const double *)buf)[i];
    case DC_BFLOAT16: return bf16_to_float(((const uint16_t *)buf)[i]);
  }
  return 0;
}

/* Whether `got` is acceptably close to `want` for dtype dt (exact for integers). */
static inline int close_enough(int dt, double got, double want) {
  double tol = 0;
  if (dt == DC_FLOAT16) tol = 1e-3;
  if (dt == DC_BFLOAT16) tol = 8e-3;
  if (dt == DC_FLOAT32) tol = 1e-6;
  if (dt == DC_FLOAT64) tol = 1e-12;
  return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

static inline void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) FAIL("out of memory (%zu bytes)", n);
  return p;
}

/* Joins the job from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT or dcrun). */
static inline dc_comm *test_init(int *rank, int *size) {
  dc_comm *world = NULL;
  CHECK(dc_init(NULL, &world));
  CHECK(dc_comm_rank(world, rank));
  CHECK(dc_comm_size(world, size));
  dc_test_rank = *rank;
  return world;
}

#endif /* DC_TESTS_COMMON_H */
