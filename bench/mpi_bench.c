/*
 * mpi_bench: the dc-bench sweep over MPI (Open MPI or MPICH), for side-by-side comparisons.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Same options, columns, test data, checks and CSV format as dc-bench (src/bin/dc-bench), so the
 * two programs' rows can be compared one for one:
 *   mpirun -np 2 ./mpi_bench -b 8 -e 64M -f 2 -o allreduce --csv mpi.csv
 * Build: mpicc -O2 -std=c11 -o mpi_bench bench/mpi_bench.c   (bench/compare.sh does this)
 *
 * Mapping to MPI: allreduce MPI_Allreduce, broadcast MPI_Bcast, reduce MPI_Reduce, allgather
 * MPI_Allgather, reduce_scatter MPI_Reduce_scatter_block, alltoall MPI_Alltoall, sendrecv
 * MPI_Sendrecv (ring: send to rank+1, receive from rank-1), barrier MPI_Barrier. In-place forms
 * use MPI_IN_PLACE (reduce_scatter's in-place result lands at the start of the buffer, as MPI
 * defines it). MPI has no avg: sum, then a division of the result in its type, timed with the
 * call (what an MPI user writes). MPI has no half/bfloat16: MPI_UINT16_T with user-defined
 * commutative ops that compute in float and round each step.
 * time: the slowest rank's average per iteration (MPI_MAX over ranks after timing).
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Names                                                                                       */

enum op { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_ALLTOALL, OP_SENDRECV, OP_BARRIER, NOPS };
static const char *const op_names[NOPS] = {"allreduce", "broadcast", "reduce", "allgather",
                                           "reduce_scatter", "alltoall", "sendrecv", "barrier"};

enum dt { DT_INT8, DT_UINT8, DT_INT32, DT_UINT32, DT_INT64, DT_UINT64, DT_HALF, DT_FLOAT, DT_DOUBLE, DT_BF16, NDTS };
static const char *const dt_names[NDTS] = {"int8", "uint8", "int32", "uint32", "int64",
                                           "uint64", "half", "float", "double", "bfloat16"};
static const size_t dt_sizes[NDTS] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

enum redop { R_SUM, R_PROD, R_MAX, R_MIN, R_AVG, R_BAND, R_BOR, R_BXOR, NREDOPS };
static const char *const redop_names[NREDOPS] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"};

static int op_reduces(int op) { return op == OP_ALLREDUCE || op == OP_REDUCE || op == OP_REDUCE_SCATTER; }
static int op_has_root(int op) { return op == OP_BROADCAST || op == OP_REDUCE; }
static int op_blocked(int op) { return op == OP_ALLGATHER || op == OP_REDUCE_SCATTER || op == OP_ALLTOALL; }
static int op_has_inplace(int op) {
  return op == OP_ALLREDUCE || op == OP_REDUCE || op == OP_ALLGATHER || op == OP_REDUCE_SCATTER;
}
static double bus_factor(int op, int n) {
  switch (op) {
  case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
  case OP_ALLGATHER: case OP_REDUCE_SCATTER: case OP_ALLTOALL: return (double)(n - 1) / n;
  case OP_BARRIER: return 0.0;
  default: return 1.0;
  }
}
static int dt_is_float(int d) { return d == DT_HALF || d == DT_FLOAT || d == DT_DOUBLE || d == DT_BF16; }
static int dt_is_unsigned(int d) { return d == DT_UINT8 || d == DT_UINT32 || d == DT_UINT64; }
static int redop_bitwise(int r) { return r == R_BAND || r == R_BOR || r == R_BXOR; }

