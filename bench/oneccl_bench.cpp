/*
 * oneccl_bench: the dc-bench sweep over Intel oneCCL, for side-by-side comparisons.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Same options, columns, test data, checks and CSV format as dc-bench (src/bin/dc-bench) and
 * bench/mpi_bench.c, so the rows of the three programs compare one for one:
 *   CCL_WORKER_OFFLOAD=0 CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm \
 *     mpiexec -n 2 ./oneccl_bench -b 8 -e 64M -f 2 -o allreduce --csv oneccl.csv
 * Build (bench/compare.sh --peer oneccl does this, against oneCCL's PyPI wheels and MPICH's):
 *   mpicxx -O2 -std=c++17 -I$CCL/include -o oneccl_bench bench/oneccl_bench.cpp -L$CCL/lib -lccl
 *
 * Start-up: the ranks are MPI processes (any MPI launcher); MPI gives rank and size, rank 0
 * creates oneCCL's main key-value store and MPI_Bcast hands its address to the others, which
 * join it; every rank then makes the oneCCL communicator. MPI is used for nothing else but the
 * untimed bookkeeping (host names, the slowest rank's time, the wrong-element count). oneCCL's
 * own transport is chosen by its environment: CCL_ATL_TRANSPORT=ofi (libfabric: FI_PROVIDER=tcp,
 * or FI_PROVIDER=shm with CCL_ATL_SHM=1, without which oneCCL refuses shm) or mpi (oneCCL's
 * messages go through the same MPI library, which must be MPICH-ABI: libmpi.so.12); oneCCL
 * wants MPI_THREAD_MULTIPLE, which is asked for.
 *
 * Mapping to oneCCL (host buffers, no stream; every call waited for): allreduce ccl::allreduce,
 * broadcast ccl::broadcast (one buffer), reduce ccl::reduce, allgather ccl::allgather,
 * reduce_scatter ccl::reduce_scatter, alltoall ccl::alltoall, sendrecv ccl::recv from rank-1 and
 * ccl::send to rank+1 (both posted, then both waited for), barrier ccl::barrier. In-place forms
 * as dc-bench's (nccl-tests'): the same pointer for allreduce and reduce; allgather's send
 * buffer is this rank's block of the receive buffer; reduce_scatter's receive buffer is this
 * rank's block of the send buffer. oneCCL has sum, prod, min and max, and every dc-bench type
 * (half: float16, bfloat16). Its avg is refused on the host ("not supported for the scheduler
 * path"): sum, then a division of the result in its type, timed with the call (as mpi_bench
 * does). It has no bitwise ops: band, bor and bxor rows are skipped.
 * time: the slowest rank's average per iteration (MPI_MAX over ranks after timing).
 */
#include <mpi.h>

#include <oneapi/ccl.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <strings.h>
#include <unistd.h>
#include <vector>

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

