/* Calls that need no communicator: dc_version, dc_status_name, dc_last_error. */
#include "common.h"

#include <stdint.h>

_Static_assert(sizeof(dc_status) == sizeof(int), "dc_status is a plain C enum");
_Static_assert(DC_ANY_SOURCE == -1 && DC_ANY_TAG == -1, "wildcards are -1");
_Static_assert(DC_INT8 == 0 && DC_BFLOAT16 == 9, "dtype numbering is NCCL's");
_Static_assert(DC_SUM == 0 && DC_AVG == 4 && DC_BXOR == 7, "op numbering is NCCL's, then ours");

#define STATUS(s) { s, #s }
static const struct {
  dc_status status;
  const char *name;
} statuses[] = {
    STATUS(DC_SUCCESS),          STATUS(DC_ERR_INVALID_ARGUMENT), STATUS(DC_ERR_INVALID_USAGE),
    STATUS(DC_ERR_TIMEOUT),      STATUS(DC_ERR_PEER_LOST),        STATUS(DC_ERR_MISMATCH),
    STATUS(DC_ERR_ABORTED),      STATUS(DC_ERR_UNAVAILABLE),      STATUS(DC_ERR_SYSTEM),
    STATUS(DC_ERR_RENDEZVOUS),   STATUS(DC_ERR_INTERNAL),         STATUS(DC_ERR_REMOTE),
};

int main(void) {
  /* Nothing has failed on this thread yet. */
  const char *err = dc_last_error();
  EXPECT(err != NULL, "dc_last_error() returned NULL");
  EXPECT(err[0] == '\0', "dc_last_error() is \"%s\" before any call failed", err);

  uint32_t v = dc_version();
#ifdef DC_EXPECTED_VERSION
  EXPECT(v == DC_EXPECTED_VERSION, "dc_version() = %u, the installed package says %u",
         (unsigned)v, (unsigned)DC_EXPECTED_VERSION);
#endif
  EXPECT(v < 1000000u, "dc_version() = %u is not major*10000+minor*100+patch", (unsigned)v);

  /* Every status has its own name; values are the ones API.md fixes (0..11, in order). */
  for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
    EXPECT((size_t)statuses[i].status == i, "%s = %d", statuses[i].name, (int)statuses[i].status);
    const char *name = dc_status_name(statuses[i].status);
    EXPECT(name != NULL, "dc_status_name(%s) returned NULL", statuses[i].name);
    EXPECT(strcmp(name, statuses[i].name) == 0, "dc_status_name(%s) = \"%s\"", statuses[i].name,
           name);
  }
  /* Unknown values have a name too, never NULL. */
  const uint32_t unknown[] = {12, 999, UINT32_MAX};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *name = dc_status_name(unknown[i]);
    EXPECT(name != NULL && strcmp(name, "DC_ERR_UNKNOWN") == 0, "dc_status_name(%u) = \"%s\"",
           (unsigned)unknown[i], name ? name : "(null)");
  }

  /* None of these calls fails, so the thread's error text is still empty. */
  EXPECT(dc_last_error()[0] == '\0', "dc_last_error() = \"%s\"", dc_last_error());

  printf("test_basics: distcomm %u.%u.%u, %zu statuses named\n", (unsigned)(v / 10000),
         (unsigned)(v / 100 % 100), (unsigned)(v % 100), sizeof statuses / sizeof statuses[0]);
  return 0;
}