/* ------------------------------------------------------------------------------------------ */
/* float16 / bfloat16 (round to nearest even)                                                  */

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0); /* inf/nan */
  if (absx >= 0x477ff000u) return sign | 0x7c00;                                     /* overflow */
  if (absx < 0x38800000u) {                                                          /* subnormal */
    if (absx < 0x33000000u) return sign;
    uint32_t e = absx >> 23, man = (absx & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; /* 14 + (113 - e) */
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return sign | (uint16_t)half;
  }
  uint32_t r = absx + 0xfffu + ((absx >> 13) & 1); /* round to nearest even at bit 13 */
  return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* ------------------------------------------------------------------------------------------ */
/* Elements                                                                                    */

static uint64_t dt_mask(int d) { return dt_sizes[d] == 8 ? UINT64_MAX : (((uint64_t)1 << (8 * dt_sizes[d])) - 1); }

/* The bits of integer v as an element: integers wrap, floats convert. */
static uint64_t encode(int d, int64_t v) {
  switch (d) {
  case DT_HALF: return f32_to_f16((float)v);
  case DT_BF16: return f32_to_bf16((float)v);
  case DT_FLOAT: { float f = (float)v; uint32_t b; memcpy(&b, &f, 4); return b; }
  case DT_DOUBLE: { double f = (double)v; uint64_t b; memcpy(&b, &f, 8); return b; }
  default: return (uint64_t)v & dt_mask(d);
  }
}

static double decode_f64(int d, uint64_t b) {
  switch (d) {
  case DT_HALF: return f16_to_f32((uint16_t)b);
  case DT_BF16: return bf16_to_f32((uint16_t)b);
  case DT_FLOAT: { uint32_t u = (uint32_t)b; float f; memcpy(&f, &u, 4); return f; }
  case DT_DOUBLE: { double f; memcpy(&f, &b, 8); return f; }
  default: return (double)b;
  }
}

static int same(int d, uint64_t a, uint64_t b) {
  if (a == b) return 1;
  if (!dt_is_float(d)) return 0;
  double x = decode_f64(d, a), y = decode_f64(d, b);
  return x == y || (isnan(x) && isnan(y));
}

static uint64_t get_el(int d, const unsigned char *buf, size_t i) {
  size_t s = dt_sizes[d];
  switch (s) {
  case 1: return buf[i];
  case 2: { uint16_t v; memcpy(&v, buf + 2 * i, 2); return v; }
  case 4: { uint32_t v; memcpy(&v, buf + 4 * i, 4); return v; }
  default: { uint64_t v; memcpy(&v, buf + 8 * i, 8); return v; }
  }
}

static void put_el(int d, unsigned char *buf, size_t i, uint64_t bits) {
  switch (dt_sizes[d]) {
  case 1: buf[i] = (unsigned char)bits; break;
  case 2: { uint16_t v = (uint16_t)bits; memcpy(buf + 2 * i, &v, 2); break; }
  case 4: { uint32_t v = (uint32_t)bits; memcpy(buf + 4 * i, &v, 4); break; }
  default: memcpy(buf + 8 * i, &bits, 8); break;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Test data: identical to dc-bench's (src/bin/dc-bench/data.rs)                               */

static uint64_t mix(uint64_t r, uint64_t i, uint64_t s) {
  uint64_t x = (i * 0x9E3779B97F4A7C15ull) ^ ((r + 1) * 0xC2B2AE3D27D4EB4Full) ^ ((s + 1) * 0x165667B19E3779F9ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct data {
  int move; /* data movement (else a reduction with redop) */
  int redop;
  int dt;
  int n;
  int64_t range;
};

static struct data data_new(int move, int redop, int dt, int n) {
  struct data d = {move, redop, dt, n, 0};
  int64_t k = 120 / (n > 1 ? n : 1);
  d.range = k < 1 ? 1 : k > 8 ? 8 : k;
  return d;
}

static int64_t value(const struct data *d, int r, size_t i, uint64_t seed) {
  uint64_t h = mix((uint64_t)r, (uint64_t)i, seed);
  int uns = dt_is_unsigned(d->dt), fl = dt_is_float(d->dt);
  int64_t k = d->range;
  if (d->move) return fl ? (int64_t)(h % 257) - 128 : (int64_t)h;
  switch (d->redop) {
  case R_SUM: return uns ? (int64_t)(h % (uint64_t)(2 * k + 1)) : (int64_t)(h % (uint64_t)(2 * k + 1)) - k;
  case R_PROD:
    switch (h % 8) {
    case 0: return 2;
    case 1: return uns ? 3 : -1;
    case 2: return uns ? 1 : -1;
    default: return 1;
    }
  case R_MAX: case R_MIN: return uns ? (int64_t)(h % 201) : (int64_t)(h % 201) - 100;
  case R_AVG: {
    int64_t half = k / 2 > 1 ? k / 2 : 1;
    uint64_t hb = mix(UINT32_MAX, (uint64_t)i, seed);
    int64_t base = uns ? half + (int64_t)(hb % (uint64_t)(half + 1)) : (int64_t)(hb % (uint64_t)(2 * half + 1)) - half;
    int64_t t = (int64_t)(mix(0x100000000ull + (uint64_t)(r / 2), (uint64_t)i, seed) % (uint64_t)(half + 1));
    int64_t dv = (r % 2 == 1) ? -t : (r + 1 == d->n ? 0 : t);
    return (int64_t)((uint64_t)base + (uint64_t)dv);
  }
  default: return (int64_t)h; /* bitwise */
  }
}

static int64_t reduced(const struct data *d, size_t i, uint64_t seed) {
  int64_t acc = value(d, 0, i, seed);
  for (int r = 1; r < d->n; r++) {
    int64_t v = value(d, r, i, seed);
    switch (d->redop) {
    case R_SUM: case R_AVG: acc = (int64_t)((uint64_t)acc + (uint64_t)v); break;
    case R_PROD: acc = (int64_t)((uint64_t)acc * (uint64_t)v); break;
    case R_MAX: acc = v > acc ? v : acc; break;
    case R_MIN: acc = v < acc ? v : acc; break;
    case R_BAND: acc &= v; break;
    case R_BOR: acc |= v; break;
    default: acc ^= v; break;
    }
  }
  return d->redop == R_AVG ? acc / d->n : acc;
}

/* ------------------------------------------------------------------------------------------ */
/* MPI types and ops                                                                           */

#define HALF_OP(NAME, TO, FROM, EXPR)                                                         \
  static void NAME(void *in, void *inout, int *len, MPI_Datatype *t) {                       \
    (void)t;                                                                                 \
    const uint16_t *a = in;                                                                  \
    uint16_t *b = inout;                                                                     \
    for (int i = 0; i < *len; i++) {                                                         \
      float x = TO(a[i]), y = TO(b[i]);                                                      \
      b[i] = FROM(EXPR);                                                                     \
    }                                                                                        \
  }
HALF_OP(h_sum, f16_to_f32, f32_to_f16, x + y)
HALF_OP(h_prod, f16_to_f32, f32_to_f16, x * y)
HALF_OP(h_max, f16_to_f32, f32_to_f16, fmaxf(x, y))
HALF_OP(h_min, f16_to_f32, f32_to_f16, fminf(x, y))
HALF_OP(b_sum, bf16_to_f32, f32_to_bf16, x + y)
HALF_OP(b_prod, bf16_to_f32, f32_to_bf16, x * y)
HALF_OP(b_max, bf16_to_f32, f32_to_bf16, fmaxf(x, y))
HALF_OP(b_min, bf16_to_f32, f32_to_bf16, fminf(x, y))

static MPI_Op half_ops[2][4]; /* [half, bf16][sum, prod, max, min] */

static MPI_Datatype mpi_dt(int d) {
  switch (d) {
  case DT_INT8: return MPI_INT8_T;
  case DT_UINT8: return MPI_UINT8_T;
  case DT_INT32: return MPI_INT32_T;
  case DT_UINT32: return MPI_UINT32_T;
  case DT_INT64: return MPI_INT64_T;
  case DT_UINT64: return MPI_UINT64_T;
  case DT_FLOAT: return MPI_FLOAT;
  case DT_DOUBLE: return MPI_DOUBLE;
  default: return MPI_UINT16_T; /* half, bfloat16 */
  }
}

static MPI_Op mpi_op(int d, int r) {
  int base = r == R_AVG ? R_SUM : r;
  if (d == DT_HALF || d == DT_BF16) return half_ops[d == DT_BF16][base];
  switch (base) {
  case R_SUM: return MPI_SUM;
  case R_PROD: return MPI_PROD;
  case R_MAX: return MPI_MAX;
  case R_MIN: return MPI_MIN;
  case R_BAND: return MPI_BAND;
  case R_BOR: return MPI_BOR;
  default: return MPI_BXOR;
  }
}

/* Finishes avg: divides `count` elements by n in their type (integers truncate toward zero). */
static void divide(int d, void *buf, size_t count, int n) {
  switch (d) {
  case DT_INT8: { int8_t *p = buf; for (size_t i = 0; i < count; i++) p[i] = (int8_t)(p[i] / n); break; }
  case DT_UINT8: { uint8_t *p = buf; for (size_t i = 0; i < count; i++) p[i] = (uint8_t)(p[i] / (unsigned)n); break; }
  case DT_INT32: { int32_t *p = buf; for (size_t i = 0; i < count; i++) p[i] /= n; break; }
  case DT_UINT32: { uint32_t *p = buf; for (size_t i = 0; i < count; i++) p[i] /= (uint32_t)n; break; }
  case DT_INT64: { int64_t *p = buf; for (size_t i = 0; i < count; i++) p[i] /= n; break; }
  case DT_UINT64: { uint64_t *p = buf; for (size_t i = 0; i < count; i++) p[i] /= (uint64_t)n; break; }
  case DT_FLOAT: { float *p = buf; for (size_t i = 0; i < count; i++) p[i] /= (float)n; break; }
  case DT_DOUBLE: { double *p = buf; for (size_t i = 0; i < count; i++) p[i] /= (double)n; break; }
  case DT_HALF: { uint16_t *p = buf; for (size_t i = 0; i < count; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / (float)n); break; }
  default: { uint16_t *p = buf; for (size_t i = 0; i < count; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / (float)n); break; }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                     */

struct args {
  uint64_t minbytes, maxbytes, stepfactor, stepbytes;
  int ops[NOPS], nops;
  int dts[NDTS], ndts;
  int redops[NREDOPS], nredops;
  int root, warmup, iters, check;
  const char *csv, *label;
};

static const char usage[] =
    "usage: mpirun -np N mpi_bench [options]\n"
    "dc-bench's sweep over MPI; options as dc-bench's (see dc-bench --help):\n"
    "  -b SIZE  -e SIZE  -f F  -i SIZE  -o OPS  -d TYPES  --redop OPS  -r ROOT  -w N  -n N  -c N\n"
    "  --csv FILE  --label NAME (default: openmpi or mpich, from the MPI library)\n";

static int parse_size(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  uint64_t mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
  else if (*end == 'm' || *end == 'M') mul = 1ull << 20, end++;
  else if (*end == 'g' || *end == 'G') mul = 1ull << 30, end++;
  if (end[0] == 'i' && (end[1] == 'B' || end[1] == 'b')) end += 2;
  else if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  *out = (uint64_t)v * mul;
  return 0;
}

static int lookup(const char *name, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strcasecmp(name, names[i]) == 0) return i;
  return -1;
}

static int alias_dt(const char *s) {
  static const struct { const char *a; int d; } al[] = {
      {"char", DT_INT8}, {"int", DT_INT32}, {"float16", DT_HALF}, {"fp16", DT_HALF}, {"float32", DT_FLOAT},
      {"fp32", DT_FLOAT}, {"float64", DT_DOUBLE}, {"fp64", DT_DOUBLE}, {"bf16", DT_BF16}};
  for (size_t i = 0; i < sizeof al / sizeof al[0]; i++)
    if (strcasecmp(s, al[i].a) == 0) return al[i].d;
  return lookup(s, dt_names, NDTS);
}

static int alias_op(const char *s) {
  if (strcasecmp(s, "reducescatter") == 0 || strcasecmp(s, "reduce-scatter") == 0) return OP_REDUCE_SCATTER;
  if (strcasecmp(s, "bcast") == 0) return OP_BROADCAST;
  return lookup(s, op_names, NOPS);
}

/* Parses a comma-separated list (or "all") into out[]; returns the count or -1. */
static int parse_list(const char *v, int *out, int max, int (*find)(const char *)) {
  char buf[512];
  int n = 0;
  snprintf(buf, sizeof buf, "%s", v);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (strcasecmp(tok, "all") == 0) {
      for (int i = 0; i < max; i++) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= out[j] == i;
        if (!dup) out[n++] = i;
      }
      continue;
    }
    int x = find(tok);
    if (x < 0) return -1;
    int dup = 0;
    for (int j = 0; j < n; j++) dup |= out[j] == x;
    if (!dup && n < max) out[n++] = x;
  }
  return n > 0 ? n : -1;
}

static int find_redop(const char *s) { return lookup(s, redop_names, NREDOPS); }

static int parse_args(int argc, char **argv, struct args *a) {
  *a = (struct args){.minbytes = 8, .maxbytes = 64ull << 20, .stepfactor = 2, .stepbytes = 0,
                     .ops = {OP_ALLREDUCE}, .nops = 1, .dts = {DT_FLOAT}, .ndts = 1, .redops = {R_SUM},
                     .nredops = 1, .root = 0, .warmup = 5, .iters = 20, .check = 1, .csv = NULL, .label = NULL};
#if defined(OMPI_MAJOR_VERSION)
  a->label = "openmpi";
#elif defined(MPICH_VERSION)
  a->label = "mpich";
#else
  a->label = "mpi";
#endif
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    const char *v = NULL;
    char name[64];
    const char *eq = strchr(o, '=');
    if (o[0] == '-' && o[1] == '-' && eq) {
      snprintf(name, sizeof name, "%.*s", (int)(eq - o), o);
      v = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", o);
    }
#define IS(s, l) (strcmp(name, s) == 0 || strcmp(name, l) == 0)
#define VALUE()                                                                 \
  do {                                                                          \
    if (!v) {                                                                   \
      if (i + 1 >= argc) { fprintf(stderr, "mpi_bench: %s needs a value\n", name); return -1; } \
      v = argv[++i];                                                            \
    }                                                                           \
  } while (0)
    if (IS("-h", "--help")) { fputs(usage, stdout); return 1; }
    else if (IS("-b", "--minbytes")) { VALUE(); if (parse_size(v, &a->minbytes)) goto bad; }
    else if (IS("-e", "--maxbytes")) { VALUE(); if (parse_size(v, &a->maxbytes)) goto bad; }
    else if (IS("-f", "--stepfactor")) { VALUE(); a->stepfactor = strtoull(v, NULL, 10); if (a->stepfactor < 2) goto bad; }
    else if (IS("-i", "--stepbytes")) { VALUE(); if (parse_size(v, &a->stepbytes)) goto bad; }
    else if (IS("-o", "--op")) { VALUE(); if ((a->nops = parse_list(v, a->ops, NOPS, alias_op)) < 0) goto bad; }
    else if (IS("-d", "--datatype")) { VALUE(); if ((a->ndts = parse_list(v, a->dts, NDTS, alias_dt)) < 0) goto bad; }
    else if (IS("--redop", "--redop")) { VALUE(); if ((a->nredops = parse_list(v, a->redops, NREDOPS, find_redop)) < 0) goto bad; }
    else if (IS("-r", "--root")) { VALUE(); a->root = atoi(v); if (a->root < 0) goto bad; }
    else if (IS("-w", "--warmup_iters") || IS("--warmup-iters", "--warmup-iters")) { VALUE(); a->warmup = atoi(v); }
    else if (IS("-n", "--iters")) { VALUE(); a->iters = atoi(v); if (a->iters < 1) a->iters = 1; }
    else if (IS("-c", "--check")) { VALUE(); a->check = atoi(v); }
    else if (IS("--csv", "--csv")) { VALUE(); a->csv = v; }
    else if (IS("--label", "--label")) { VALUE(); a->label = v; }
    else { fprintf(stderr, "mpi_bench: unknown option %s\n", o); return -1; }
    continue;
  bad:
    fprintf(stderr, "mpi_bench: bad value for %s: %s\n", name, v ? v : "");
    return -1;
#undef IS
#undef VALUE
  }
  if (a->minbytes > a->maxbytes) { fprintf(stderr, "mpi_bench: minbytes > maxbytes\n"); return -1; }
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The benchmark                                                                               */

struct shape { size_t bytes, count, block; };

static int make_shape(int op, int d, int n, uint64_t size, struct shape *s) {
  size_t ts = dt_sizes[d];
  if (op == OP_BARRIER) { *s = (struct shape){0, 0, 0}; return 1; }
  if (op_blocked(op)) {
    size_t per = (size_t)size / (ts * (size_t)n);
    *s = (struct shape){per * n * ts, per * n, per};
  } else {
    *s = (struct shape){(size_t)size / ts * ts, (size_t)size / ts, (size_t)size / ts};
  }
  return s->count > 0 && s->count <= INT_MAX;
}

struct bench {
  int rank, n, root;
  unsigned char *send, *recv;
  uint64_t seed;
  MPI_Comm comm;
};

struct kase { int op, dt, redop; struct shape sh; };

static void call(struct bench *b, const struct kase *c, int inplace) {
  MPI_Datatype t = mpi_dt(c->dt);
  MPI_Op o = mpi_op(c->dt, c->redop >= 0 ? c->redop : R_SUM);
  int cnt = (int)c->sh.count, blk = (int)c->sh.block;
  int avg = c->redop == R_AVG;
  switch (c->op) {
  case OP_ALLREDUCE:
    MPI_Allreduce(inplace ? MPI_IN_PLACE : b->send, b->recv, cnt, t, o, b->comm);
    if (avg) divide(c->dt, b->recv, c->sh.count, b->n);
    break;
  case OP_REDUCE:
    if (inplace && b->rank == b->root) MPI_Reduce(MPI_IN_PLACE, b->recv, cnt, t, o, b->root, b->comm);
    else if (inplace) MPI_Reduce(b->recv, NULL, cnt, t, o, b->root, b->comm); /* recvbuf: root only */
    else MPI_Reduce(b->send, b->recv, cnt, t, o, b->root, b->comm);
    if (avg && b->rank == b->root) divide(c->dt, b->recv, c->sh.count, b->n);
    break;
  case OP_BROADCAST: MPI_Bcast(b->recv, cnt, t, b->root, b->comm); break;
  case OP_ALLGATHER:
    if (inplace) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->recv, blk, t, b->comm);
    else MPI_Allgather(b->send, blk, t, b->recv, blk, t, b->comm);
    break;
  case OP_REDUCE_SCATTER:
    MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : b->send, b->recv, blk, t, o, b->comm);
    if (avg) divide(c->dt, b->recv, c->sh.block, b->n);
    break;
  case OP_ALLTOALL: MPI_Alltoall(b->send, blk, t, b->recv, blk, t, b->comm); break;
  case OP_SENDRECV:
    MPI_Sendrecv(b->send, cnt, t, (b->rank + 1) % b->n, 0, b->recv, cnt, t, (b->rank + b->n - 1) % b->n, 0,
                 b->comm, MPI_STATUS_IGNORE);
    break;
  default: MPI_Barrier(b->comm); break;
  }
}

static struct data case_data(const struct bench *b, const struct kase *c) {
  return op_reduces(c->op) && c->redop >= 0 ? data_new(0, c->redop, c->dt, b->n) : data_new(1, 0, c->dt, b->n);
}

static void fill(const struct data *d, unsigned char *buf, size_t from, size_t elems, int src, uint64_t seed) {
  for (size_t i = 0; i < elems; i++) put_el(d->dt, buf, from + i, encode(d->dt, value(d, src, i, seed)));
}

static void prepare(struct bench *b, const struct kase *c, int inplace, uint64_t seed) {
  struct data d = case_data(b, c);
  struct shape sh = c->sh;
  int poison = 0xA5 ^ (unsigned char)((unsigned char)seed * 0x3B);
  switch (c->op) {
  case OP_ALLREDUCE: case OP_REDUCE:
    if (inplace) fill(&d, b->recv, 0, sh.count, b->rank, seed);
    else { fill(&d, b->send, 0, sh.count, b->rank, seed); memset(b->recv, poison, sh.bytes); }
    break;
  case OP_BROADCAST:
    if (b->rank == b->root) fill(&d, b->recv, 0, sh.count, b->rank, seed);
    else memset(b->recv, poison, sh.bytes);
    break;
  case OP_ALLGATHER:
    memset(b->recv, poison, sh.bytes);
    if (inplace) fill(&d, b->recv, (size_t)b->rank * sh.block, sh.block, b->rank, seed);
    else fill(&d, b->send, 0, sh.block, b->rank, seed);
    break;
  case OP_REDUCE_SCATTER:
    if (inplace) fill(&d, b->recv, 0, sh.count, b->rank, seed);
    else { fill(&d, b->send, 0, sh.count, b->rank, seed); memset(b->recv, poison, sh.block * dt_sizes[c->dt]); }
    break;
  case OP_ALLTOALL: case OP_SENDRECV:
    fill(&d, b->send, 0, sh.count, b->rank, seed);
    memset(b->recv, poison, sh.bytes);
    break;
  default: break;
  }
}

static uint64_t verify(struct bench *b, const struct kase *c, int inplace, uint64_t seed) {
  struct data d = case_data(b, c);
  struct shape sh = c->sh;
  int dt = c->dt, n = b->n, rank = b->rank;
  uint64_t wrong = 0;
#define EXPECT(idx, bits) wrong += !same(dt, get_el(dt, b->recv, (idx)), (bits))
  switch (c->op) {
  case OP_ALLREDUCE:
    for (size_t i = 0; i < sh.count; i++) EXPECT(i, encode(dt, reduced(&d, i, seed)));
    break;
  case OP_REDUCE:
    if (rank == b->root)
      for (size_t i = 0; i < sh.count; i++) EXPECT(i, encode(dt, reduced(&d, i, seed)));
    break;
  case OP_BROADCAST:
    for (size_t i = 0; i < sh.count; i++) EXPECT(i, encode(dt, value(&d, b->root, i, seed)));
    break;
  case OP_ALLGATHER:
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < sh.block; i++) EXPECT(j * sh.block + i, encode(dt, value(&d, j, i, seed)));
    break;
  case OP_REDUCE_SCATTER: /* MPI's in-place result is at the start of the buffer */
    for (size_t i = 0; i < sh.block; i++) EXPECT(i, encode(dt, reduced(&d, (size_t)rank * sh.block + i, seed)));
    (void)inplace;
    break;
  case OP_ALLTOALL:
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < sh.block; i++)
        EXPECT(j * sh.block + i, encode(dt, value(&d, j, (size_t)rank * sh.block + i, seed)));
    break;
  case OP_SENDRECV:
    for (size_t i = 0; i < sh.count; i++) EXPECT(i, encode(dt, value(&d, (rank + n - 1) % n, i, seed)));
    break;
  default: break;
  }
#undef EXPECT
  return wrong;
}

