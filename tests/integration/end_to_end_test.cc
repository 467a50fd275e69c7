// The whole job path on real components: redis-server, ferry-broker and ferry-worker processes
// on free ports, ZeroMQ over TCP, TorchScript models, and the producer SDK. The same fleet spoken
// to over raw wire frames: wire_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <set>
#include <thread>

#include "ferry/client.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"
#include "reference.h"

namespace ferry {
namespace {

using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Fleet;
using testutil::FleetOptions;

std::unique_ptr<Client> Connect(Fleet& fleet, bool push_results = true) {
  ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.push_results = push_results;
  std::unique_ptr<Client> c;
  Status s = Client::Create(o, &c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

Job TinyJob(uint32_t seed) {
  Job j;
  j.model = "tiny";
  j.inputs = {testutil::RandomFloats({8}, seed)};
  return j;
}

// Submits all jobs in one message and waits for every result.
std::vector<Result> RunAll(Client& c, const std::vector<Job>& jobs, Fleet& fleet) {
  std::vector<SubmitOutcome> outcomes;
  Status s = c.SubmitMany(jobs, &outcomes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<Result> results(jobs.size());
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    Status w = c.Wait(outcomes[i].id, 60000, &results[i]);
    EXPECT_TRUE(w.ok()) << w.ToString() << "\n" << fleet.Logs();
  }
  return results;
}

class EndToEnd : public ::testing::Test {
 protected:
  void StartFleet(FleetOptions o) {
    fleet_ = std::make_unique<Fleet>(std::move(o));
    ASSERT_TRUE(fleet_->WaitForWorkers(fleet_->worker_count())) << fleet_->Logs();
    client_ = Connect(*fleet_);
  }
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<Client> client_;
};

TEST_F(EndToEnd, ResultsEqualDirectModelCallsAndBatchesForm) {
  FleetOptions o;
  o.workers = 2;
  o.max_batch = 16;
  StartFleet(o);
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 600; ++i) jobs.push_back(TinyJob(i));
  auto results = RunAll(*client_, jobs, *fleet_);
  std::set<std::string> workers;
  int64_t max_batch = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
    auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_LT(testutil::MaxAbsDiff(r.outputs[0], expected[0]), 1e-5) << "job " << i;
    EXPECT_EQ(r.model, "tiny");
    EXPECT_GE(r.batch_size, 1);
    EXPECT_LE(r.batch_size, 16);
    EXPECT_EQ(r.attempt, 1);
    for (const char* k :
         {"submitted", "dispatched", "received", "compute_start", "compute_end", "finished"})
      EXPECT_GT(r.timing_us.count(k) ? r.timing_us.at(k) : 0, 0) << k;
    EXPECT_LE(r.timing_us.at("submitted"), r.timing_us.at("dispatched"));
    EXPECT_LE(r.timing_us.at("compute_start"), r.timing_us.at("compute_end"));
    workers.insert(r.worker);
    max_batch = std::max(max_batch, r.batch_size);
  }
  EXPECT_GT(max_batch, 1) << "no batch larger than 1 formed under load";
  EXPECT_EQ(workers.size(), 2u) << "both workers should take work";
}

// Calls of these Redis commands served so far, from INFO commandstats.
int64_t CommandCalls(Fleet& fleet, std::initializer_list<const char*> commands) {
  std::unique_ptr<protocol::RedisClient> redis;
  protocol::RedisEndpoint ep;
  ep.port = fleet.redis().port();
  if (!protocol::RedisClient::Connect(ep, 2000, &redis).ok()) return -1;
  protocol::RedisReply info;
  if (!redis->Command({"INFO", "commandstats"}, &info).ok()) return -1;
  int64_t calls = 0;
  for (const char* cmd : commands) {
    const std::string key = std::string("cmdstat_") + cmd + ":calls=";
    size_t at = info.str.find(key);
    if (at != std::string::npos) calls += std::stoll(info.str.substr(at + key.size()));
  }
  return calls;
}
int64_t RedisReads(Fleet& fleet) { return CommandCalls(fleet, {"get", "mget"}); }

// Small results travel back inside FINISHED (worker DONE -> broker -> producer): Wait returns
// them without reading Redis, and they are exactly what Redis holds. With the worker's
// --inline-result-bytes 0 the same jobs are read from Redis and give the same results.
// (push_results off: this is the broker's path; the next test covers the worker's notices.)
TEST_F(EndToEnd, SmallResultsComeInsideFinishedAndEqualTheRecordsInRedis) {
  for (const bool inline_on : {true, false}) {
    FleetOptions o;
    o.workers = 1;
    if (!inline_on) o.worker_args = {"--inline-result-bytes", "0"};
    fleet_ = std::make_unique<Fleet>(o);
    ASSERT_TRUE(fleet_->WaitForWorkers(1)) << fleet_->Logs();
    client_ = Connect(*fleet_, /*push_results=*/false);
    std::vector<Job> jobs;
    for (uint32_t i = 0; i < 200; ++i) jobs.push_back(TinyJob(1000 + i));
    const int64_t reads_before = RedisReads(*fleet_);
    std::vector<Result> results;
    std::vector<std::string> ids;
    for (const Job& j : jobs) {  // one at a time: each Wait starts before its FINISHED
      std::string id;
      ASSERT_TRUE(client_->Submit(j, &id).ok());
      Result r;
      ASSERT_TRUE(client_->Wait(id, 60000, &r).ok()) << fleet_->Logs();
      ids.push_back(id);
      results.push_back(std::move(r));
    }
    const int64_t reads = RedisReads(*fleet_) - reads_before;
    if (inline_on) {
      // Only the SDK's safety-net re-check (a job slower than 50 ms on a loaded machine) reads.
      EXPECT_LT(reads, 20) << "results were read from Redis, not taken from FINISHED";
    } else {
      EXPECT_GE(reads, 1) << "without inline results the SDK must read Redis";
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
      ASSERT_EQ(results[i].outputs.size(), 1u);
      EXPECT_LT(testutil::MaxAbsDiff(results[i].outputs[0], expected[0]), 1e-5) << i;
      Result stored;  // the record in Redis, read directly
      ASSERT_TRUE(client_->Poll(ids[i], &stored).ok());
      ASSERT_EQ(stored.state, JobState::kDone);
      EXPECT_EQ(stored.outputs.at(0).data, results[i].outputs[0].data) << i;
      EXPECT_EQ(stored.timing_us, results[i].timing_us) << i;
      EXPECT_EQ(stored.worker, results[i].worker);
    }
    client_.reset();
    fleet_.reset();
  }
}

// At light load the SDK names its Redis channel in SUBMIT ("notify"): the worker publishes each
// result notice there as it writes the result (one script: SET NX, then PUBLISH), the SDK's
// Wait returns from it, and the records equal Redis's. With --inline-result-bytes 0 the notices
// carry ids only and the SDK reads the records.
TEST_F(EndToEnd, LightLoadResultNoticesComeStraightFromTheWorker) {
  for (const bool inline_on : {true, false}) {
    FleetOptions o;
    o.workers = 1;
    if (!inline_on) o.worker_args = {"--inline-result-bytes", "0"};
    StartFleet(o);
    const int64_t published_before = CommandCalls(*fleet_, {"publish"});
    const int64_t reads_before = RedisReads(*fleet_);
    constexpr int kJobs = 100;
    std::vector<Job> jobs;
    std::vector<std::string> ids;
    std::vector<Result> results(kJobs);
    for (int i = 0; i < kJobs; ++i) {  // one at a time: light load
      jobs.push_back(TinyJob(2000 + i));
      ids.emplace_back();
      ASSERT_TRUE(client_->Submit(jobs[i], &ids[i]).ok());
      ASSERT_TRUE(client_->Wait(ids[i], 60000, &results[i]).ok()) << fleet_->Logs();
    }
    EXPECT_EQ(CommandCalls(*fleet_, {"publish"}) - published_before, kJobs) << "one notice per job";
    const int64_t reads = RedisReads(*fleet_) - reads_before;
    if (inline_on) {
      // Only the SDK's safety-net re-check (a job slower than 50 ms on a loaded machine) reads.
      EXPECT_LT(reads, 20) << "results were read from Redis, not taken from the notices";
    } else {
      EXPECT_GE(reads, kJobs) << "notices without records: each result is read";
    }
    for (int i = 0; i < kJobs; ++i) {
      const Result& r = results[i];
      ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
      EXPECT_LT(testutil::MaxAbsDiff(r.outputs.at(0), expected[0]), 1e-5) << i;
      Result stored;  // the record in Redis, read directly
      ASSERT_TRUE(client_->Poll(ids[i], &stored).ok());
      EXPECT_EQ(stored.outputs.at(0).data, r.outputs[0].data) << i;
      EXPECT_EQ(stored.timing_us, r.timing_us) << i;
    }
    client_.reset();
    fleet_.reset();
  }
}

// Jobs of 602 KB (an RGB 224x224 image as float32) through a worker that returns its input:
// every byte comes back, round after round, and the broker and the worker report that they keep
// freed memory for reuse (protocol/malloc_policy.h), which is what spares them a page fault per
// 4 KiB of every such message (docs/performance.md, step 13).
TEST_F(EndToEnd, BigJobsComeBackWholeAndServersKeepFreedMemory) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  StartFleet(o);
  for (uint32_t round = 0; round < 3; ++round) {
    std::vector<Job> jobs;
    for (uint32_t i = 0; i < 6; ++i) {
      Job j;
      j.model = "null";
      j.inputs = {testutil::RandomFloats({3, 224, 224}, 100 * round + i)};
      jobs.push_back(std::move(j));
    }
    const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
      ASSERT_EQ(results[i].outputs.size(), 1u);
      EXPECT_EQ(results[i].outputs[0].shape, jobs[i].inputs[0].shape);
      EXPECT_TRUE(results[i].outputs[0].data == jobs[i].inputs[0].data)
          << "round " << round << ", job " << i;
    }
  }
  // The log line is the only place the servers say so: mallopt settings are invisible from
  // outside the process, and neither /metrics nor STATS reports them.
  for (const std::string& log : {fleet_->broker().Log(), fleet_->worker(0).Log()})
    EXPECT_NE(log.find("malloc keeps freed memory"), std::string::npos) << log;
}

