# Installs clattn into a scratch prefix and builds tests/consumer against it
# three ways: find_package, pkg-config --static with a plain compiler call,
# and add_subdirectory of the source tree. Each program must run and pass.
#   cmake -DSRC=... -DBUILD=... -DWORK=... -DCC=... -P consumers.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})

# 1. find_package(clattn CONFIG)
run(${CMAKE_COMMAND} -S ${SRC}/tests/consumer -B ${WORK}/config -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK}/config)
run(${WORK}/config/consumer)

# 2. pkg-config --static and a plain compiler command
file(GLOB_RECURSE pcs ${prefix}/*/clattn.pc)
get_filename_component(pcdir "${pcs}" DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND pkg-config --static --cflags --libs clattn
                OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --static clattn failed")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c99 -Wall -Werror ${SRC}/tests/consumer/main.c -o ${WORK}/pkgconfig-consumer
    ${flags})
run(${WORK}/pkgconfig-consumer)

# 3. add_subdirectory of the source tree
run(${CMAKE_COMMAND} -S ${SRC}/tests/consumer -B ${WORK}/subdir -DCLATTN_SOURCE_DIR=${SRC})
run(${CMAKE_COMMAND} --build ${WORK}/subdir)
run(${WORK}/subdir/consumer)
file(REMOVE_RECURSE ${WORK})
