/*
 * bench_common.h: the benchmark that bench/mpi_bench.c and bench/oneccl_bench.cpp share.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Included by those two programs only: mpi_bench.c compiles it as C11, oneccl_bench.cpp as
 * C++17, so it is written in the common subset of the two languages (static functions and
 * static const tables, explicit casts from void *, no designated initializers and no compound
 * literals). Neither build needs an -I for it: #include "bench_common.h" finds it beside them.
 *
 * It holds what makes the rows of dc-bench (src/bin/dc-bench) and the two programs compare one
 * for one: the names of ops, types and reductions; float16/bfloat16 conversion; the test data
 * (identical to dc-bench's, src/bin/dc-bench/data.rs) and the result checks; avg's division of
 * a sum; the options and their parsing; the sizes swept; the buffers and the host names; the
 * header lines after the first, the table, its CSV rows and the summary. Both programs run as
 * MPI processes, and MPI does the untimed bookkeeping here (the slowest rank's time, the wrong
 * elements over all ranks, the host names); it needs <mpi.h>, which it includes.
 *
 * Each program keeps what is its library's own: its start-up, a struct program (its name, its
 * --help text, how it names an unknown option, what its library lacks or does differently), the
 * calls themselves (struct bench's call), the timed loop (measure, which calls the library's
 * barrier and call directly, not through a pointer) and its first header line. mpi_bench.c
 * defines _POSIX_C_SOURCE before including <mpi.h> and this header.
 */
#ifndef DISTCOMM_BENCH_COMMON_H
#define DISTCOMM_BENCH_COMMON_H

#include <mpi.h>

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

enum op {
  OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_ALLTOALL, OP_SENDRECV, OP_BARRIER,
  OP_GATHER, OP_SCATTER, OP_ALLGATHERV, OP_ALLTOALLV, NOPS
};
static const char *const op_names[NOPS] = {"allreduce", "broadcast",  "reduce",  "allgather",
                                           "reduce_scatter", "alltoall", "sendrecv", "barrier",
                                           "gather",    "scatter",    "allgatherv", "alltoallv"};

enum dt { DT_INT8, DT_UINT8, DT_INT32, DT_UINT32, DT_INT64, DT_UINT64, DT_HALF, DT_FLOAT, DT_DOUBLE, DT_BF16, NDTS };
static const char *const dt_names[NDTS] = {"int8", "uint8", "int32", "uint32", "int64",
                                           "uint64", "half", "float", "double", "bfloat16"};
static const size_t dt_sizes[NDTS] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

enum redop { R_SUM, R_PROD, R_MAX, R_MIN, R_AVG, R_BAND, R_BOR, R_BXOR, NREDOPS };
static const char *const redop_names[NREDOPS] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"};

static int op_reduces(int op) { return op == OP_ALLREDUCE || op == OP_REDUCE || op == OP_REDUCE_SCATTER; }
static int op_has_root(int op) { return op == OP_BROADCAST || op == OP_REDUCE || op == OP_GATHER || op == OP_SCATTER; }
/* Buffers split into one block per rank (the size is the total of the blocks). The v forms are
   timed with every count the block and block j at j * block, as OSU's benchmarks call them. */
static int op_blocked(int op) {
  return op == OP_ALLGATHER || op == OP_REDUCE_SCATTER || op == OP_ALLTOALL || op == OP_GATHER || op == OP_SCATTER ||
         op == OP_ALLGATHERV || op == OP_ALLTOALLV;
}
static int op_has_inplace(int op) {
  return op == OP_ALLREDUCE || op == OP_REDUCE || op == OP_ALLGATHER || op == OP_REDUCE_SCATTER;
}
static double bus_factor(int op, int n) {
  switch (op) {
  case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
  case OP_ALLGATHER: case OP_REDUCE_SCATTER: case OP_ALLTOALL: case OP_GATHER: case OP_SCATTER:
  case OP_ALLGATHERV: case OP_ALLTOALLV: return (double)(n - 1) / n;
  case OP_BARRIER: return 0.0;
  default: return 1.0;
  }
}
static int dt_is_float(int d) { return d == DT_HALF || d == DT_FLOAT || d == DT_DOUBLE || d == DT_BF16; }
static int dt_is_unsigned(int d) { return d == DT_UINT8 || d == DT_UINT32 || d == DT_UINT64; }
static int redop_bitwise(int r) { return r == R_BAND || r == R_BOR || r == R_BXOR; }