static void measure(struct bench *b, const struct kase *c, int inplace, const struct args *a, double *time,
                    long long *wrong) {
  prepare(b, c, inplace, 0);
  for (int i = 0; i < a->warmup; i++) call(b, c, inplace);
  MPI_Barrier(b->comm);
  double t0 = MPI_Wtime();
  for (int i = 0; i < a->iters; i++) call(b, c, inplace);
  double mine = (MPI_Wtime() - t0) / a->iters;
  MPI_Allreduce(&mine, time, 1, MPI_DOUBLE, MPI_MAX, b->comm);
  if (a->check == 0) { *wrong = -1; return; }
  long long w = 0;
  for (int k = 0; k < a->check; k++) {
    uint64_t seed = ++b->seed;
    prepare(b, c, inplace, seed);
    call(b, c, inplace);
    if (getenv("DC_BENCH_INJECT_WRONG") && strcmp(getenv("DC_BENCH_INJECT_WRONG"), "1") == 0 && b->rank == 0 &&
        c->sh.bytes > 0)
      b->recv[0] ^= 0x5A; /* test hook, as in dc-bench */
    w += (long long)verify(b, c, inplace, seed);
  }
  MPI_Allreduce(&w, wrong, 1, MPI_LONG_LONG, MPI_SUM, b->comm);
}