// The keys in Redis matching `pattern`.
std::vector<std::string> KeysMatching(Fleet& fleet, const std::string& pattern) {
  std::vector<std::string> out;
  auto redis = fleet.redis().Connect();
  protocol::RedisReply r;
  if (redis && redis->Command({"KEYS", pattern}, &r).ok())
    for (const auto& e : r.elements) out.push_back(e.str);
  return out;
}

// Inputs of at least the client's stored_input_bytes (64 KiB) go to Redis, not through the
// broker: the results are the same, and no input key is left once the jobs are done -- neither
// of the accepted jobs (the worker deletes them with the result) nor of a rejected one (the SDK
// deletes them). A client with stored_input_bytes 0 sends the same job through the broker.
TEST_F(EndToEnd, BigInputsGoThroughRedisAndLeaveNoKeyBehind) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  StartFleet(o);
  const int64_t dels_before = CommandCalls(*fleet_, {"del"});
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 8; ++i) {
    Job j;
    j.model = "null";
    j.inputs = {testutil::RandomFloats({100, 1000}, 500 + i)};  // 400 KB: stored
    jobs.push_back(std::move(j));
  }
  const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
    EXPECT_TRUE(results[i].outputs.at(0).data == jobs[i].inputs[0].data) << i;
  }
  Result r;
  Job rejected = jobs[0];
  rejected.model = "no-such-model";
  std::string id;
  EXPECT_EQ(client_->Run(rejected, 10000, &r, &id).code(), codes::kUnknownModel);
  EXPECT_TRUE(KeysMatching(*fleet_, "ferry:input:*").empty()) << "input keys left in Redis";
  // They were there: one DEL per job with its result, one for the rejected job's input.
  EXPECT_GE(CommandCalls(*fleet_, {"del"}) - dels_before, 9);

  ClientOptions through_broker;
  through_broker.frontend = fleet_->frontend();
  through_broker.redis = fleet_->redis().url();
  through_broker.stored_input_bytes = 0;
  std::unique_ptr<Client> direct;
  ASSERT_TRUE(Client::Create(through_broker, &direct).ok());
  Job again = jobs[1];
  ASSERT_TRUE(direct->Run(again, 60000, &r).ok());
  EXPECT_TRUE(r.outputs.at(0).data == jobs[1].inputs[0].data);
}