/* ------------------------------------------------------------------------------------------ */
/* float16 / bfloat16 (round to nearest even), as dc-bench encodes them                        */

static float bits_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

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
  return bits_f32(bits);
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
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

static float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
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
  case DT_FLOAT: return f32_bits((float)v);
  case DT_DOUBLE: { double f = (double)v; uint64_t b; memcpy(&b, &f, 8); return b; }
  default: return (uint64_t)v & dt_mask(d);
  }
}

static double decode_f64(int d, uint64_t b) {
  switch (d) {
  case DT_HALF: return f16_to_f32((uint16_t)b);
  case DT_BF16: return bf16_to_f32((uint16_t)b);
  case DT_FLOAT: return bits_f32((uint32_t)b);
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
  switch (dt_sizes[d]) {
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

/* Finishes avg, which neither MPI nor oneCCL's host path has: sum, then `count` elements divided
   by n in their type (integers truncate toward zero), timed with the call (what a user writes). */
static void divide(int d, void *buf, size_t count, int n) {
  switch (d) {
  case DT_INT8: { int8_t *p = (int8_t *)buf; for (size_t i = 0; i < count; i++) p[i] = (int8_t)(p[i] / n); break; }
  case DT_UINT8: { uint8_t *p = (uint8_t *)buf; for (size_t i = 0; i < count; i++) p[i] = (uint8_t)(p[i] / (unsigned)n); break; }
  case DT_INT32: { int32_t *p = (int32_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= n; break; }
  case DT_UINT32: { uint32_t *p = (uint32_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= (uint32_t)n; break; }
  case DT_INT64: { int64_t *p = (int64_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= n; break; }
  case DT_UINT64: { uint64_t *p = (uint64_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= (uint64_t)n; break; }
  case DT_FLOAT: { float *p = (float *)buf; for (size_t i = 0; i < count; i++) p[i] /= (float)n; break; }
  case DT_DOUBLE: { double *p = (double *)buf; for (size_t i = 0; i < count; i++) p[i] /= (double)n; break; }
  case DT_HALF: { uint16_t *p = (uint16_t *)buf; for (size_t i = 0; i < count; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / (float)n); break; }
  default: { uint16_t *p = (uint16_t *)buf; for (size_t i = 0; i < count; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / (float)n); break; }
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

/* Rank r's input element i for the given seed. */
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
  case R_AVG: { /* a base shared by all ranks, plus offsets that cancel in pairs */
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

/* Element i of the reduction over all ranks. */
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
/* The program                                                                                 */

/* What tells the two programs apart here. */
struct program {
  const char *name;  /* mpi_bench or oneccl_bench: the start of every message */
  const char *usage; /* the --help text */
  int unknown_whole; /* an unknown --name=value is named whole (mpi_bench) or by its name (oneccl_bench) */
  int bitwise;       /* the library has band, bor and bxor (on integer types) */
  int rs_own_block;  /* reduce_scatter in place leaves its result in this rank's block of the
                        buffer (oneCCL, dc-bench), else at its start (MPI) */
  const char *lacks; /* ops the library has no call for, comma-separated (skipped, said once) */
};

/* ------------------------------------------------------------------------------------------ */
/* Options (dc-bench's)                                                                        */

struct args {
  uint64_t minbytes, maxbytes, stepfactor, stepbytes;
  int ops[NOPS], nops;
  int dts[NDTS], ndts;
  int redops[NREDOPS], nredops;
  int root, warmup, iters, check;
  const char *csv, *label;
};

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

static int find_dt(const char *s) {
  static const struct { const char *alias; int d; } al[] = {
      {"char", DT_INT8}, {"int", DT_INT32}, {"float16", DT_HALF}, {"fp16", DT_HALF}, {"float32", DT_FLOAT},
      {"fp32", DT_FLOAT}, {"float64", DT_DOUBLE}, {"fp64", DT_DOUBLE}, {"bf16", DT_BF16}};
  for (size_t i = 0; i < sizeof al / sizeof al[0]; i++)
    if (strcasecmp(s, al[i].alias) == 0) return al[i].d;
  return lookup(s, dt_names, NDTS);
}

static int find_op(const char *s) {
  if (strcasecmp(s, "reducescatter") == 0 || strcasecmp(s, "reduce-scatter") == 0) return OP_REDUCE_SCATTER;
  if (strcasecmp(s, "bcast") == 0) return OP_BROADCAST;
  return lookup(s, op_names, NOPS);
}

static int find_redop(const char *s) { return lookup(s, redop_names, NREDOPS); }

/* A comma-separated list of names (or all) into out[], each once: the count, or -1 on an unknown
   name or an empty list. */
static int parse_list(const char *v, int *out, int max, int (*find)(const char *)) {
  int n = 0;
  for (const char *at = v;; at++) {
    size_t len = strcspn(at, ",");
    if (len > 0) {
      char tok[64];
      int first, last;
      if (len >= sizeof tok) return -1; /* longer than any name */
      memcpy(tok, at, len);
      tok[len] = 0;
      if (strcasecmp(tok, "all") == 0) {
        first = 0;
        last = max - 1;
      } else {
        first = last = find(tok);
        if (first < 0) return -1;
      }
      for (int x = first; x <= last; x++) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= out[j] == x;
        if (!dup && n < max) out[n++] = x;
      }
    }
    at += len;
    if (!*at) break;
  }
  return n > 0 ? n : -1;
}

/* Whether the option's name (its first len bytes) is s or l. */
static int opt_is(const char *o, size_t len, const char *s, const char *l) {
  return (strlen(s) == len && strncmp(o, s, len) == 0) || (strlen(l) == len && strncmp(o, l, len) == 0);
}

/* The option's value into *v: the text after its = or the next argument; 0 (said) if none. */
static int opt_value(int argc, char **argv, int *i, const char **v, const char *prog, const char *o, size_t len) {
  if (*v) return 1;
  if (*i + 1 >= argc) {
    fprintf(stderr, "%s: %.*s needs a value\n", prog, (int)len, o);
    return 0;
  }
  *v = argv[++*i];
  return 1;
}

/* 0: run; 1: --help printed; -1: bad options (message printed). */
static int parse_args(int argc, char **argv, struct args *a, const struct program *p) {
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = NULL, *eq = strchr(o, '=');
    size_t len = strlen(o); /* of the name */
    if (o[0] == '-' && o[1] == '-' && eq) {
      len = (size_t)(eq - o);
      v = eq + 1;
    }
#define IS(s, l) opt_is(o, len, s, l)
#define VALUE() opt_value(argc, argv, &i, &v, p->name, o, len)
    int ok;
    if (IS("-h", "--help")) { fputs(p->usage, stdout); return 1; }
    else if (IS("-b", "--minbytes")) ok = VALUE() && parse_size(v, &a->minbytes) == 0;
    else if (IS("-e", "--maxbytes")) ok = VALUE() && parse_size(v, &a->maxbytes) == 0;
    else if (IS("-f", "--stepfactor")) ok = VALUE() && (a->stepfactor = strtoull(v, NULL, 10)) >= 2;
    else if (IS("-i", "--stepbytes")) ok = VALUE() && parse_size(v, &a->stepbytes) == 0;
    else if (IS("-o", "--op")) ok = VALUE() && (a->nops = parse_list(v, a->ops, NOPS, find_op)) > 0;
    else if (IS("-d", "--datatype")) ok = VALUE() && (a->ndts = parse_list(v, a->dts, NDTS, find_dt)) > 0;
    else if (IS("--redop", "--redop")) ok = VALUE() && (a->nredops = parse_list(v, a->redops, NREDOPS, find_redop)) > 0;
    else if (IS("-r", "--root")) ok = VALUE() && (a->root = atoi(v)) >= 0;
    else if (IS("-w", "--warmup_iters") || IS("--warmup-iters", "--warmup-iters")) { if ((ok = VALUE())) a->warmup = atoi(v); }
    else if (IS("-n", "--iters")) { if ((ok = VALUE())) { a->iters = atoi(v); if (a->iters < 1) a->iters = 1; } }
    else if (IS("-c", "--check")) { if ((ok = VALUE())) a->check = atoi(v); }
    else if (IS("--csv", "--csv")) { if ((ok = VALUE())) a->csv = v; }
    else if (IS("--label", "--label")) { if ((ok = VALUE())) a->label = v; }
    else { fprintf(stderr, "%s: unknown option %.*s\n", p->name, p->unknown_whole ? (int)strlen(o) : (int)len, o); return -1; }
#undef IS
#undef VALUE
    if (!ok) {
      if (v) fprintf(stderr, "%s: bad value for %.*s: %s\n", p->name, (int)len, o, v);
      return -1;
    }
  }
  if (a->minbytes > a->maxbytes) { fprintf(stderr, "%s: minbytes > maxbytes\n", p->name); return -1; }
  return 0;
}

/* The options with `label` as --label's default, and the root checked against this job of n
   ranks: -1 to run, else the exit code (0 after --help), the message printed; MPI is left to the
   caller to finalize. */
static int bench_options(int argc, char **argv, int rank, int n, const char *label, const struct program *p,
                         struct args *a) {
  memset(a, 0, sizeof *a);
  a->minbytes = 8;
  a->maxbytes = 64ull << 20;
  a->stepfactor = 2;
  a->ops[0] = OP_ALLREDUCE;
  a->nops = 1;
  a->dts[0] = DT_FLOAT;
  a->ndts = 1;
  a->redops[0] = R_SUM;
  a->nredops = 1;
  a->warmup = 5;
  a->iters = 20;
  a->check = 1;
  a->csv = NULL;
  a->label = label;
  int pr = parse_args(argc, argv, a, p);
  if (pr != 0) return pr > 0 ? 0 : 2;
  if (a->root >= n) {
    if (rank == 0) fprintf(stderr, "%s: --root %d is not a rank of this %d-rank job\n", p->name, a->root, n);
    return 2;
  }
  return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* The benchmark                                                                               */

struct shape { size_t bytes, count, block; };

static int make_shape(int op, int d, int n, uint64_t size, struct shape *s) {
  size_t ts = dt_sizes[d];
  s->bytes = s->count = s->block = 0;
  if (op == OP_BARRIER) return 1;
  if (op_blocked(op)) {
    size_t per = (size_t)size / (ts * (size_t)n);
    s->bytes = per * n * ts;
    s->count = per * n;
    s->block = per;
  } else {
    s->bytes = (size_t)size / ts * ts;
    s->count = s->block = (size_t)size / ts;
  }
  return s->count > 0 && s->count <= INT_MAX;
}

struct kase { int op, dt, redop; struct shape sh; };

struct bench {
  int rank, n, root;
  unsigned char *send, *recv;
  uint64_t seed; /* the last check's */
  const struct program *prog;
  void *comm; /* the library's communicator, for call (mpi_bench: NULL, it uses MPI_COMM_WORLD) */
  void (*call)(struct bench *b, const struct kase *c, int inplace); /* one call of the op, waited for */
};

/* This rank's bench, with its buffers (maxbytes, at least 64, page-aligned, zeroed). */
static void bench_init(struct bench *b, int rank, int n, const struct args *a, const struct program *p, void *comm,
                       void (*call)(struct bench *, const struct kase *, int)) {
  size_t bufsize = a->maxbytes > 64 ? (size_t)a->maxbytes : 64;
  b->rank = rank;
  b->n = n;
  b->root = a->root;
  b->send = b->recv = NULL;
  b->seed = 0;
  b->prog = p;
  b->comm = comm;
  b->call = call;
  if (posix_memalign((void **)&b->send, 4096, bufsize) || posix_memalign((void **)&b->recv, 4096, bufsize)) {
    fprintf(stderr, "%s: cannot allocate %zu bytes\n", p->name, bufsize);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(b->send, 0, bufsize);
  memset(b->recv, 0, bufsize);
}

static void bench_free(struct bench *b) {
  free(b->send);
  free(b->recv);
}

static struct data case_data(const struct bench *b, const struct kase *c) {
  return op_reduces(c->op) && c->redop >= 0 ? data_new(0, c->redop, c->dt, b->n) : data_new(1, 0, c->dt, b->n);
}

static void fill(const struct data *d, unsigned char *buf, size_t from, size_t elems, int src, uint64_t seed) {
  for (size_t i = 0; i < elems; i++) put_el(d->dt, buf, from + i, encode(d->dt, value(d, src, i, seed)));
}

/* This rank's inputs for seed; the outputs filled with a poison pattern. */
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
  case OP_ALLGATHER: case OP_ALLGATHERV: case OP_GATHER:
    memset(b->recv, poison, sh.bytes);
    if (inplace) fill(&d, b->recv, (size_t)b->rank * sh.block, sh.block, b->rank, seed);
    else fill(&d, b->send, 0, sh.block, b->rank, seed);
    break;
  case OP_SCATTER:
    if (b->rank == b->root) fill(&d, b->send, 0, sh.count, b->rank, seed);
    memset(b->recv, poison, sh.block * dt_sizes[c->dt]);
    break;
  case OP_REDUCE_SCATTER:
    if (inplace) fill(&d, b->recv, 0, sh.count, b->rank, seed);
    else { fill(&d, b->send, 0, sh.count, b->rank, seed); memset(b->recv, poison, sh.block * dt_sizes[c->dt]); }
    break;
  case OP_ALLTOALL: case OP_ALLTOALLV: case OP_SENDRECV:
    fill(&d, b->send, 0, sh.count, b->rank, seed);
    memset(b->recv, poison, sh.bytes);
    break;
  default: break;
  }
}

/* This rank's wrong output elements for seed. */
static uint64_t verify(const struct bench *b, const struct kase *c, int inplace, uint64_t seed) {
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
  case OP_ALLGATHER: case OP_ALLGATHERV: case OP_GATHER:
    if (c->op == OP_GATHER && rank != b->root) break; /* the root's result is an allgather's */
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < sh.block; i++) EXPECT(j * sh.block + i, encode(dt, value(&d, j, i, seed)));
    break;
  case OP_SCATTER:
    for (size_t i = 0; i < sh.block; i++) EXPECT(i, encode(dt, value(&d, b->root, (size_t)rank * sh.block + i, seed)));
    break;
  case OP_REDUCE_SCATTER: { /* in place: see struct program's rs_own_block */
    size_t at = inplace && b->prog->rs_own_block ? (size_t)rank * sh.block : 0;
    for (size_t i = 0; i < sh.block; i++) EXPECT(at + i, encode(dt, reduced(&d, (size_t)rank * sh.block + i, seed)));
    break;
  }
  case OP_ALLTOALL: case OP_ALLTOALLV:
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

/* Whether op is in the program's list of ops its library lacks. */
static int program_lacks(const struct program *p, int op) {
  int lacked[NOPS], n = p->lacks ? parse_list(p->lacks, lacked, NOPS, find_op) : 0;
  for (int i = 0; i < n; i++)
    if (lacked[i] == op) return 1;
  return 0;
}

/* The slowest rank's time, from this rank's (a program's measure ends its timing with it). */
static double slowest(double mine) {
  double t;
  MPI_Allreduce(&mine, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

/* The checks of one form of a case, after its timing: --check runs, each with the next seed,
   prepared, called and verified; the wrong elements over all ranks (-1: --check 0). */
static long long check_calls(struct bench *b, const struct kase *c, int inplace, const struct args *a) {
  if (a->check == 0) return -1;
  long long w = 0, wrong;
  const char *inject = getenv("DC_BENCH_INJECT_WRONG");
  for (int k = 0; k < a->check; k++) {
    uint64_t seed = ++b->seed;
    prepare(b, c, inplace, seed);
    b->call(b, c, inplace);
    if (inject && strcmp(inject, "1") == 0 && b->rank == 0 && c->sh.bytes > 0) b->recv[0] ^= 0x5A; /* test hook, as in dc-bench */
    w += (long long)verify(b, c, inplace, seed);
  }
  MPI_Allreduce(&w, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return wrong;
}

static const char *fmt_time(double us, char *buf, size_t n) {
  snprintf(buf, n, us >= 10000.0 ? "%.0f" : us >= 100.0 ? "%.1f" : "%.2f", us);
  return buf;
}

/* Every rank's host name, 64 bytes each (to free); *same: all on one host. */
static char *gather_hosts(int n, int *same_host) {
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  char *hosts = (char *)calloc((size_t)n, 64);
  MPI_Allgather(host, 64, MPI_CHAR, hosts, 64, MPI_CHAR, MPI_COMM_WORLD);
  *same_host = 1;
  for (int r = 1; r < n; r++) *same_host &= strcmp(hosts + 64 * r, hosts) == 0;
  return hosts;
}

/* The header lines after the program's first (rank 0). */
static void print_settings(const struct args *a) {
  if (a->stepbytes)
    printf("# sizes %llu to %llu bytes, step %llu bytes; ", (unsigned long long)a->minbytes,
           (unsigned long long)a->maxbytes, (unsigned long long)a->stepbytes);
  else
    printf("# sizes %llu to %llu bytes, step factor %llu; ", (unsigned long long)a->minbytes,
           (unsigned long long)a->maxbytes, (unsigned long long)a->stepfactor);
  if (a->check) printf("warmup %d and %d timed iterations per size; check %d run(s) per size; root %d\n", a->warmup, a->iters, a->check, a->root);
  else printf("warmup %d and %d timed iterations per size; check off; root %d\n", a->warmup, a->iters, a->root);
  printf("# time: the slowest rank's average per iteration; algbw = size/time; busbw = algbw x nccl-tests' factor\n");
}

/* Times and checks one form of a case: the slowest rank's seconds per iteration, and the wrong
   elements over all ranks (-1: not checked). Each program's own, around its library's calls. */
typedef void measure_fn(struct bench *b, const struct kase *c, int inplace, const struct args *a, double *time,
                        long long *wrong);

/* The sweep: every op, type, reduction and size of the options, each form measured; the table on
   rank 0's stdout and, with --csv, its rows in that file; then the summary. Returns the wrong
   elements found. */
static long long sweep(struct bench *b, const struct args *a, measure_fn *measure) {
  int rank = b->rank, n = b->n;
  FILE *csv = NULL;
  if (rank == 0 && a->csv) {
    csv = fopen(a->csv, "w");
    if (!csv) { perror(a->csv); MPI_Abort(MPI_COMM_WORLD, 1); }
    fprintf(csv, "op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl\n");
    fflush(csv);
  }

  long long total_wrong = 0;
  double bw_sum = 0;
  int bw_rows = 0;
  char tb[32];
  for (int oi = 0; oi < a->nops; oi++) {
    int op = a->ops[oi];
    if (program_lacks(b->prog, op)) {
      if (rank == 0) printf("#\n# op: %s: the library has no such call, skipped\n", op_names[op]);
      continue;
    }
    if (rank == 0) {
      printf("#\n# op: %s\n", op_names[op]);
      printf("# %10s %12s %9s %6s %5s  %-36s  %-36s\n", "", "", "", "", "", "            out-of-place", "              in-place");
      printf("# %10s %12s %9s %6s %5s  %9s %8s %8s %8s  %9s %8s %8s %8s\n", "size", "count", "type", "redop", "root",
             "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
      printf("# %10s %12s %9s %6s %5s  %9s %8s %8s %8s  %9s %8s %8s %8s\n", "(B)", "(elements)", "", "", "", "(us)",
             "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    int ndts = op == OP_BARRIER ? 1 : a->ndts;
    for (int di = 0; di < ndts; di++) {
      int dt = op == OP_BARRIER ? DT_UINT8 : a->dts[di];
      int nr = op_reduces(op) ? a->nredops : 1;
      for (int ri = 0; ri < nr; ri++) {
        int redop = op_reduces(op) ? a->redops[ri] : -1;
        if (redop >= 0 && redop_bitwise(redop) && (dt_is_float(dt) || !b->prog->bitwise)) continue;
        size_t last = (size_t)-1;
        uint64_t s = op == OP_BARRIER ? 0 : a->minbytes;
        for (;;) {
          struct shape sh;
          if (make_shape(op, dt, n, s, &sh) && sh.bytes != last) {
            last = sh.bytes;
            struct kase c = {op, dt, redop, sh};
            const char *tname = op == OP_BARRIER ? "none" : dt_names[dt];
            const char *rname = redop >= 0 ? redop_names[redop] : "none";
            int root = op_has_root(op) ? a->root : -1;
            char line[512];
            int off = snprintf(line, sizeof line, "  %10zu %12zu %9s %6s %5d", sh.bytes, sh.count, tname, rname, root);
            for (int inplace = 0; inplace < 2; inplace++) {
              if (inplace && !op_has_inplace(op)) {
                off += snprintf(line + off, sizeof line - off, "  %9s %8s %8s %8s", "N/A", "N/A", "N/A", "N/A");
                continue;
              }
              double secs;
              long long wrong;
              measure(b, &c, inplace, a, &secs, &wrong);
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
                        rname, root, inplace, us, algbw, busbw, wrong, n, a->label);
                fflush(csv);
              }
            }
            if (rank == 0) { puts(line); fflush(stdout); }
          }
          if (op == OP_BARRIER) break;
          uint64_t next = a->stepbytes ? s + a->stepbytes : (s ? s : 1) * a->stepfactor;
          if (next > a->maxbytes || next <= s) break;
          s = next;
        }
      }
    }
  }
  if (rank == 0) {
    printf("#\n");
    if (a->check) printf("# wrong elements: %lld %s\n", total_wrong, total_wrong ? "(FAILED)" : "(OK)");
    else printf("# wrong elements: not checked (--check 0)\n");
    if (bw_rows) printf("# avg bus bandwidth: %.4f GB/s (mean over the rows above)\n", bw_sum / bw_rows);
    if (csv) fclose(csv);
    fflush(stdout);
  }
  return total_wrong;
}

#endif /* DISTCOMM_BENCH_COMMON_H */
