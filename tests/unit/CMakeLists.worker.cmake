# Worker unit tests: the batch path on real TorchScript models, the engine (padding, conversion,
# out-of-memory halving, warmup, concurrent executors), the model registry (memory budget, LRU),
# the repository file, the local job queue, the flags, the model generator, the result writer
# (both write paths, against a real redis-server), the broker link with a writer behind it, and
# one in-process worker against a real redis-server and a test-side ROUTER standing in for the
# broker.
# Included from tests/unit/CMakeLists.txt; needs the ferry_worker and ferry-make-models targets
# (only defined when libtorch is found).
if(TARGET ferry_worker AND TARGET ferry-make-models)
  add_executable(ferry_worker_unit_tests
    ${CMAKE_CURRENT_LIST_DIR}/worker_batcher_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_broker_link_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_config_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_engine_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_job_queue_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_loop_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_make_models_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_options_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_registry_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_result_writer_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_test_models.cc)
  # Only worker_batcher_test.cc and worker_test_models.cc include libtorch (they define models).
  target_link_libraries(ferry_worker_unit_tests PRIVATE
    ferry::worker ferry_testutil ${TORCH_LIBRARIES} GTest::gtest_main)
  target_compile_options(ferry_worker_unit_tests PRIVATE -Wall -Wextra)
  target_compile_definitions(ferry_worker_unit_tests PRIVATE
    FERRY_MAKE_MODELS="$<TARGET_FILE:ferry-make-models>")
  add_dependencies(ferry_worker_unit_tests ferry-make-models)
  gtest_discover_tests(ferry_worker_unit_tests
    TEST_PREFIX "worker."
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS unit TIMEOUT 120)

  # GPU tests: need CUDA libtorch and a device; off by default (-DFERRY_GPU_TESTS=ON).
  if(FERRY_GPU_TESTS)
    add_executable(ferry_worker_gpu_tests
      ${CMAKE_CURRENT_LIST_DIR}/worker_gpu_test.cc
      ${CMAKE_CURRENT_LIST_DIR}/worker_test_models.cc)
    target_link_libraries(ferry_worker_gpu_tests PRIVATE
      ferry::worker ${TORCH_LIBRARIES} GTest::gtest_main)
    target_compile_options(ferry_worker_gpu_tests PRIVATE -Wall -Wextra)
    gtest_discover_tests(ferry_worker_gpu_tests
      TEST_PREFIX "worker.gpu."
      DISCOVERY_MODE PRE_TEST  # list the tests when ctest runs, not at build time (a build host may have no GPU driver)
      DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS gpu TIMEOUT 300)
  endif()
endif()