// The client's three forms of an input in one SubmitMany: in the body (< 16 KiB), attached in
// a data frame of its own (16 KiB to 64 KiB, through the broker uncopied) and stored in Redis
// (>= 64 KiB). Every output is its job's own input (null model); no input key is left.
TEST_F(EndToEnd, BodyAttachedAndStoredInputsInOneSubmit) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  StartFleet(o);
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 9; ++i) {
    const int64_t n = i % 3 == 0 ? 250 : i % 3 == 1 ? 10000 : 30000;  // 1 KB, 40 KB, 120 KB
    Job j;
    j.model = "null";
    j.inputs = {testutil::RandomFloats({n}, 900 + i)};
    jobs.push_back(std::move(j));
  }
  const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(results[i].state, JobState::kDone) << i << " " << results[i].error.ToString();
    EXPECT_TRUE(results[i].outputs.at(0).data == jobs[i].inputs[0].data) << i;
  }
  EXPECT_TRUE(KeysMatching(*fleet_, "ferry:input:*").empty()) << "input keys left in Redis";
  // attached_input_bytes 0: the 40 KB inputs go in the body again, with the same results.
  ClientOptions in_body;
  in_body.frontend = fleet_->frontend();
  in_body.redis = fleet_->redis().url();
  in_body.attached_input_bytes = 0;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(in_body, &c).ok());
  Result r;
  ASSERT_TRUE(c->Run(jobs[1], 60000, &r).ok());
  EXPECT_TRUE(r.outputs.at(0).data == jobs[1].inputs[0].data);
  in_body.attached_input_bytes = -1;
  EXPECT_EQ(Client::Create(in_body, &c).code(), codes::kInvalidArgument);
}

