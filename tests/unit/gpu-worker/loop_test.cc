// The whole worker in-process: a real redis-server on a free port, and the test itself playing
// the broker on a ROUTER socket. Checks READY, CHUNK -> results in Redis -> DONE (each id
// exactly once, after its write), failures for undecodable entries and unknown models,
// heartbeats, REANNOUNCE, and the drain on stop (DONE before BYE).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"
#include "ferry/worker/worker.h"
#include "process.h"
#include "test_models.h"

namespace ferry::worker {
namespace {

using protocol::Message;

using testutil::FreePort;

std::string InputsRaw(const std::vector<Tensor>& inputs) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_array(static_cast<uint32_t>(inputs.size()));
  for (const auto& t : inputs) protocol::PackTensor(pk, t);
  return std::string(buf.data(), buf.size());
}

struct Entry {
  std::string id, model, inputs_raw;
  int64_t ttl = 0;
  int64_t deadline_us = 0;
};

zmq::message_t Chunk(const std::vector<Entry>& entries) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries)
    protocol::PackChunkEntry(pk, e.id, e.model, e.inputs_raw, 1, 0, e.ttl, 111, 222, e.deadline_us);
  return protocol::ToMessage(std::move(buf));
}

Tensor Row(int j) {
  std::vector<float> x(8);
  for (int i = 0; i < 8; ++i) x[i] = 0.5f * i - j;
  return Tensor::From<float>(x, {8}, DType::kFloat32);
}

class WorkerLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_client_ = redis_.Connect();
    ASSERT_TRUE(redis_client_ != nullptr);
    // Per process (ctest runs these tests in parallel), removed at exit.
    models_ = testmodels::ScratchDir("ferry_worker_loop_").string();
    const std::string cmd =
        std::string(FERRY_MAKE_MODELS) + " " + models_ + " tiny slow > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    router_.bind("tcp://127.0.0.1:*");
    router_.set(zmq::sockopt::linger, 0);
  }

  // Receives the next message that is not a HEARTBEAT, within `ms`.
  bool Next(Message* m, int ms = 20000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<zmq::pollitem_t> items = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, std::chrono::milliseconds(50));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      if (!protocol::RecvMessage(router_, true, m, true).ok()) continue;
      if (m->command == protocol::kHeartbeat) {
        ++heartbeats_;
        continue;
      }
      return true;
    }
    return false;
  }

  // Stops the worker and collects the ids of the DONEs it sends until its BYE.
  void StopAndDrain(Worker* worker, std::set<std::string>* drained) {
    worker->RequestStop();
    Message m;
    while (true) {
      ASSERT_TRUE(Next(&m));
      if (m.command == protocol::kBye) break;
      ASSERT_EQ(m.command, protocol::kDone);
      for (const auto& id : DoneIds(m)) drained->insert(id);
    }
  }

  std::vector<std::string> DoneIds(const Message& m) {
    msgpack::object_handle oh;
    std::vector<std::string> ids;
    EXPECT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    EXPECT_TRUE(protocol::GetStringArray(oh.get(), "ids", &ids).ok());
    return ids;
  }

  Result ReadResult(const std::string& id) {
    std::string value;
    bool found = false;
    EXPECT_TRUE(redis_client_->Get("ferry:result:" + id, &value, &found).ok());
    EXPECT_TRUE(found) << id;
    Result r;
    EXPECT_TRUE(protocol::DecodeResult(value.data(), value.size(), &r).ok()) << id;
    return r;
  }

  // A model ferry-make-models wrote in SetUp.
  ModelConfig Model(const std::string& name) {
    ModelConfig m;
    m.name = name;
    m.path = models_ + "/" + name + ".pt";
    return m;
  }

  WorkerOptions Options(int redis_port) {
    WorkerOptions o;
    o.broker = router_.get(zmq::sockopt::last_endpoint);
    o.redis = "redis://127.0.0.1:" + std::to_string(redis_port);
    o.models = {Model("tiny")};
    o.max_batch = 4;
    o.instances = 2;
    o.threads = 1;
    o.name = "test-worker";
    o.heartbeat_ms = 50;
    o.liveness = 1000;  // this fake broker sends no heartbeats; tests that want them lower it
    o.result_ttl_s = 100;
    return o;
  }

  // One executor of `slow` (spin n: ~n ms) taking one job at a time: the others wait in the
  // worker's queue behind it.
  WorkerOptions SlowLane() {
    WorkerOptions o = Options(redis_.port());
    o.models = {Model("slow")};
    o.instances = 1;
    o.max_batch = 1;
    return o;
  }

  testutil::RedisServer redis_;
  std::unique_ptr<protocol::RedisClient> redis_client_;
  std::string models_;
  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  int heartbeats_ = 0;
};

