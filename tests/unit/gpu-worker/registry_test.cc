// ModelRegistry: lazy and eager loads, the memory budget with LRU eviction, pinned models, no
// eviction while a batch holds the model, failures, and the residency listener. The big_*
// models hold exactly 1 MiB of parameters each (worker_test_models.cc).
#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "ferry/protocol/util.h"
#include "model_registry.h"
#include "process.h"  // testutil::WaitFor
#include "test_models.h"

namespace ferry::worker {
namespace {

constexpr int64_t kMiB = testmodels::kBigBytes;

ModelConfig Big(char which, bool pinned = false, LoadPolicy load = LoadPolicy::kLazy) {
  ModelConfig c;
  c.name = std::string("big_") + which;
  c.path = testmodels::Path(c.name);
  c.device = "cpu";
  c.max_batch = 4;
  c.pinned = pinned;
  c.load = load;
  return c;
}

ModelRegistry::Options Budget(int64_t bytes, int64_t wait_ms = 60000) {
  ModelRegistry::Options o;
  o.memory_budget = bytes;
  o.wait_for_room_ms = wait_ms;
  return o;
}

Status Touch(ModelRegistry& r, const std::string& name) {
  ModelRegistry::Lease lease;
  return r.Acquire(name, &lease);
}

TEST(RegistryTest, LazyModelsLoadOnFirstUseAndAreMeasured) {
  ModelRegistry r(Budget(0), {Big('a'), Big('b', false, LoadPolicy::kEager)});
  EXPECT_TRUE(r.Resident().empty());
  ASSERT_TRUE(r.LoadEager().ok());
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_b"}));
  ModelRegistry::Lease lease;
  ASSERT_TRUE(r.Acquire("big_a", &lease).ok());
  EXPECT_EQ(lease.model().memory_bytes(), kMiB);
  EXPECT_EQ(lease.model().name(), "big_a");
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_a", "big_b"}));
  EXPECT_EQ(r.used_bytes(), 2 * kMiB);
  EXPECT_EQ(r.loads(), 2);
  EXPECT_EQ(r.Acquire("nope", &lease).code(), codes::kUnknownModel);
}

// A model's memory on the CPU counts its tensors however it holds them: a plain tensor
// attribute as a parameter, and a frozen module (no attributes left: its weight is a constant
// in its code) by its file's size. Before, both counted 0 bytes against the memory budget.
TEST(RegistryTest, TensorAttributesAndFrozenWeightsCountAgainstTheBudget) {
  ModelConfig attr = Big('a');
  attr.name = "attr_big";
  attr.path = testmodels::Path(attr.name);
  ModelConfig frozen = Big('a');
  frozen.name = "frozen_big";
  frozen.path = testmodels::Path(frozen.name);
  ModelRegistry r(Budget(0), {attr, frozen});
  ModelRegistry::Lease lease;
  ASSERT_TRUE(r.Acquire("attr_big", &lease).ok());
  EXPECT_EQ(lease.model().memory_bytes(), kMiB);
  ASSERT_TRUE(r.Acquire("frozen_big", &lease).ok());
  EXPECT_GE(lease.model().memory_bytes(), kMiB);
  EXPECT_LT(lease.model().memory_bytes(), kMiB + kMiB / 4);  // the file: the weight and code
  EXPECT_GE(r.used_bytes(), 2 * kMiB);
}

TEST(RegistryTest, LeastRecentlyUsedIdleModelIsEvicted) {
  ModelRegistry r(Budget(2 * kMiB + kMiB / 2), {Big('a'), Big('b'), Big('c')});
  std::atomic<int> announcements{0};
  r.SetListener([&] { announcements.fetch_add(1); });
  ASSERT_TRUE(Touch(r, "big_a").ok());
  ASSERT_TRUE(Touch(r, "big_b").ok());
  ASSERT_TRUE(Touch(r, "big_a").ok());  // b is now the least recently used
  ASSERT_TRUE(Touch(r, "big_c").ok());
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_a", "big_c"}));
  EXPECT_EQ(r.evictions(), 1);
  EXPECT_LE(r.used_bytes(), 2 * kMiB + kMiB / 2);
  EXPECT_EQ(announcements.load(), 4);   // a, b, c resident, b unloaded
  ASSERT_TRUE(Touch(r, "big_b").ok());  // and back: a is now the LRU
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_b", "big_c"}));
  EXPECT_EQ(r.loads(), 4);
}

TEST(RegistryTest, PinnedModelsAreNeverEvicted) {
  ModelRegistry r(Budget(2 * kMiB + kMiB / 2), {Big('a', true), Big('b'), Big('c')});
  for (const char* name : {"big_a", "big_b", "big_c", "big_b"}) ASSERT_TRUE(Touch(r, name).ok());
  auto resident = r.Resident();
  EXPECT_EQ(resident.front(), "big_a");
  EXPECT_EQ(resident.size(), 2u);
  // With a pinned model taking half of a 1.5 MiB budget, a 1 MiB model can never fit.
  ModelRegistry tight(Budget(kMiB + kMiB / 2), {Big('a', true), Big('b')});
  ASSERT_TRUE(Touch(tight, "big_a").ok());
  Status s = Touch(tight, "big_b");
  EXPECT_EQ(s.code(), codes::kTooLarge);
  EXPECT_NE(s.message().find("big_b"), std::string::npos);
}

TEST(RegistryTest, AModelWithABatchRunningIsNotEvicted) {
  ModelRegistry r(Budget(kMiB + kMiB / 2), {Big('a'), Big('b')});
  ModelRegistry::Lease running;  // a batch of big_a in progress
  ASSERT_TRUE(r.Acquire("big_a", &running).ok());
  std::atomic<bool> loaded{false};
  std::thread other([&] {
    ModelRegistry::Lease lease;
    EXPECT_TRUE(r.Acquire("big_b", &lease).ok());
    loaded.store(true);
  });
  // Not synchronisation: a window for a wrong eviction (of big_a, under its running batch) to
  // happen in; nothing may change within it.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(loaded.load());
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_a"}));
  EXPECT_EQ(running.model().name(), "big_a");
  running.Reset();  // the batch ends: now big_a may go
  other.join();
  EXPECT_TRUE(loaded.load());
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_b"}));
}

// A model that is loading (here: a long warmup) holds its bytes only until it is loaded and
// idle: another model that needs them waits for it and then evicts it. Before, a loading model
// counted as pinned, and the other failed too_large at once, for good.
TEST(RegistryTest, ALoadWaitsForAModelLoadingInsteadOfFailingTooLarge) {
  ModelConfig slow = Big('a');
  slow.warmup.inputs = {TensorSpec{DType::kFloat32, {1 << 20}}};  // 4 MiB of zeros a batch
  slow.warmup.batch_sizes = {1};
  slow.warmup.iterations = 1000;  // ~1 s here
  ModelRegistry r(Budget(kMiB + kMiB / 2), {slow, Big('b')});
  std::thread loader([&] { EXPECT_TRUE(Touch(r, "big_a").ok()); });
  // big_a is loading: its bytes are reserved, and it is not resident yet.
  ASSERT_TRUE(testutil::WaitFor([&] { return r.used_bytes() > 0; }));
  EXPECT_TRUE(r.Resident().empty()) << "big_a loaded before the test looked: warm it up longer";
  const Status s = Touch(r, "big_b");
  loader.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_b"}));
  EXPECT_EQ(r.evictions(), 1);
}

TEST(RegistryTest, LoadWaitingTooLongForBusyModelsFails) {
  ModelRegistry r(Budget(kMiB + kMiB / 2, /*wait_ms=*/100), {Big('a'), Big('b')});
  ModelRegistry::Lease running;
  ASSERT_TRUE(r.Acquire("big_a", &running).ok());
  EXPECT_EQ(Touch(r, "big_b").code(), codes::kUnavailable);
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_a"}));
}

TEST(RegistryTest, FailedLoadsAreReportedAndRetried) {
  ModelConfig broken = Big('a');
  broken.name = "broken";
  broken.path = "/nonexistent/broken.pt";
  ModelConfig eager = broken;
  eager.load = LoadPolicy::kEager;
  ModelRegistry::Options retry_at_once = Budget(0);
  retry_at_once.load_retry_us = 0;
  ModelRegistry lazy(retry_at_once, {broken});
  EXPECT_TRUE(lazy.LoadEager().ok());  // lazy: nothing to load yet
  EXPECT_EQ(Touch(lazy, "broken").code(), codes::kInternal);
  const Status again = Touch(lazy, "broken");
  EXPECT_EQ(again.code(), codes::kInternal);
  EXPECT_EQ(again.message().find("its load failed"), std::string::npos) << "tried again";
  EXPECT_EQ(lazy.used_bytes(), 0);
  ModelRegistry start(Budget(0), {eager});
  EXPECT_EQ(start.LoadEager().code(), codes::kInternal);
}

// A model file that does not load (here: 1 MiB of garbage) makes room for itself, as its size
// says, before it fails. For load_retry_us after that its batches fail with the same error
// without unloading anything again (after it, it is tried again: FailedLoadsAreReportedAndRetried
// with a window of 0). Before, every batch of it unloaded the healthy model to fail again.
TEST(RegistryTest, AFailedLoadIsNotTriedAgainForAWhileNorUnloadsOthersMeanwhile) {
  const std::string garbage = testing::TempDir() + "/garbage-" + std::to_string(getpid()) + ".pt";
  {
    std::ofstream out(garbage, std::ios::binary);
    out << std::string(static_cast<size_t>(kMiB), 'x');
  }
  ModelConfig broken = Big('a');
  broken.name = "broken";
  broken.path = garbage;
  ModelRegistry::Options o = Budget(kMiB + kMiB / 2);
  o.load_retry_us = 600 * 1000 * 1000;  // no retry within the test, however slow the machine
  ModelRegistry r(o, {broken, Big('b')});
  ASSERT_TRUE(Touch(r, "big_b").ok());
  const Status first = Touch(r, "broken");
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(r.evictions(), 1);  // big_b made room
  ASSERT_TRUE(Touch(r, "big_b").ok());
  const Status cached = Touch(r, "broken");
  EXPECT_EQ(cached.code(), first.code());
  EXPECT_NE(cached.message().find(first.message() + " (its load failed "), std::string::npos)
      << cached.message();
  EXPECT_EQ(r.evictions(), 1) << "big_b unloaded again for a load that was not tried";
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_b"}));
  std::remove(garbage.c_str());
}

// A warmup input bigger than any job input can be fails the load with invalid_argument, on every
// try, and the registry goes on serving its other models. Before, allocating it threw out of
// the load (std::bad_alloc) with the model left "loading": every later use of it waited for
// ever, and the executor with it.
TEST(RegistryTest, AWarmupTooBigFailsTheLoadAndTheOthersServe) {
  ModelConfig huge = Big('a');
  huge.warmup.inputs = {TensorSpec{DType::kFloat32, {int64_t{400000000000}}}};  // 1.6 TB
  huge.warmup.batch_sizes = {1};
  ModelRegistry r(Budget(0), {huge, Big('b')});
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Status s = Touch(r, "big_a");
    EXPECT_EQ(s.code(), codes::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("warmup of model \"big_a\": an input shape over"), std::string::npos)
        << s.message();
  }
  EXPECT_TRUE(Touch(r, "big_b").ok());
  EXPECT_EQ(r.Resident(), std::vector<std::string>({"big_b"}));
}

TEST(RegistryTest, MaxBatchFollowsTheBatchLimit) {
  ModelRegistry r(Budget(0), {Big('a')});
  EXPECT_EQ(r.MaxBatch("big_a", 99), 4u);
  EXPECT_EQ(r.MaxBatch("unknown", 99), 99u);
  ModelRegistry::Lease lease;
  ASSERT_TRUE(r.Acquire("big_a", &lease).ok());
  lease.limit()->LowerTo(2, protocol::MonotonicMicros());
  EXPECT_EQ(r.MaxBatch("big_a", 99), 2u);
}

}  // namespace
}  // namespace ferry::worker