TEST_F(EndToEnd, UnknownModelAndInvalidJobsAreRejectedOthersAccepted) {
  StartFleet(FleetOptions{1});
  // Broker notices only: with a worker's notice, Wait may return up to ~2 ms before the broker
  // has the job's DONE, and a resubmit of the id in that window is still a duplicate.
  client_ = Connect(*fleet_, /*push_results=*/false);
  Job bad_model = TinyJob(1);
  bad_model.model = "no-such-model";
  Job bad_id = TinyJob(2);
  bad_id.id = "has space";
  Job good = TinyJob(3);
  std::vector<SubmitOutcome> out;
  ASSERT_TRUE(client_->SubmitMany({bad_model, good, bad_id}, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].status.code(), "unknown_model");
  EXPECT_TRUE(out[1].status.ok());
  EXPECT_EQ(out[2].status.code(), "invalid_argument");
  Result r;
  ASSERT_TRUE(client_->Wait(out[1].id, 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);
  // A second submit of a still-pending id is a duplicate; of a finished one it is accepted again.
  Job again = TinyJob(4);
  again.id = out[1].id;
  std::string id;
  EXPECT_TRUE(client_->Submit(again, &id).ok());
}

TEST_F(EndToEnd, WrongShapeJobFailsAloneBatchMatesSucceed) {
  FleetOptions o;
  o.workers = 1;
  StartFleet(o);
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 20; ++i) jobs.push_back(TinyJob(100 + i));
  jobs[7].inputs = {testutil::RandomFloats({5}, 7)};  // wrong length
  jobs[13].inputs = {testutil::RandomFloats({8}, 13), testutil::RandomFloats({8}, 14)};  // 2 args
  auto results = RunAll(*client_, jobs, *fleet_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i == 7 || i == 13) {
      EXPECT_EQ(results[i].state, JobState::kFailed) << i;
      EXPECT_EQ(results[i].error.code(), "model_error") << i;
      EXPECT_FALSE(results[i].error.message().empty());
      // The library's line, not the TorchScript traceback with its source paths...
      EXPECT_EQ(results[i].error.message().find('\n'), std::string::npos)
          << results[i].error.message();
      EXPECT_EQ(results[i].error.message().find("Traceback"), std::string::npos);
      EXPECT_EQ(results[i].error.message().find("code/"), std::string::npos);
      // ... which went to the worker's log, on one line with the job's id (job 7's error is
      // raised inside the TorchScript interpreter: a traceback).
      if (i == 7)
        EXPECT_TRUE(testutil::WaitFor(
            [&] {
              const std::string log = fleet_->worker(0).Log();
              const size_t at = log.find(results[i].id + " failed with model_error");
              return at != std::string::npos && log.find("Traceback", at) < log.find('\n', at);
            },
            std::chrono::seconds(10)))
            << fleet_->worker(0).Log();
      continue;
    }
    ASSERT_EQ(results[i].state, JobState::kDone) << i << " " << results[i].error.ToString();
    auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
    EXPECT_LT(testutil::MaxAbsDiff(results[i].outputs[0], expected[0]), 1e-5);
  }
  // The worker survived: a fresh job still runs.
  auto more = RunAll(*client_, {TinyJob(999)}, *fleet_);
  EXPECT_EQ(more[0].state, JobState::kDone);
}

