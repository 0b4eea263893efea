# Installs clattn into a scratch prefix and builds tests/consumer against it
# three ways: find_package, pkg-config --static with a plain compiler call,
# and add_subdirectory of the source tree. Then builds and installs the
# shared library (-DBUILD_SHARED_LIBS=ON) and links the consumer against it
# through find_package and plain pkg-config: each must load libclattn.so.N.
# Each program must run and pass.
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
# 4. the shared library, installed: find_package and pkg-config
set(shared ${WORK}/shared-prefix)
run(${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/shared-build -DBUILD_SHARED_LIBS=ON
    -DCLATTN_BUILD_TESTS=OFF -DCLATTN_BUILD_CLI=OFF -DCLATTN_BUILD_EXAMPLES=OFF
    -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/shared-build -j2)
run(${CMAKE_COMMAND} --install ${WORK}/shared-build --prefix ${shared})
file(GLOB_RECURSE archives ${shared}/*.a)
file(GLOB_RECURSE sonames ${shared}/*/libclattn.so.${MAJOR})
if(archives OR NOT sonames)
  message(FATAL_ERROR "the shared install holds '${archives}' and no libclattn.so.${MAJOR}")
endif()
run(${CMAKE_COMMAND} -S ${SRC}/tests/consumer -B ${WORK}/shared-config
    -DCMAKE_PREFIX_PATH=${shared})
run(${CMAKE_COMMAND} --build ${WORK}/shared-config)
file(GLOB_RECURSE pcs ${shared}/*/clattn.pc)
get_filename_component(pcdir "${pcs}" DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND pkg-config --cflags --libs clattn
                OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND pkg-config --variable=libdir clattn
                OUTPUT_VARIABLE libdir OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config clattn failed for the shared install")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c99 -Wall -Werror ${SRC}/tests/consumer/main.c -o ${WORK}/shared-consumer
    ${flags} -lm -Wl,-rpath,${libdir}) # -lm: main.c calls logf itself
foreach(program ${WORK}/shared-config/consumer ${WORK}/shared-consumer)
  execute_process(COMMAND ${READELF} -d ${program} OUTPUT_VARIABLE dyn)
  if(NOT dyn MATCHES "\\(NEEDED\\)[^\n]*\\[libclattn\\.so\\.${MAJOR}\\]")
    message(FATAL_ERROR "${program} does not load libclattn.so.${MAJOR}:\n${dyn}")
  endif()
  run(${program})
endforeach()
file(REMOVE_RECURSE ${WORK})