TEST_F(WorkerLoopTest, RunsChunksReportsEveryJobOnceAndDrainsOnStop) {
  WorkerOptions o = Options(redis_.port());
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(o, &worker).ok());
  Status run_status = Status::Internal("not run");
  std::thread run([&] { run_status = worker->Run(); });

  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  const std::string peer(m.envelope.at(0).to_string_view());
  {
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    protocol::WorkerHello hello;
    ASSERT_TRUE(protocol::DecodeHello(oh.get(), &hello).ok());
    EXPECT_EQ(hello.worker, "test-worker");
    EXPECT_EQ(hello.device, "cpu");
    EXPECT_EQ(hello.pid, getpid());
    EXPECT_EQ(hello.capacity, 4 * 3);
    ASSERT_EQ(hello.models.size(), 1u);
    EXPECT_EQ(hello.models[0].name, "tiny");
    EXPECT_EQ(hello.models[0].max_batch, 4);
    ASSERT_TRUE(hello.resident.has_value());  // loaded eagerly and warm before READY
    EXPECT_EQ(*hello.resident, std::vector<std::string>({"tiny"}));
  }

  // Bad entry: the tensor's data is 3 bytes where [8] float32 needs 32.
  std::string bad_raw;
  {
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_array(1);
    protocol::PackTensor(pk, DType::kFloat32, {8}, "abc", 3);
    bad_raw.assign(buf.data(), buf.size());
  }
  std::vector<Entry> entries;
  for (int j = 0; j < 6; ++j)
    entries.push_back({"t" + std::to_string(j), "tiny", InputsRaw({Row(j)}), j == 0 ? 50 : 0});
  entries.push_back({"bad-entry", "tiny", bad_raw});
  entries.push_back({"unk", "nope", InputsRaw({Row(0)})});
  entries.push_back(
      {"wrong-shape", "tiny", InputsRaw({Tensor::From<float>({1, 2, 3}, {3}, DType::kFloat32)})});
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kChunk, Chunk(entries)).ok());

  std::multiset<std::string> done;
  while (done.size() < entries.size()) {
    ASSERT_TRUE(Next(&m)) << "DONE for " << done.size() << " of " << entries.size();
    ASSERT_EQ(m.command, protocol::kDone);
    for (const auto& id : DoneIds(m)) {
      done.insert(id);
      std::string value;
      bool found = false;  // DONE comes only after the write
      ASSERT_TRUE(redis_client_->Get("ferry:result:" + id, &value, &found).ok());
      EXPECT_TRUE(found) << id;
    }
  }
  for (const auto& e : entries) EXPECT_EQ(done.count(e.id), 1u) << e.id;

  for (int j = 0; j < 6; ++j) {
    Result r = ReadResult("t" + std::to_string(j));
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
    EXPECT_EQ(r.model, "tiny");
    EXPECT_EQ(r.worker, "test-worker");
    EXPECT_EQ(r.attempt, 1);
    EXPECT_GE(r.batch_size, 1);
    EXPECT_LE(r.batch_size, 4);
    for (const char* k :
         {"submitted", "dispatched", "received", "compute_start", "compute_end", "finished"})
      EXPECT_EQ(r.timing_us.count(k), 1u) << k;
    EXPECT_EQ(r.timing_us["submitted"], 111);
    EXPECT_LE(r.timing_us["compute_start"], r.timing_us["compute_end"]);
    ASSERT_EQ(r.outputs.size(), 1u);
    auto y = r.outputs[0].As<float>();
    auto x = Row(j).As<float>();
    ASSERT_EQ(y.size(), 8u);
    for (int c = 0; c < 8; ++c) {
      double want = 0.1 * c;
      for (int i = 0; i < 8; ++i) want += x[i] * (0.01 * (i * 8 + c) - 0.3);
      EXPECT_NEAR(y[c], want, 1e-5);
    }
  }
  EXPECT_EQ(ReadResult("bad-entry").error.code(), codes::kInvalidArgument);
  EXPECT_EQ(ReadResult("unk").error.code(), codes::kUnknownModel);
  Result wrong = ReadResult("wrong-shape");
  EXPECT_EQ(wrong.state, JobState::kFailed);
  EXPECT_EQ(wrong.error.code(), codes::kModelError);
  EXPECT_FALSE(wrong.error.message().empty());

  protocol::RedisReply ttl;
  ASSERT_TRUE(redis_client_->Command({"TTL", "ferry:result:t0"}, &ttl).ok());
  EXPECT_TRUE(ttl.integer > 40 && ttl.integer <= 50) << ttl.integer;
  ASSERT_TRUE(redis_client_->Command({"TTL", "ferry:result:t1"}, &ttl).ok());
  EXPECT_TRUE(ttl.integer > 90 && ttl.integer <= 100) << ttl.integer;

  // REANNOUNCE -> READY again.
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kReannounce, protocol::EncodeEmpty()).ok());
  ASSERT_TRUE(Next(&m));
  EXPECT_EQ(m.command, protocol::kReady);

  // The link heartbeats every heartbeat_ms (50) while it runs.
  const auto heartbeat_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (heartbeats_ == 0 && std::chrono::steady_clock::now() < heartbeat_deadline) {
    std::vector<zmq::pollitem_t> items = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, std::chrono::milliseconds(50));
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    ASSERT_TRUE(protocol::RecvMessage(router_, true, &m, true).ok());
    ASSERT_EQ(m.command, protocol::kHeartbeat);
    ++heartbeats_;
  }
  EXPECT_GT(heartbeats_, 0);

  // Stop while a chunk is held: its DONE comes before BYE.
  ASSERT_TRUE(protocol::SendTo(
                  router_, peer, protocol::kChunk,
                  Chunk({{"s1", "tiny", InputsRaw({Row(1)})}, {"s2", "tiny", InputsRaw({Row(2)})}}))
                  .ok());
  // Stop only once the chunk has arrived (so that it is held, not just in flight).
  ASSERT_TRUE(testutil::WaitFor(
      [&] {
        std::string value;
        bool found = false;
        return redis_client_->Get("ferry:result:s1", &value, &found).ok() && found;
      },
      std::chrono::seconds(10)));
  std::set<std::string> drained;
  ASSERT_NO_FATAL_FAILURE(StopAndDrain(worker.get(), &drained));
  EXPECT_EQ(drained, std::set<std::string>({"s1", "s2"}));
  run.join();
  EXPECT_TRUE(run_status.ok()) << run_status.ToString();
}

