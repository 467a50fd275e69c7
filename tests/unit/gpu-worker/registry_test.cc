// ModelRegistry: lazy and eager loads, the memory budget with LRU eviction, pinned models, no
// eviction while a batch holds the model, failures, and the residency listener. The big_*
// models hold exactly 1 MiB of parameters each (worker_test_models.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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
  ModelRegistry lazy(Budget(0), {broken});
  EXPECT_TRUE(lazy.LoadEager().ok());  // lazy: nothing to load yet
  EXPECT_EQ(Touch(lazy, "broken").code(), codes::kInternal);
  EXPECT_EQ(Touch(lazy, "broken").code(), codes::kInternal);
  EXPECT_EQ(lazy.used_bytes(), 0);
  ModelRegistry start(Budget(0), {eager});
  EXPECT_EQ(start.LoadEager().code(), codes::kInternal);
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
    EXPECT_NE(s.message().find("warmup of model \"big_a\": an input shape over"),
              std::string::npos)
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
  lease.limit()->OnOutOfMemory(4, protocol::MonotonicMicros());
  EXPECT_EQ(r.MaxBatch("big_a", 99), 2u);
}

}  // namespace
}  // namespace ferry::worker
