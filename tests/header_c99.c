/* Compiled alone as C99 with -pedantic -Werror: the headers need nothing else. */
#include "clattn.h"
#include "clattn_cl.h"

int clattn_header_c99_probe(void);
int clattn_header_c99_probe(void) { return (int)CLATTN_OK + CLATTN_VERSION_MAJOR * 0; }
