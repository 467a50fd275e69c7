// What models take and refuse end to end, on real redis-server, ferry-broker and ferry-worker
// processes: jobs for unknown models or with invalid ids rejected at SUBMIT, a wrong-shaped job
// failing alone in its batch, a repository's input specs checked at SUBMIT (and a READY whose
// spec lies refused), a model of several inputs and outputs, and speech clips of any length
// sharing batches through the repository's padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "end_to_end_fixture.h"
#include "ferry/client.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"
#include "reference.h"

namespace ferry::end_to_end_test {
namespace {

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
  EXPECT_TRUE(NoInputKeysLeft(*fleet_)) << "input keys left in Redis";

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
  EXPECT_TRUE(NoInputKeysLeft(*fleet_)) << "input keys left in Redis";
}
}  // namespace
}  // namespace ferry::end_to_end_test