static bool op_reduces(int op) { return op == OP_ALLREDUCE || op == OP_REDUCE || op == OP_REDUCE_SCATTER; }
static bool op_has_root(int op) { return op == OP_BROADCAST || op == OP_REDUCE; }
static bool op_blocked(int op) { return op == OP_ALLGATHER || op == OP_REDUCE_SCATTER || op == OP_ALLTOALL; }
static bool op_has_inplace(int op) {
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
static bool dt_is_float(int d) { return d == DT_HALF || d == DT_FLOAT || d == DT_DOUBLE || d == DT_BF16; }
static bool dt_is_unsigned(int d) { return d == DT_UINT8 || d == DT_UINT32 || d == DT_UINT64; }
static bool redop_bitwise(int r) { return r == R_BAND || r == R_BOR || r == R_BXOR; }

/* ------------------------------------------------------------------------------------------ */
/* float16 / bfloat16 bits (round to nearest even), as dc-bench and mpi_bench encode them      */

static float bits_f32(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
  if (man == 0) return bits_f32(sign);
  int shift = 0; /* subnormal: shift the mantissa up to its leading one */
  while (!(man & 0x400)) { man <<= 1; shift++; }
  return bits_f32(sign | ((uint32_t)(127 - 15 + 1 - shift) << 23) | ((man & 0x3ff) << 13));
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0); /* inf, nan */
  if (a >= 0x477ff000u) return sign | 0x7c00;                                 /* too big */
  if (a >= 0x38800000u) {                                                     /* normal */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
  }
  if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
  uint32_t e = a >> 23, man = (a & 0x7fffff) | 0x800000, shift = 126 - e;
  uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
  if (rem > mid || (rem == mid && (q & 1))) q++;
  return sign | (uint16_t)q;
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

/* The bits of the integer v as an element of type d: integers wrap, floats convert. */
static uint64_t encode(int d, int64_t v) {
  switch (d) {
  case DT_HALF: return f32_to_f16((float)v);
  case DT_BF16: return f32_to_bf16((float)v);
  case DT_FLOAT: return f32_bits((float)v);
  case DT_DOUBLE: { double f = (double)v; uint64_t b; std::memcpy(&b, &f, 8); return b; }
  default: return (uint64_t)v & dt_mask(d);
  }
}

static double decode_f64(int d, uint64_t b) {
  switch (d) {
  case DT_HALF: return f16_to_f32((uint16_t)b);
  case DT_BF16: return bf16_to_f32((uint16_t)b);
  case DT_FLOAT: return bits_f32((uint32_t)b);
  case DT_DOUBLE: { double f; std::memcpy(&f, &b, 8); return f; }
  default: return (double)b;
  }
}

static bool same(int d, uint64_t a, uint64_t b) {
  if (a == b) return true;
  if (!dt_is_float(d)) return false;
  double x = decode_f64(d, a), y = decode_f64(d, b);
  return x == y || (std::isnan(x) && std::isnan(y));
}

static uint64_t get_el(int d, const unsigned char *buf, size_t i) {
  switch (dt_sizes[d]) {
  case 1: return buf[i];
  case 2: { uint16_t v; std::memcpy(&v, buf + 2 * i, 2); return v; }
  case 4: { uint32_t v; std::memcpy(&v, buf + 4 * i, 4); return v; }
  default: { uint64_t v; std::memcpy(&v, buf + 8 * i, 8); return v; }
  }
}

static void put_el(int d, unsigned char *buf, size_t i, uint64_t bits) {
  switch (dt_sizes[d]) {
  case 1: buf[i] = (unsigned char)bits; break;
  case 2: { uint16_t v = (uint16_t)bits; std::memcpy(buf + 2 * i, &v, 2); break; }
  case 4: { uint32_t v = (uint32_t)bits; std::memcpy(buf + 4 * i, &v, 4); break; }
  default: std::memcpy(buf + 8 * i, &bits, 8); break;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Test data: identical to dc-bench's (src/bin/dc-bench/data.rs) and mpi_bench's               */

static uint64_t mix(uint64_t r, uint64_t i, uint64_t s) {
  uint64_t x = (i * 0x9E3779B97F4A7C15ull) ^ ((r + 1) * 0xC2B2AE3D27D4EB4Full) ^ ((s + 1) * 0x165667B19E3779F9ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct data {
  bool move; /* data movement (else a reduction with redop) */
  int redop;
  int dt;
  int n;
  int64_t range;

  data(bool move_, int redop_, int dt_, int n_) : move(move_), redop(redop_), dt(dt_), n(n_) {
    int64_t k = 120 / (n > 1 ? n : 1);
    range = k < 1 ? 1 : k > 8 ? 8 : k;
  }

  /* Rank r's input element i for the given seed. */
  int64_t value(int r, size_t i, uint64_t seed) const {
    uint64_t h = mix((uint64_t)r, (uint64_t)i, seed);
    bool uns = dt_is_unsigned(dt), fl = dt_is_float(dt);
    int64_t k = range;
    if (move) return fl ? (int64_t)(h % 257) - 128 : (int64_t)h;
    switch (redop) {
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
      int64_t dv = (r % 2 == 1) ? -t : (r + 1 == n ? 0 : t);
      return (int64_t)((uint64_t)base + (uint64_t)dv);
    }
    default: return (int64_t)h; /* bitwise */
    }
  }

  /* Element i of the reduction over all ranks. */
  int64_t reduced(size_t i, uint64_t seed) const {
    int64_t acc = value(0, i, seed);
    for (int r = 1; r < n; r++) {
      int64_t v = value(r, i, seed);
      switch (redop) {
      case R_SUM: case R_AVG: acc = (int64_t)((uint64_t)acc + (uint64_t)v); break;
      case R_PROD: acc = (int64_t)((uint64_t)acc * (uint64_t)v); break;
      case R_MAX: acc = v > acc ? v : acc; break;
      case R_MIN: acc = v < acc ? v : acc; break;
      case R_BAND: acc &= v; break;
      case R_BOR: acc |= v; break;
      default: acc ^= v; break;
      }
    }
    return redop == R_AVG ? acc / n : acc;
  }
};

/* ------------------------------------------------------------------------------------------ */
/* oneCCL types and ops                                                                        */

static ccl::datatype ccl_dt(int d) {
  switch (d) {
  case DT_INT8: return ccl::datatype::int8;
  case DT_UINT8: return ccl::datatype::uint8;
  case DT_INT32: return ccl::datatype::int32;
  case DT_UINT32: return ccl::datatype::uint32;
  case DT_INT64: return ccl::datatype::int64;
  case DT_UINT64: return ccl::datatype::uint64;
  case DT_HALF: return ccl::datatype::float16;
  case DT_FLOAT: return ccl::datatype::float32;
  case DT_DOUBLE: return ccl::datatype::float64;
  default: return ccl::datatype::bfloat16;
  }
}

static ccl::reduction ccl_op(int r) {
  switch (r) {
  case R_PROD: return ccl::reduction::prod;
  case R_MAX: return ccl::reduction::max;
  case R_MIN: return ccl::reduction::min;
  default: return ccl::reduction::sum; /* avg too: see divide() */
  }
}

/* Finishes avg, which oneCCL's host path refuses ("average operation is not supported for the
   scheduler path"): sum, then `count` elements divided by n in their type (integers truncate
   toward zero), timed with the call, as mpi_bench does for MPI. */
static void divide(int d, void *buf, size_t count, int n) {
  switch (d) {
  case DT_INT8: { auto *p = (int8_t *)buf; for (size_t i = 0; i < count; i++) p[i] = (int8_t)(p[i] / n); break; }
  case DT_UINT8: { auto *p = (uint8_t *)buf; for (size_t i = 0; i < count; i++) p[i] = (uint8_t)(p[i] / (unsigned)n); break; }
  case DT_INT32: { auto *p = (int32_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= n; break; }
  case DT_UINT32: { auto *p = (uint32_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= (uint32_t)n; break; }
  case DT_INT64: { auto *p = (int64_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= n; break; }
  case DT_UINT64: { auto *p = (uint64_t *)buf; for (size_t i = 0; i < count; i++) p[i] /= (uint64_t)n; break; }
  case DT_FLOAT: { auto *p = (float *)buf; for (size_t i = 0; i < count; i++) p[i] /= (float)n; break; }
  case DT_DOUBLE: { auto *p = (double *)buf; for (size_t i = 0; i < count; i++) p[i] /= (double)n; break; }
  case DT_HALF: { auto *p = (uint16_t *)buf; for (size_t i = 0; i < count; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / (float)n); break; }
  default: { auto *p = (uint16_t *)buf; for (size_t i = 0; i < count; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / (float)n); break; }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Options (mpi_bench's, which are dc-bench's)                                                 */

struct args {
  uint64_t minbytes = 8, maxbytes = 64ull << 20, stepfactor = 2, stepbytes = 0;
  std::vector<int> ops{OP_ALLREDUCE}, dts{DT_FLOAT}, redops{R_SUM};
  int root = 0, warmup = 5, iters = 20, check = 1;
  const char *csv = nullptr, *label = "oneccl";
};

static const char usage[] =
    "usage: mpiexec -n N oneccl_bench [options]\n"
    "dc-bench's sweep over oneCCL; options as dc-bench's (see dc-bench --help):\n"
    "  -b SIZE  -e SIZE  -f F  -i SIZE  -o OPS  -d TYPES  --redop OPS  -r ROOT  -w N  -n N  -c N\n"
    "  --csv FILE  --label NAME (default: oneccl)\n"
    "oneCCL's transport from its environment: CCL_ATL_TRANSPORT=ofi (CCL_ATL_SHM=1 FI_PROVIDER=shm,\n"
    "or FI_PROVIDER=tcp) or mpi;\n"
    "CCL_WORKER_OFFLOAD=0 runs its progress on the calling thread (on few cores). avg: sum, then a\n"
    "division (oneCCL's host path has no avg); band, bor, bxor: not in oneCCL, skipped.\n";

static int parse_size(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v = std::strtoull(s, &end, 10);
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
  for (const auto &a : al)
    if (strcasecmp(s, a.alias) == 0) return a.d;
  return lookup(s, dt_names, NDTS);
}

static int find_op(const char *s) {
  if (strcasecmp(s, "reducescatter") == 0 || strcasecmp(s, "reduce-scatter") == 0) return OP_REDUCE_SCATTER;
  if (strcasecmp(s, "bcast") == 0) return OP_BROADCAST;
  return lookup(s, op_names, NOPS);
}

static int find_redop(const char *s) { return lookup(s, redop_names, NREDOPS); }

/* A comma-separated list of names, or all; false on an unknown name or an empty list. */
static bool parse_list(const std::string &v, std::vector<int> &out, int max, int (*find)(const char *)) {
  out.clear();
  auto add = [&out](int x) {
    for (int y : out)
      if (y == x) return;
    out.push_back(x);
  };
  size_t at = 0;
  while (at <= v.size()) {
    size_t comma = v.find(',', at);
    std::string tok = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? v.size() + 1 : comma + 1;
    if (tok.empty()) continue;
    if (strcasecmp(tok.c_str(), "all") == 0) {
      for (int i = 0; i < max; i++) add(i);
      continue;
    }
    int x = find(tok.c_str());
    if (x < 0) return false;
    add(x);
  }
  return !out.empty();
}

/* 0: run; 1: --help printed; -1: bad options (message printed). */
static int parse_args(int argc, char **argv, args &a) {
  for (int i = 1; i < argc; i++) {
    std::string name = argv[i];
    const char *v = nullptr;
    size_t eq = name.find('=');
    if (name.compare(0, 2, "--") == 0 && eq != std::string::npos) {
      v = argv[i] + eq + 1;
      name.resize(eq);
    }
    auto is = [&name](const char *s, const char *l) { return name == s || name == l; };
    auto value = [&]() {
      if (v) return true;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "oneccl_bench: %s needs a value\n", name.c_str());
        return false;
      }
      v = argv[++i];
      return true;
    };
    bool ok = true;
    if (is("-h", "--help")) { std::fputs(usage, stdout); return 1; }
    else if (is("-b", "--minbytes")) ok = value() && parse_size(v, &a.minbytes) == 0;
    else if (is("-e", "--maxbytes")) ok = value() && parse_size(v, &a.maxbytes) == 0;
    else if (is("-f", "--stepfactor")) ok = value() && (a.stepfactor = std::strtoull(v, nullptr, 10)) >= 2;
    else if (is("-i", "--stepbytes")) ok = value() && parse_size(v, &a.stepbytes) == 0;
    else if (is("-o", "--op")) ok = value() && parse_list(v, a.ops, NOPS, find_op);
    else if (is("-d", "--datatype")) ok = value() && parse_list(v, a.dts, NDTS, find_dt);
    else if (is("--redop", "--redop")) ok = value() && parse_list(v, a.redops, NREDOPS, find_redop);
    else if (is("-r", "--root")) ok = value() && (a.root = std::atoi(v)) >= 0;
    else if (is("-w", "--warmup_iters") || is("--warmup-iters", "--warmup-iters")) { ok = value(); if (ok) a.warmup = std::atoi(v); }
    else if (is("-n", "--iters")) { ok = value(); if (ok) a.iters = std::max(1, std::atoi(v)); }
    else if (is("-c", "--check")) { ok = value(); if (ok) a.check = std::atoi(v); }
    else if (is("--csv", "--csv")) { ok = value(); if (ok) a.csv = v; }
    else if (is("--label", "--label")) { ok = value(); if (ok) a.label = v; }
    else { std::fprintf(stderr, "oneccl_bench: unknown option %s\n", name.c_str()); return -1; }
    if (!ok) {
      if (v) std::fprintf(stderr, "oneccl_bench: bad value for %s: %s\n", name.c_str(), v);
      return -1;
    }
  }
  if (a.minbytes > a.maxbytes) { std::fprintf(stderr, "oneccl_bench: minbytes > maxbytes\n"); return -1; }
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The benchmark                                                                               */

struct shape { size_t bytes, count, block; };

static bool make_shape(int op, int d, int n, uint64_t size, shape &s) {
  size_t ts = dt_sizes[d];
  if (op == OP_BARRIER) { s = {0, 0, 0}; return true; }
  if (op_blocked(op)) {
    size_t per = (size_t)size / (ts * (size_t)n);
    s = {per * n * ts, per * n, per};
  } else {
    s = {(size_t)size / ts * ts, (size_t)size / ts, (size_t)size / ts};
  }
  return s.count > 0 && s.count <= INT_MAX; /* INT_MAX: as mpi_bench, so the rows match */
}

struct kase { int op, dt, redop; shape sh; };

struct bench {
  int rank, n, root;
  unsigned char *send = nullptr, *recv = nullptr;
  uint64_t seed = 0;
  ccl::communicator *comm;

  /* One call of the op in the given form, waited for. */
  void call(const kase &c, bool inplace) {
    ccl::datatype t = ccl_dt(c.dt);
    ccl::reduction o = ccl_op(c.redop >= 0 ? c.redop : R_SUM);
    size_t cnt = c.sh.count, blk = c.sh.block;
    unsigned char *own = recv + (size_t)rank * blk * dt_sizes[c.dt]; /* this rank's block */
    bool avg = c.redop == R_AVG;
    switch (c.op) {
    case OP_ALLREDUCE:
      ccl::allreduce(inplace ? recv : send, recv, cnt, t, o, *comm).wait();
      if (avg) divide(c.dt, recv, cnt, n);
      break;
    case OP_REDUCE:
      ccl::reduce(inplace ? recv : send, recv, cnt, t, o, root, *comm).wait();
      if (avg && rank == root) divide(c.dt, recv, cnt, n);
      break;
    case OP_BROADCAST: ccl::broadcast(recv, cnt, t, root, *comm).wait(); break;
    case OP_ALLGATHER: ccl::allgather(inplace ? own : send, recv, blk, t, *comm).wait(); break;
    case OP_REDUCE_SCATTER:
      ccl::reduce_scatter(inplace ? recv : send, inplace ? own : recv, blk, t, o, *comm).wait();
      if (avg) divide(c.dt, inplace ? own : recv, blk, n);
      break;
    case OP_ALLTOALL: ccl::alltoall(send, recv, blk, t, *comm).wait(); break;
    case OP_SENDRECV: {
      ccl::event r = ccl::recv(recv, cnt, t, (rank + n - 1) % n, *comm);
      ccl::event s = ccl::send(send, cnt, t, (rank + 1) % n, *comm);
      r.wait();
      s.wait();
      break;
    }
    default: ccl::barrier(*comm).wait(); break;
    }
  }

  data case_data(const kase &c) const {
    return op_reduces(c.op) && c.redop >= 0 ? data(false, c.redop, c.dt, n) : data(true, 0, c.dt, n);
  }

  static void fill(const data &d, unsigned char *buf, size_t from, size_t elems, int src, uint64_t seed) {
    for (size_t i = 0; i < elems; i++) put_el(d.dt, buf, from + i, encode(d.dt, d.value(src, i, seed)));
  }

  /* This rank's inputs for seed; the outputs filled with a poison pattern. */
  void prepare(const kase &c, bool inplace, uint64_t seed) {
    data d = case_data(c);
    const shape &sh = c.sh;
    int poison = 0xA5 ^ (unsigned char)((unsigned char)seed * 0x3B);
    switch (c.op) {
    case OP_ALLREDUCE: case OP_REDUCE:
      if (inplace) fill(d, recv, 0, sh.count, rank, seed);
      else { fill(d, send, 0, sh.count, rank, seed); std::memset(recv, poison, sh.bytes); }
      break;
    case OP_BROADCAST:
      if (rank == root) fill(d, recv, 0, sh.count, rank, seed);
      else std::memset(recv, poison, sh.bytes);
      break;
    case OP_ALLGATHER:
      std::memset(recv, poison, sh.bytes);
      if (inplace) fill(d, recv, (size_t)rank * sh.block, sh.block, rank, seed);
      else fill(d, send, 0, sh.block, rank, seed);
      break;
    case OP_REDUCE_SCATTER:
      if (inplace) fill(d, recv, 0, sh.count, rank, seed);
      else { fill(d, send, 0, sh.count, rank, seed); std::memset(recv, poison, sh.block * dt_sizes[c.dt]); }
      break;
    case OP_ALLTOALL: case OP_SENDRECV:
      fill(d, send, 0, sh.count, rank, seed);
      std::memset(recv, poison, sh.bytes);
      break;
    default: break;
    }
  }

  /* This rank's wrong output elements for seed. */
  uint64_t verify(const kase &c, bool inplace, uint64_t seed) const {
    data d = case_data(c);
    const shape &sh = c.sh;
    int dt = c.dt;
    uint64_t wrong = 0;
    auto expect = [&](size_t idx, uint64_t bits) { wrong += !same(dt, get_el(dt, recv, idx), bits); };
    switch (c.op) {
    case OP_ALLREDUCE:
      for (size_t i = 0; i < sh.count; i++) expect(i, encode(dt, d.reduced(i, seed)));
      break;
    case OP_REDUCE:
      if (rank == root)
        for (size_t i = 0; i < sh.count; i++) expect(i, encode(dt, d.reduced(i, seed)));
      break;
    case OP_BROADCAST:
      for (size_t i = 0; i < sh.count; i++) expect(i, encode(dt, d.value(root, i, seed)));
      break;
    case OP_ALLGATHER:
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sh.block; i++) expect(j * sh.block + i, encode(dt, d.value(j, i, seed)));
      break;
    case OP_REDUCE_SCATTER: { /* in place: this rank's block of the buffer, as dc-bench's */
      size_t at = inplace ? (size_t)rank * sh.block : 0;
      for (size_t i = 0; i < sh.block; i++) expect(at + i, encode(dt, d.reduced((size_t)rank * sh.block + i, seed)));
      break;
    }
    case OP_ALLTOALL:
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sh.block; i++)
          expect(j * sh.block + i, encode(dt, d.value(j, (size_t)rank * sh.block + i, seed)));
      break;
    case OP_SENDRECV:
      for (size_t i = 0; i < sh.count; i++) expect(i, encode(dt, d.value((rank + n - 1) % n, i, seed)));
      break;
    default: break;
    }
    return wrong;
  }

  /* Times one form of a case and checks it: the slowest rank's seconds per iteration, and the
     wrong elements over all ranks (-1: not checked). */
  void measure(const kase &c, bool inplace, const args &a, double &time, long long &wrong) {
    prepare(c, inplace, 0);
    for (int i = 0; i < a.warmup; i++) call(c, inplace);
    ccl::barrier(*comm).wait();
    double t0 = MPI_Wtime();
    for (int i = 0; i < a.iters; i++) call(c, inplace);
    double mine = (MPI_Wtime() - t0) / a.iters;
    MPI_Allreduce(&mine, &time, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (a.check == 0) { wrong = -1; return; }
    long long w = 0;
    const char *inject = std::getenv("DC_BENCH_INJECT_WRONG");
    for (int k = 0; k < a.check; k++) {
      uint64_t s = ++seed;
      prepare(c, inplace, s);
      call(c, inplace);
      if (inject && std::strcmp(inject, "1") == 0 && rank == 0 && c.sh.bytes > 0) recv[0] ^= 0x5A; /* test hook, as dc-bench's */
      w += (long long)verify(c, inplace, s);
    }
    MPI_Allreduce(&w, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  }
};

static const char *fmt_time(double us, char *buf, size_t n) {
  std::snprintf(buf, n, us >= 10000.0 ? "%.0f" : us >= 100.0 ? "%.1f" : "%.2f", us);
  return buf;
}

/* The transport oneCCL was told to use, for the header line. */
static std::string transport_desc() {
  const char *t = std::getenv("CCL_ATL_TRANSPORT");
  std::string s = std::string("oneccl ") + (t && *t ? t : "default");
  const char *shm = std::getenv("CCL_ATL_SHM");
  const char *p = std::getenv("FI_PROVIDER");
  bool ofi = !t || std::strcmp(t, "ofi") == 0;
  if (ofi && shm && *shm) s += std::string(" (CCL_ATL_SHM ") + shm + (p && *p ? std::string(", FI_PROVIDER ") + p : "") + ")";
  else if (ofi && p && *p) s += std::string(" (FI_PROVIDER ") + p + ")";
  else if (p && *p) s += std::string(" (MPI's FI_PROVIDER ") + p + ")";
  const char *w = std::getenv("CCL_WORKER_OFFLOAD");
  const char *wc = std::getenv("CCL_WORKER_COUNT");
  if (w && *w) s += std::string(", CCL_WORKER_OFFLOAD ") + w;
  if (wc && *wc) s += std::string(", CCL_WORKER_COUNT ") + wc;
  return s;
}

static int run(int rank, int n, const args &a) {
  /* oneCCL's wire-up: rank 0's main key-value store, its address sent over MPI. */
  ccl::init();
  std::shared_ptr<ccl::kvs> kvs;
  ccl::kvs::address_type addr{};
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    addr = kvs->get_address();
  }
  MPI_Bcast(addr.data(), (int)addr.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(addr);
  ccl::communicator comm = ccl::create_communicator(n, rank, kvs);

  size_t bufsize = a.maxbytes > 64 ? (size_t)a.maxbytes : 64;
  bench b{rank, n, a.root, nullptr, nullptr, 0, &comm};
  if (posix_memalign((void **)&b.send, 4096, bufsize) || posix_memalign((void **)&b.recv, 4096, bufsize)) {
    std::fprintf(stderr, "oneccl_bench: cannot allocate %zu bytes\n", bufsize);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::memset(b.send, 0, bufsize);
  std::memset(b.recv, 0, bufsize);

  /* Host names, gathered. */
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  std::vector<char> hosts((size_t)n * 64);
  MPI_Allgather(host, 64, MPI_CHAR, hosts.data(), 64, MPI_CHAR, MPI_COMM_WORLD);

  FILE *csv = nullptr;
  if (rank == 0) {
    ccl::library_version v = ccl::get_library_version();
    bool same_host = true;
    for (int r = 1; r < n; r++) same_host &= std::strcmp(hosts.data() + 64 * r, hosts.data()) == 0;
    std::printf("# oneccl_bench: oneCCL %u.%u.%u (%s), %d ranks, transport %s, %s %s%s\n", v.major, v.minor, v.update,
                v.product_status ? v.product_status : "", n, transport_desc().c_str(), same_host ? "host" : "hosts",
                hosts.data(), same_host ? "" : ", ...");
    if (a.stepbytes)
      std::printf("# sizes %llu to %llu bytes, step %llu bytes; ", (unsigned long long)a.minbytes,
                  (unsigned long long)a.maxbytes, (unsigned long long)a.stepbytes);
    else
      std::printf("# sizes %llu to %llu bytes, step factor %llu; ", (unsigned long long)a.minbytes,
                  (unsigned long long)a.maxbytes, (unsigned long long)a.stepfactor);
    if (a.check)
      std::printf("warmup %d and %d timed iterations per size; check %d run(s) per size; root %d\n", a.warmup, a.iters,
                  a.check, a.root);
    else
      std::printf("warmup %d and %d timed iterations per size; check off; root %d\n", a.warmup, a.iters, a.root);
    std::printf("# time: the slowest rank's average per iteration; algbw = size/time; busbw = algbw x nccl-tests' factor\n");
    for (int r : a.redops)
      if (redop_bitwise(r)) std::printf("# redop %s: not in oneCCL, skipped\n", redop_names[r]);
    if (a.csv) {
      csv = std::fopen(a.csv, "w");
      if (!csv) { std::perror(a.csv); MPI_Abort(MPI_COMM_WORLD, 1); }
      std::fprintf(csv, "op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl\n");
      std::fflush(csv);
    }
  }

  long long total_wrong = 0;
  double bw_sum = 0;
  int bw_rows = 0;
  char tb[32];
  for (int op : a.ops) {
    if (rank == 0) {
      std::printf("#\n# op: %s\n", op_names[op]);
      std::printf("# %10s %12s %9s %6s %5s  %-36s  %-36s\n", "", "", "", "", "", "            out-of-place",
                  "              in-place");
      std::printf("# %10s %12s %9s %6s %5s  %9s %8s %8s %8s  %9s %8s %8s %8s\n", "size", "count", "type", "redop",
                  "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
      std::printf("# %10s %12s %9s %6s %5s  %9s %8s %8s %8s  %9s %8s %8s %8s\n", "(B)", "(elements)", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    std::vector<int> dts = op == OP_BARRIER ? std::vector<int>{DT_UINT8} : a.dts;
    std::vector<int> redops = op_reduces(op) ? a.redops : std::vector<int>{-1};
    for (int dt : dts) {
      for (int redop : redops) {
        if (redop >= 0 && redop_bitwise(redop)) continue; /* not in oneCCL */
        size_t last = (size_t)-1;
        uint64_t s = op == OP_BARRIER ? 0 : a.minbytes;
        for (;;) {
          shape sh;
          if (make_shape(op, dt, n, s, sh) && sh.bytes != last) {
            last = sh.bytes;
            kase c{op, dt, redop, sh};
            const char *tname = op == OP_BARRIER ? "none" : dt_names[dt];
            const char *rname = redop >= 0 ? redop_names[redop] : "none";
            int root = op_has_root(op) ? a.root : -1;
            char line[512];
            int off = std::snprintf(line, sizeof line, "  %10zu %12zu %9s %6s %5d", sh.bytes, sh.count, tname, rname, root);
            for (int inplace = 0; inplace < 2; inplace++) {
              if (inplace && !op_has_inplace(op)) {
                off += std::snprintf(line + off, sizeof line - off, "  %9s %8s %8s %8s", "N/A", "N/A", "N/A", "N/A");
                continue;
              }
              double secs;
              long long wrong;
              b.measure(c, inplace != 0, a, secs, wrong);
              double us = secs * 1e6;
              double algbw = secs > 0 ? (double)sh.bytes / secs / 1e9 : 0;
              double busbw = algbw * bus_factor(op, n);
              if (wrong > 0) total_wrong += wrong;
              if (op != OP_BARRIER) { bw_sum += busbw; bw_rows++; }
              char ws[24];
              if (wrong < 0) std::snprintf(ws, sizeof ws, "N/A");
              else std::snprintf(ws, sizeof ws, "%lld", wrong);
              off += std::snprintf(line + off, sizeof line - off, "  %9s %8.2f %8.2f %8s", fmt_time(us, tb, sizeof tb),
                                   algbw, busbw, ws);
              if (csv) {
                std::fprintf(csv, "%s,%zu,%zu,%s,%s,%d,%d,%.3f,%.6f,%.6f,%lld,%d,%s\n", op_names[op], sh.bytes, sh.count,
                             tname, rname, root, inplace, us, algbw, busbw, wrong, n, a.label);
                std::fflush(csv);
              }
            }
            if (rank == 0) { std::puts(line); std::fflush(stdout); }
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
    std::printf("#\n");
    if (a.check) std::printf("# wrong elements: %lld %s\n", total_wrong, total_wrong ? "(FAILED)" : "(OK)");
    else std::printf("# wrong elements: not checked (--check 0)\n");
    if (bw_rows) std::printf("# avg bus bandwidth: %.4f GB/s (mean over the rows above)\n", bw_sum / bw_rows);
    if (csv) std::fclose(csv);
    std::fflush(stdout);
  }
  std::free(b.send);
  std::free(b.recv);
  return total_wrong > 0 ? 3 : 0;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); /* oneCCL's mpi transport asks it */
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  args a;
  int pr = parse_args(argc, argv, a);
  if (pr != 0) {
    MPI_Finalize();
    return pr > 0 ? 0 : 2;
  }
  if (a.root >= n) {
    if (rank == 0) std::fprintf(stderr, "oneccl_bench: --root %d is not a rank of this %d-rank job\n", a.root, n);
    MPI_Finalize();
    return 2;
  }
  int rc;
  try {
    rc = run(rank, n, a); /* the communicator and the key-value store end before MPI does */
  } catch (const std::exception &e) {
    std::fprintf(stderr, "oneccl_bench: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return rc;
}