// A model repository that declares tiny's input: jobs that do not match are rejected at SUBMIT
// (inline and stored inputs alike) and never reach the worker; a READY whose spec lies is
// refused with an ERROR and a log line, and the fleet keeps serving.
TEST_F(EndToEnd, InputSpecsRejectBadJobsAtSubmit) {
  testutil::TempDir dir;
  const std::string repo = dir.path() + "/models.toml";
  std::ofstream(repo) << "[models.tiny]\npath = \"" << testutil::ModelPath("tiny")
                      << "\"\ninputs = [{ name = \"x\", dtype = \"float32\", shape = [8] }]\n";
  FleetOptions o;
  o.workers = 1;
  o.models = {};
  o.worker_args = {"--models", repo};
  StartFleet(o);

  auto good = RunAll(*client_, {TinyJob(1)}, *fleet_);
  ASSERT_EQ(good[0].state, JobState::kDone) << good[0].error.ToString();

  Job short_job = TinyJob(2);
  short_job.inputs = {testutil::RandomFloats({5}, 2)};
  Job double_job = TinyJob(3);
  double_job.inputs = {Tensor::From(std::vector<double>(8, 1.0), {8}, DType::kFloat64)};
  Job two = TinyJob(4);
  two.inputs.push_back(testutil::RandomFloats({8}, 5));
  std::vector<SubmitOutcome> out;
  ASSERT_TRUE(client_->SubmitMany({short_job, double_job, two, TinyJob(6)}, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].status.code(), "invalid_argument");
  EXPECT_EQ(out[0].status.message(),
            "model \"tiny\" input 0 (\"x\"): expected float32 [8], got float32 [5]");
  EXPECT_EQ(out[1].status.message(),
            "model \"tiny\" input 0 (\"x\"): expected float32 [8], got float64 [8]");
  EXPECT_EQ(out[2].status.code(), "invalid_argument");
  EXPECT_NE(out[2].status.message().find("takes 1 input(s)"), std::string::npos)
      << out[2].status.message();
  ASSERT_TRUE(out[3].status.ok()) << out[3].status.ToString();
  Result r;
  ASSERT_TRUE(client_->Wait(out[3].id, 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);

  // Claim-check inputs: their dtype and shape travel in the SUBMIT and are checked the same way;
  // the SDK deletes the stored bytes of the rejected job.
  ClientOptions stored;
  stored.frontend = fleet_->frontend();
  stored.redis = fleet_->redis().url();
  stored.stored_input_bytes = 16;  // tiny's 32-byte input goes through Redis
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(stored, &c).ok());
  Job stored_bad = TinyJob(7);
  stored_bad.inputs = {testutil::RandomFloats({9}, 7)};
  std::string id;
  Status s = c->Run(stored_bad, 10000, &r, &id);
  EXPECT_EQ(s.code(), "invalid_argument");
  EXPECT_NE(s.message().find("got float32 [9]"), std::string::npos) << s.message();
  ASSERT_TRUE(c->Run(TinyJob(8), 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);
  EXPECT_TRUE(KeysMatching(*fleet_, "ferry:input:*").empty());

  // The broker's STATS lists the model's spec and its worker.
  std::string json;
  ASSERT_TRUE(client_->Stats(&json).ok());
  EXPECT_NE(json.find(R"("inputs":[{"name":"x","dtype":"float32","shape":[8]}])"),
            std::string::npos)
      << json;

  // A READY whose spec no decoder should take: an ERROR back, one log line, nothing registered.
  zmq::context_t ctx;
  zmq::socket_t liar(ctx, zmq::socket_type::dealer);
  liar.set(zmq::sockopt::linger, 0);
  liar.set(zmq::sockopt::rcvtimeo, 10000);
  liar.connect(fleet_->backend());
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(4);
  protocol::PackString(pk, "worker");
  protocol::PackString(pk, "liar");
  protocol::PackString(pk, "device");
  protocol::PackString(pk, "cpu");
  protocol::PackString(pk, "capacity");
  pk.pack_int64(4);
  protocol::PackString(pk, "models");
  pk.pack_array(1);
  pk.pack_map(3);
  protocol::PackString(pk, "name");
  protocol::PackString(pk, "tiny");
  protocol::PackString(pk, "max_batch");
  pk.pack_int64(4);
  protocol::PackString(pk, "inputs");
  pk.pack_array(1);
  pk.pack_map(2);
  protocol::PackString(pk, "dtype");
  protocol::PackString(pk, "float128");
  protocol::PackString(pk, "shape");
  pk.pack_array(1);
  pk.pack_int64(8);
  ASSERT_TRUE(
      protocol::SendMessage(liar, nullptr, protocol::kReady, protocol::ToMessage(std::move(buf)))
          .ok());
  protocol::Message reply;
  ASSERT_TRUE(protocol::RecvMessage(liar, /*router=*/false, &reply, /*dont_wait=*/false).ok());
  EXPECT_EQ(reply.command, protocol::kError);
  EXPECT_TRUE(testutil::WaitFor(
      [&] { return fleet_->broker().Log().find("refused a READY") != std::string::npos; },
      std::chrono::seconds(10)));
  EXPECT_NE(fleet_->broker().Log().find("unknown dtype"), std::string::npos);
  EXPECT_EQ(testutil::CountWorkers(fleet_->frontend()), 1);
  auto after = RunAll(*client_, {TinyJob(9)}, *fleet_);
  EXPECT_EQ(after[0].state, JobState::kDone);
}

TEST_F(EndToEnd, MultiInputMultiOutputModel) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"multi"};
  StartFleet(o);
  std::vector<Job> jobs;
  for (int i = 0; i < 40; ++i) {
    Job j;
    j.model = "multi";
    std::vector<int64_t> ints = {i, 2 * i, -3};
    j.inputs = {testutil::RandomFloats({4}, i), Tensor::From(ints, {3}, DType::kInt64)};
    jobs.push_back(j);
  }
  auto results = RunAll(*client_, jobs, *fleet_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
    ASSERT_EQ(results[i].outputs.size(), 2u);
    auto a = jobs[i].inputs[0].As<float>();
    auto y = results[i].outputs[0].As<float>();
    ASSERT_EQ(y.size(), 4u);
    for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(y[k], a[k] * 2.0f + 1.0f);
    EXPECT_EQ(results[i].outputs[1].dtype, DType::kInt64);
    EXPECT_TRUE(results[i].outputs[1].shape.empty());
    EXPECT_EQ(results[i].outputs[1].As<int64_t>(), (std::vector<int64_t>{3 * int64_t(i) - 3}));
    auto expected = testutil::RunReference(testutil::ModelPath("multi"), jobs[i].inputs);
    EXPECT_EQ(testutil::MaxAbsDiff(results[i].outputs[0], expected[0]), 0.0);
  }
}

