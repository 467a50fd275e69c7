# cmake -P script: install BUILD_DIR into WORK_DIR/prefix, check the layout, then configure,
# build and run the consumer project in CONSUMER_DIR against it.
foreach(v BUILD_DIR CONSUMER_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_install_test.cmake needs -D${v}=...")
  endif()
endforeach()
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

# 1. A plain install of everything that was built.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# 2. The layout: binaries, SDK headers and libraries, the package config.
file(GLOB config ${prefix}/lib*/cmake/ferry/ferryConfig.cmake ${prefix}/lib/*/cmake/ferry/ferryConfig.cmake)
set(expect
  bin/ferry bin/ferry-broker
  include/ferry/client.h include/ferry/status.h include/ferry/tensor.h include/ferry/result.h)
if(EXPECT_WORKER)
  list(APPEND expect bin/ferry-worker bin/ferry-make-models bin/ferry-whisper-import)
endif()
foreach(f ${expect})
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()
if(NOT config)
  message(FATAL_ERROR "no lib*/cmake/ferry/ferryConfig.cmake under ${prefix}")
endif()
file(GLOB libs ${prefix}/lib*/libferry_client.a ${prefix}/lib/*/libferry_client.a)
if(NOT libs)
  message(FATAL_ERROR "libferry_client.a not installed")
endif()
run(${prefix}/bin/ferry --help)
run(${prefix}/bin/ferry-broker --help)

# 3. A consumer project: find_package(ferry), link ferry::client, build, run.
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/ferry_consumer)
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer printed: ${last_output}")
endif()
message(STATUS "install test ok: ${prefix}")
