# Unit tests of ferry::metrics (registry, text format, concurrency, the HTTP endpoint on a real
# socket); include()d from tests/unit/CMakeLists.txt. `ctest -R metrics` selects them.
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)

add_executable(metrics_unit_tests
  ${CMAKE_CURRENT_LIST_DIR}/metrics_registry_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics_text_format_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics_concurrency_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics_server_test.cc)
target_link_libraries(metrics_unit_tests PRIVATE ferry::metrics GTest::gtest_main)
gtest_discover_tests(metrics_unit_tests TEST_PREFIX "metrics." PROPERTIES LABELS unit)