TEST_F(WorkerLoopTest, HoldsResultsWhileRedisIsDownAndDoneFollowsTheWrite) {
  const int port = FreePort();  // nothing listens here yet
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(Options(port), &worker).ok());
  std::thread run([&] { EXPECT_TRUE(worker->Run().ok()); });
  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  const std::string peer(m.envelope.at(0).to_string_view());
  ASSERT_TRUE(protocol::SendTo(
                  router_, peer, protocol::kChunk,
                  Chunk({{"r1", "tiny", InputsRaw({Row(1)})}, {"r2", "tiny", InputsRaw({Row(2)})}}))
                  .ok());
  EXPECT_FALSE(Next(&m, 500)) << "no DONE while the results cannot be written: " << m.command;

  testutil::RedisServer::Options late_options;
  late_options.port = port;
  testutil::RedisServer late(late_options);
  auto late_client = late.Connect();
  ASSERT_TRUE(late_client != nullptr);
  std::set<std::string> done;
  while (done.size() < 2) {
    ASSERT_TRUE(Next(&m, 10000));
    ASSERT_EQ(m.command, protocol::kDone);
    for (const auto& id : DoneIds(m)) done.insert(id);
  }
  for (const char* id : {"r1", "r2"}) {
    std::string value;
    bool found = false;
    ASSERT_TRUE(late_client->Get(std::string("ferry:result:") + id, &value, &found).ok());
    EXPECT_TRUE(found) << id;
  }
  worker->RequestStop();
  ASSERT_TRUE(Next(&m));
  EXPECT_EQ(m.command, protocol::kBye);
  run.join();
}

