// Compiled alone as C++ with -pedantic -Werror: the headers are C++-clean.
#include "clattn.h"
#include "clattn_cl.h"

int clattn_header_cxx_probe();
int clattn_header_cxx_probe()
{
    clattn_shape s = clattn_shape_default();
    return static_cast<int>(s.batch) + static_cast<int>(CLATTN_OK);
}
