# Unit tests of the producer SDK and the `ferry` CLI; include()d from tests/unit/CMakeLists.txt.
# They start a real redis-server (on a free port, in a temp dir) where they need Redis.
# Test names get a lower-case prefix so that `ctest -R 'client|npy'` selects them.
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)

add_executable(client_unit_tests
  ${CMAKE_CURRENT_LIST_DIR}/client_cli_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/client_frontend_connection_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/client_notice_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/client_poll_wait_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/client_run_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/client_submit_test.cc)
target_link_libraries(client_unit_tests PRIVATE ferry::client ferry_cli ferry_testutil
  GTest::gtest_main)
# client_frontend_connection_test.cc tests the SDK's internal FrontendConnection.
target_include_directories(client_unit_tests PRIVATE ${PROJECT_SOURCE_DIR}/producer-sdk/src)
target_link_libraries(client_unit_tests PRIVATE PkgConfig::ZMQ)
gtest_discover_tests(client_unit_tests TEST_PREFIX "client." PROPERTIES LABELS unit)

add_executable(npy_unit_tests ${CMAKE_CURRENT_LIST_DIR}/npy_format_test.cc)
target_link_libraries(npy_unit_tests PRIVATE ferry_cli GTest::gtest_main)
gtest_discover_tests(npy_unit_tests TEST_PREFIX "npy." PROPERTIES LABELS unit)

# <ferry/torch_convert.h> is header-only; one TU (~30 s to compile) checks it where libtorch is.
if(Torch_FOUND)
  add_executable(client_torch_convert_test ${CMAKE_CURRENT_LIST_DIR}/client_torch_convert_test.cc)
  target_link_libraries(client_torch_convert_test PRIVATE ferry::client ${TORCH_LIBRARIES}
                        GTest::gtest_main)
  gtest_discover_tests(client_torch_convert_test TEST_PREFIX "client." PROPERTIES LABELS unit
                       DISCOVERY_TIMEOUT 60)
endif()