TEST_F(WorkerLoopTest, LazyModelIsReannouncedAsResidentOnceLoaded) {
  WorkerOptions o = Options(redis_.port());
  o.models[0].load = LoadPolicy::kLazy;
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(o, &worker).ok());
  std::thread run([&] { EXPECT_TRUE(worker->Run().ok()); });
  auto resident = [](const Message& m) {
    msgpack::object_handle oh;
    protocol::WorkerHello hello;
    EXPECT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    EXPECT_TRUE(protocol::DecodeHello(oh.get(), &hello).ok());
    EXPECT_EQ(hello.models.size(), 1u);  // served from the start, loaded on first use
    return hello.resident.value_or(std::vector<std::string>{"(absent)"});
  };
  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  EXPECT_TRUE(resident(m).empty());
  const std::string peer(m.envelope.at(0).to_string_view());
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kChunk,
                               Chunk({{"l1", "tiny", InputsRaw({Row(1)})}}))
                  .ok());
  bool done = false, announced = false;
  while (!done || !announced) {
    ASSERT_TRUE(Next(&m));
    if (m.command == protocol::kReady) {
      EXPECT_EQ(resident(m), std::vector<std::string>({"tiny"}));
      announced = true;
    } else {
      ASSERT_EQ(m.command, protocol::kDone);
      done = true;
    }
  }
  EXPECT_EQ(ReadResult("l1").state, JobState::kDone);
  worker->RequestStop();
  ASSERT_TRUE(Next(&m));
  EXPECT_EQ(m.command, protocol::kBye);
  run.join();
}

TEST_F(WorkerLoopTest, ReconnectsAndReannouncesWhenTheBrokerFallsSilent) {
  WorkerOptions o = Options(redis_.port());
  o.liveness = 2;  // silent for 100 ms: presumed dead
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(o, &worker).ok());
  std::thread run([&] { EXPECT_TRUE(worker->Run().ok()); });
  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  const std::string first(m.envelope.at(0).to_string_view());
  // Answer nothing: the worker must give up on this connection and announce itself again
  // on a fresh socket (a new identity at the ROUTER).
  ASSERT_TRUE(Next(&m, 5000));
  EXPECT_EQ(m.command, protocol::kReady);
  EXPECT_NE(std::string(m.envelope.at(0).to_string_view()), first);
  worker->RequestStop();
  run.join();
}

// A READY says which jobs the worker holds: received, and not yet in a DONE it sent (so that a
// restarted broker leaves them with it, protocol.md). Here one runs, one waits behind it in the
// worker's queue, and one is done and reported: the READY after a REANNOUNCE lists the two.
TEST_F(WorkerLoopTest, AReadyListsTheJobsItHolds) {
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(SlowLane(), &worker).ok());
  std::thread run([&] { EXPECT_TRUE(worker->Run().ok()); });
  auto held = [](const Message& m) {
    msgpack::object_handle oh;
    protocol::WorkerHello hello;
    EXPECT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    EXPECT_TRUE(protocol::DecodeHello(oh.get(), &hello).ok());
    return std::set<std::string>(hello.held.begin(), hello.held.end());
  };
  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  EXPECT_TRUE(held(m).empty());
  const std::string peer(m.envelope.at(0).to_string_view());
  const auto spin = [](float n) {
    return InputsRaw({Tensor::From<float>({n}, {1}, DType::kFloat32)});
  };
  ASSERT_TRUE(
      protocol::SendTo(
          router_, peer, protocol::kChunk,
          Chunk({{"h0", "slow", spin(1)}, {"h1", "slow", spin(3000)}, {"h2", "slow", spin(1)}}))
          .ok());
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kDone);
  ASSERT_EQ(DoneIds(m), std::vector<std::string>{"h0"});
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kReannounce, protocol::EncodeEmpty()).ok());
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  EXPECT_EQ(held(m), (std::set<std::string>{"h1", "h2"}));
  std::set<std::string> drained;
  ASSERT_NO_FATAL_FAILURE(StopAndDrain(worker.get(), &drained));
  EXPECT_EQ(drained, (std::set<std::string>{"h1", "h2"}));
  run.join();
}

