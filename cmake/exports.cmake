# The functions the public headers declare: every line that starts a
# declaration at column 0 with a return type and then clattn_NAME(.
# clattn_public_functions(OUT header...) sets OUT to their names, sorted.
function(clattn_public_functions out)
  set(names)
  foreach(header IN LISTS ARGN)
    file(STRINGS ${header} lines REGEX "^[A-Za-z_][A-Za-z0-9_ ]*[ *]clattn_[a-z0-9_]+\\(")
    foreach(line IN LISTS lines)
      string(REGEX MATCH "[ *](clattn_[a-z0-9_]+)\\(" match "${line}")
      list(APPEND names ${CMAKE_MATCH_1})
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(SORT names)
  set(${out} ${names} PARENT_SCOPE)
endfunction()

# Writes a GNU ld version script that exports those functions alone.
function(clattn_write_version_script path)
  clattn_public_functions(names ${ARGN})
  list(LENGTH names count)
  if(count EQUAL 0)
    message(FATAL_ERROR "no public functions found in ${ARGN}")
  endif()
  list(JOIN names ";\n    " body)
  file(CONFIGURE OUTPUT ${path} CONTENT "CLATTN_0 {\n  global:\n    ${body};\n  local:\n    *;\n};\n")
endfunction()
