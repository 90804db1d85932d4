/* Control for the header tests: includes the header and has one unused variable, which
   -Wall -Werror must reject. If this ever compiles, the strict flags are not in effect. */
#include "flashattn.h"

int flashattn_header_bad(void);

int flashattn_header_bad(void) {
  int unused_variable;
  return (int)FLASHATTN_STATUS_SUCCESS;
}