TEST_F(WorkerLoopTest, JobPastItsDeadlineIsExpiredWithoutRunning) {
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(Options(redis_.port()), &worker).ok());
  std::thread run([&] { EXPECT_TRUE(worker->Run().ok()); });
  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  const std::string peer(m.envelope.at(0).to_string_view());
  const int64_t now = protocol::NowMicros();
  Entry late{"e-late", "tiny", InputsRaw({Row(1)})};
  late.deadline_us = now - 1000;
  Entry fine{"e-fine", "tiny", InputsRaw({Row(2)})};
  fine.deadline_us = now + 60'000'000;
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kChunk, Chunk({late, fine})).ok());
  std::set<std::string> done;
  while (done.size() < 2) {
    ASSERT_TRUE(Next(&m));
    ASSERT_EQ(m.command, protocol::kDone);
    for (const auto& id : DoneIds(m)) done.insert(id);
  }
  Result r = ReadResult("e-late");
  EXPECT_EQ(r.state, JobState::kExpired);
  EXPECT_EQ(r.error.code(), codes::kExpired);
  EXPECT_EQ(r.timing_us.count("compute_start"), 0u) << "an expired job never reaches the model";
  EXPECT_EQ(ReadResult("e-fine").state, JobState::kDone);
  worker->RequestStop();
  run.join();
}

TEST_F(WorkerLoopTest, CancelDropsQueuedJobsAndCountsDuplicateResults) {
  std::unique_ptr<Worker> worker;
  ASSERT_TRUE(Worker::Create(SlowLane(), &worker).ok());
  std::thread run([&] { EXPECT_TRUE(worker->Run().ok()); });
  Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, protocol::kReady);
  const std::string peer(m.envelope.at(0).to_string_view());
  const auto spin = [](float n) {
    return InputsRaw({Tensor::From<float>({n}, {1}, DType::kFloat32)});
  };
  // The broker already wrote a final result for c0 (say it expired there): the worker's
  // result must not replace it, and DONE says it was a duplicate.
  protocol::RedisReply set;
  ASSERT_TRUE(redis_client_->Command({"SET", "ferry:result:c0", "first"}, &set).ok());
  // One executor: c1 runs for a while, c2 and c3 wait in the worker's queue behind it.
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kChunk,
                               Chunk({{"c0", "slow", spin(1)},
                                      {"c1", "slow", spin(400)},
                                      {"c2", "slow", spin(1)},
                                      {"c3", "slow", spin(1)}}))
                  .ok());
  std::set<std::string> done;
  int64_t duplicates = 0;
  const auto next_done = [&] {
    ASSERT_TRUE(Next(&m));
    ASSERT_EQ(m.command, protocol::kDone);
    for (const auto& id : DoneIds(m)) done.insert(id);
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    int64_t d = 0;
    ASSERT_TRUE(protocol::GetInt(oh.get(), "duplicates", &d, 0).ok());
    duplicates += d;
  };
  // Cancel once c0 is done: then c1 runs, and c2 and c3 wait behind it.
  while (done.count("c0") == 0) ASSERT_NO_FATAL_FAILURE(next_done());
  ASSERT_EQ(done.count("c1"), 0u) << "c1 must still run when the CANCEL comes";
  ASSERT_TRUE(protocol::SendTo(router_, peer, protocol::kCancel,
                               protocol::EncodeIds({"c2", "c3", "not-here"}))
                  .ok());
  while (done.size() < 4) ASSERT_NO_FATAL_FAILURE(next_done());
  EXPECT_EQ(duplicates, 1);
  std::string value;
  bool found = false;
  ASSERT_TRUE(redis_client_->Get("ferry:result:c0", &value, &found).ok());
  EXPECT_EQ(value, "first") << "the first final result wins";
  EXPECT_EQ(ReadResult("c1").state, JobState::kDone);
  for (const char* id : {"c2", "c3"}) {
    Result r = ReadResult(id);
    EXPECT_EQ(r.state, JobState::kCancelled) << id;
    EXPECT_EQ(r.timing_us.count("compute_start"), 0u) << id;
  }
  worker->RequestStop();
  run.join();
}

}  // namespace
}  // namespace ferry::worker