// Client::Run on the real fleet, with and without notices from the worker: the model's results;
// a rejection as Run's status.
TEST_F(EndToEnd, RunReturnsTheModelsResultsAndRejections) {
  StartFleet(FleetOptions{1});
  for (const bool push : {true, false}) {
    auto c = Connect(*fleet_, push);
    for (int i = 0; i < 30; ++i) {
      const Job job = TinyJob(3000 + i);
      Result r;
      std::string id;
      Status s = c->Run(job, 60000, &r, &id);
      ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << fleet_->Logs();
      ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
      EXPECT_EQ(r.id, id);
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), job.inputs);
      EXPECT_LT(testutil::MaxAbsDiff(r.outputs.at(0), expected[0]), 1e-5) << i;
    }
  }
  Job bad = TinyJob(1);
  bad.model = "no-such-model";
  Result r;
  EXPECT_EQ(client_->Run(bad, 60000, &r).code(), "unknown_model");
}

// Run with the id of a job that is still pending waits for THAT job (the broker rejects the
// resubmission as a duplicate, and nothing runs twice): the way to keep waiting after a timeout.
TEST_F(EndToEnd, RunOfAPendingIdWaitsForTheJobAlreadyThere) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"slow"};
  StartFleet(o);
  auto slow = [](const std::string& id, float spins) {
    Job j;
    j.id = id;
    j.model = "slow";
    j.inputs = {Tensor::From<float>({spins}, {1}, DType::kFloat32)};  // ~1 ms per spin
    return j;
  };
  // Result writes: a plain SET, or the SET inside the notice script (Redis counts both).
  const int64_t writes_before = CommandCalls(*fleet_, {"set"});
  ASSERT_TRUE(client_->Submit(slow("run-pending", 1000), nullptr).ok());
  Result r;
  Status s = client_->Run(slow("run-pending", 1), 60000, &r);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << fleet_->Logs();
  ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  EXPECT_EQ(r.outputs.at(0).As<float>(), std::vector<float>{1000.f})
      << "Run returned its own input's result";
  // One worker runs jobs in order: once a later job is done, a second run of "run-pending"
  // (had the resubmission been accepted) would have written its result too.
  Result after;
  ASSERT_TRUE(client_->Run(slow("run-after", 1), 60000, &after).ok()) << fleet_->Logs();
  EXPECT_EQ(CommandCalls(*fleet_, {"set"}) - writes_before, 2)
      << "result writes: run-pending once, run-after once";
}