static const char *fmt_time(double us, char *buf, size_t n) {
  snprintf(buf, n, us >= 10000.0 ? "%.0f" : us >= 100.0 ? "%.1f" : "%.2f", us);
  return buf;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  struct args a;
  int pr = parse_args(argc, argv, &a);
  if (pr != 0) {
    MPI_Finalize();
    return pr > 0 ? 0 : 2;
  }
  if (a.root >= n) {
    if (rank == 0) fprintf(stderr, "mpi_bench: --root %d is not a rank of this %d-rank job\n", a.root, n);
    MPI_Finalize();
    return 2;
  }
  MPI_User_function *fns[2][4] = {{h_sum, h_prod, h_max, h_min}, {b_sum, b_prod, b_max, b_min}};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) MPI_Op_create(fns[i][j], 1, &half_ops[i][j]);

  size_t bufsize = a.maxbytes > 64 ? (size_t)a.maxbytes : 64;
  struct bench b = {rank, n, a.root, NULL, NULL, 0, MPI_COMM_WORLD};
  if (posix_memalign((void **)&b.send, 4096, bufsize) || posix_memalign((void **)&b.recv, 4096, bufsize)) {
    fprintf(stderr, "mpi_bench: cannot allocate %zu bytes\n", bufsize);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(b.send, 0, bufsize);
  memset(b.recv, 0, bufsize);

  /* Host names, gathered. */
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  char *hosts = calloc((size_t)n, 64);
  MPI_Allgather(host, 64, MPI_CHAR, hosts, 64, MPI_CHAR, MPI_COMM_WORLD);

  FILE *csv = NULL;
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len;
    MPI_Get_library_version(lib, &len);
    char *nl = strpbrk(lib, "\n,");
    if (nl) *nl = 0;
    int same_host = 1;
    for (int r = 1; r < n; r++) same_host &= strcmp(hosts + 64 * r, hosts) == 0;
    const char *btl = getenv("OMPI_MCA_btl");
    printf("# mpi_bench: %s, %d ranks, transport mpi%s%s%s, %s %s%s\n", lib, n, btl ? " (btl " : "", btl ? btl : "",
           btl ? ")" : "", same_host ? "host" : "hosts", hosts, same_host ? "" : ", ...");
    if (a.stepbytes)
      printf("# sizes %llu to %llu bytes, step %llu bytes; ", (unsigned long long)a.minbytes,
             (unsigned long long)a.maxbytes, (unsigned long long)a.stepbytes);
    else
      printf("# sizes %llu to %llu bytes, step factor %llu; ", (unsigned long long)a.minbytes,
             (unsigned long long)a.maxbytes, (unsigned long long)a.stepfactor);
    if (a.check) printf("warmup %d and %d timed iterations per size; check %d run(s) per size; root %d\n", a.warmup, a.iters, a.check, a.root);
    else printf("warmup %d and %d timed iterations per size; check off; root %d\n", a.warmup, a.iters, a.root);
    printf("# time: the slowest rank's average per iteration; algbw = size/time; busbw = algbw x nccl-tests' factor\n");
    if (a.csv) {
      csv = fopen(a.csv, "w");
      if (!csv) { perror(a.csv); MPI_Abort(MPI_COMM_WORLD, 1); }
      fprintf(csv, "op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl\n");
      fflush(csv);
    }
  }

  long long total_wrong = 0;
  double bw_sum = 0;
  int bw_rows = 0;
  char tb[32];
  for (int oi = 0; oi < a.nops; oi++) {
    int op = a.ops[oi];
    if (rank == 0) {
      printf("#\n# op: %s\n", op_names[op]);
      printf("# %10s %12s %9s %6s %5s  %-36s  %-36s\n", "", "", "", "", "", "            out-of-place", "              in-place");
      printf("# %10s %12s %9s %6s %5s  %9s %8s %8s %8s  %9s %8s %8s %8s\n", "size", "count", "type", "redop", "root",
             "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
      printf("# %10s %12s %9s %6s %5s  %9s %8s %8s %8s  %9s %8s %8s %8s\n", "(B)", "(elements)", "", "", "", "(us)",
             "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    int ndts = op == OP_BARRIER ? 1 : a.ndts;
    for (int di = 0; di < ndts; di++) {
      int dt = op == OP_BARRIER ? DT_UINT8 : a.dts[di];
      int nr = op_reduces(op) ? a.nredops : 1;
      for (int ri = 0; ri < nr; ri++) {
        int redop = op_reduces(op) ? a.redops[ri] : -1;
        if (redop >= 0 && redop_bitwise(redop) && dt_is_float(dt)) continue;
        size_t last = (size_t)-1;
        uint64_t s = op == OP_BARRIER ? 0 : a.minbytes;
        for (;;) {
          struct shape sh;
          if (make_shape(op, dt, n, s, &sh) && sh.bytes != last) {
            last = sh.bytes;
            struct kase c = {op, dt, redop, sh};
            const char *tname = op == OP_BARRIER ? "none" : dt_names[dt];
            const char *rname = redop >= 0 ? redop_names[redop] : "none";
            int root = op_has_root(op) ? a.root : -1;
            char line[512];
            int off = snprintf(line, sizeof line, "  %10zu %12zu %9s %6s %5d", sh.bytes, sh.count, tname, rname, root);
            for (int inplace = 0; inplace < 2; inplace++) {
              if (inplace && !op_has_inplace(op)) {
                off += snprintf(line + off, sizeof line - off, "  %9s %8s %8s %8s", "N/A", "N/A", "N/A", "N/A");
                continue;
              }
              double secs;
              long long wrong;
              measure(&b, &c, inplace, &a, &secs, &wrong);
              double us = secs * 1e6;
              double algbw = secs > 0 ? (double)sh.bytes / secs / 1e9 : 0;
              double busbw = algbw * bus_factor(op, n);
              if (wrong > 0) total_wrong += wrong;
              if (op != OP_BARRIER) { bw_sum += busbw; bw_rows++; }
              char ws[24];
              if (wrong < 0) snprintf(ws, sizeof ws, "N/A"); else snprintf(ws, sizeof ws, "%lld", wrong);
              off += snprintf(line + off, sizeof line - off, "  %9s %8.2f %8.2f %8s", fmt_time(us, tb, sizeof tb), algbw, busbw, ws);
              if (csv) {
                fprintf(csv, "%s,%zu,%zu,%s,%s,%d,%d,%.3f,%.6f,%.6f,%lld,%d,%s\n", op_names[op], sh.bytes, sh.count, tname,
                        rname, root, inplace, us, algbw, busbw, wrong, n, a.label);
                fflush(csv);
              }
            }
            if (rank == 0) { puts(line); fflush(stdout); }
          }
          if (op == OP_BARRIER) break;
          uint64_t next = a.stepbytes ? s + a.stepbytes : (s ? s : 1) * a.stepfactor;
          if (next > a.maxbytes || next <= s) break;
          s = next;
        }
      }
    }
  }
  if (rank == 0) {
    printf("#\n");
    if (a.check) printf("# wrong elements: %lld %s\n", total_wrong, total_wrong ? "(FAILED)" : "(OK)");
    else printf("# wrong elements: not checked (--check 0)\n");
    if (bw_rows) printf("# avg bus bandwidth: %.4f GB/s (mean over the rows above)\n", bw_sum / bw_rows);
    if (csv) fclose(csv);
  }
  free(hosts);
  free(b.send);
  free(b.recv);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) MPI_Op_free(&half_ops[i][j]);
  MPI_Finalize();
  return total_wrong > 0 ? 3 : 0;
}
