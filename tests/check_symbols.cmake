# Checks what a libclattn exports:
# - static (libclattn.a): every global symbol it defines starts with clattn_,
#   and every function the public headers declare is among them;
# - shared (libclattn.so): its dynamic symbols are exactly the functions the
#   public headers declare, and its SONAME is libclattn.so.MAJOR.
# Run as: cmake -DLIB=... -DNM=nm -DREADELF=readelf -DSRC=<source dir>
#               -DMAJOR=<version major> -P check_symbols.cmake
include(${SRC}/cmake/exports.cmake)
clattn_public_functions(public ${SRC}/include/clattn.h ${SRC}/include/clattn_cl.h)
list(LENGTH public npublic)
if(npublic LESS 30)
  message(FATAL_ERROR "only ${npublic} public functions found in the headers: ${public}")
endif()

if(LIB MATCHES "\\.a$")
  set(args -g --defined-only)
else()
  set(args -D --defined-only)
endif()
execute_process(COMMAND ${NM} ${args} ${LIB} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIB}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(defined)
set(bad)
foreach(line IN LISTS lines)
  # "A" is the version node of a shared library's symbols, not a symbol.
  if(line MATCHES "^[0-9a-fA-F]+ ([B-Zb-z]) ([^@]+)")
    list(APPEND defined ${CMAKE_MATCH_2})
    if(NOT CMAKE_MATCH_2 MATCHES "^clattn_")
      list(APPEND bad ${CMAKE_MATCH_2})
    endif()
  endif()
endforeach()
list(LENGTH defined count)
if(count EQUAL 0)
  message(FATAL_ERROR "no symbols found in ${LIB}")
endif()
if(bad)
  message(FATAL_ERROR "symbols without the clattn_ prefix: ${bad}")
endif()
set(missing ${public})
list(REMOVE_ITEM missing ${defined})
if(missing)
  message(FATAL_ERROR "declared in the public headers but not exported: ${missing}")
endif()

if(NOT LIB MATCHES "\\.a$")
  set(extra ${defined})
  list(REMOVE_ITEM extra ${public})
  if(extra)
    message(FATAL_ERROR "exported but not in the public headers: ${extra}")
  endif()
  execute_process(COMMAND ${READELF} -d ${LIB} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT dyn MATCHES "\\(SONAME\\)[^\n]*\\[libclattn\\.so\\.${MAJOR}\\]")
    message(FATAL_ERROR "SONAME is not libclattn.so.${MAJOR}:\n${dyn}")
  endif()
  message(STATUS "${count} exported symbols, exactly the ${npublic} public functions; "
                 "SONAME libclattn.so.${MAJOR}")
else()
  message(STATUS "${count} global symbols, all prefixed clattn_, the ${npublic} public "
                 "functions among them")
endif()