TEST_F(EndToEnd, StatsListWorkersAndQueues) {
  StartFleet(FleetOptions{2});
  std::string json;
  ASSERT_TRUE(client_->Stats(&json).ok());
  EXPECT_NE(json.find("\"workers\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"queues\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"tiny\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"credit\""), std::string::npos) << json;
}

// Each of the worker's threads says what it does, for `top -H`, perf and gdb
// (docs/operations.md, "Threads").
TEST_F(EndToEnd, WorkerThreadsAreNamedAfterTheirRole) {
  FleetOptions o{1};
  o.worker_args = {"--instances", "2"};
  StartFleet(o);
  RunAll(*client_, {TinyJob(1), TinyJob(2)}, *fleet_);
  std::set<std::string> names;
  const std::string tasks = "/proc/" + std::to_string(fleet_->worker(0).pid()) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream comm(t.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  for (const char* want : {"ferry-link", "ferry-fetch", "ferry-results", "ferry-exec-0",
                           "ferry-exec-1", "ferry-signals"})
    EXPECT_EQ(names.count(want), 1u) << want << " missing among " << ::testing::PrintToString(names);
}

// The Whisper-shaped pipeline (whisper.pt) served as docs/models.md's "Serving speech end to
// end" says: clips of any length (int16 PCM) share batches through the repository's padding,
// padded with silence to the smallest bucket that holds them. Each clip's tokens are those of
// the module run on that clip alone, padded to its bucket; the clips of 64 KiB and more travel
// through Redis (the SDK's claim check), the shorter inside the submit.
TEST_F(EndToEnd, SpeechClipsOfAnyLengthShareBatchesThroughPadding) {
  testutil::TempDir dir;
  const std::string repo = dir.path() + "/models.toml";
  const std::vector<int64_t> buckets = {16000, 32000, 48000};  // 1, 2 and 3 s
  {
    std::ofstream f(repo);
    f << "[models.whisper]\npath = \"" << testutil::ModelPath("whisper") << "\"\n"
      << "max_batch = 8\n\n[models.whisper.padding]\ninputs = [0]\ndim = 0\nvalue = 0.0\n"
      << "buckets = [16000, 32000, 48000]\n";
  }
  FleetOptions o;
  o.workers = 1;
  o.models = {};
  o.worker_args = {"--models", repo};
  StartFleet(o);

  std::mt19937 rng(11);
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i) {
    const int64_t samples = 4000 + static_cast<int64_t>(rng() % 44000);  // 0.25 s to 3 s
    std::vector<int16_t> pcm(static_cast<size_t>(samples));
    const double f0 = 100.0 + 150.0 * i;  // a different voice per clip
    for (int64_t n = 0; n < samples; ++n)
      pcm[n] = static_cast<int16_t>(8000 * std::sin(2 * M_PI * f0 * n / 16000.0) +
                                    static_cast<int>(rng() % 600) - 300);
    Job j;
    j.model = "whisper";
    j.inputs = {Tensor::From(pcm, {samples}, DType::kInt16)};
    jobs.push_back(std::move(j));
  }
  const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
  int64_t biggest_batch = 0;
  std::set<std::string> transcripts;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Result& r = results[i];
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString() << "\n" << fleet_->Logs();
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_EQ(r.outputs[0].dtype, DType::kInt64);
    EXPECT_EQ(r.outputs[0].shape, (std::vector<int64_t>{24}));
    // The reference: this clip alone, padded with zeros to its bucket.
    const int64_t samples = jobs[i].inputs[0].shape[0];
    const int64_t bucket = *std::lower_bound(buckets.begin(), buckets.end(), samples);
    Tensor padded = jobs[i].inputs[0];
    padded.shape = {bucket};
    padded.data.resize(static_cast<size_t>(bucket) * 2, '\0');
    const auto expected = testutil::RunReference(testutil::ModelPath("whisper"), {padded});
    EXPECT_TRUE(r.outputs[0].data == expected.at(0).data)
        << "clip " << i << ", " << samples << " samples";
    biggest_batch = std::max(biggest_batch, r.batch_size);
    transcripts.insert(r.outputs[0].data);
  }
  EXPECT_GT(biggest_batch, 1) << "clips of different lengths never shared a batch";
  EXPECT_GT(transcripts.size(), 1u) << "every clip decoded to the same tokens";
  EXPECT_TRUE(KeysMatching(*fleet_, "ferry:input:*").empty()) << "input keys left in Redis";
}

TEST_F(EndToEnd, ManyProducerThreadsShareOneClient) {
  StartFleet(FleetOptions{2});
  std::atomic<int> done{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        Job j = TinyJob(1000 * t + i);
        std::string id;
        Result r;
        if (!client_->Submit(j, &id).ok() || !client_->Wait(id, 30000, &r).ok() ||
            r.state != JobState::kDone) {
          ++bad;
          continue;
        }
        auto expected = testutil::RunReference(testutil::ModelPath("tiny"), j.inputs);
        if (testutil::MaxAbsDiff(r.outputs[0], expected[0]) < 1e-5)
          ++done;
        else
          ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), 200);
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace ferry
