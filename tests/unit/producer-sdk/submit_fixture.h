#pragma once
// What the SDK's submit, notice, Run and result-tracker tests share (submit_test.cc,
// notice_test.cc, run_test.cc, result_tracker_test.cc): the fixture -- a client for a scripted
// broker (scripted_frontend.h) on a free port, key prefix "test:", and a Redis URL where nothing
// listens unless the test starts a RedisProcess -- plus jobs, result records, and the
// many-threads echo run.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "process.h"  // testutil: FreePort, RedisServer

namespace ferry::client_test {

using testutil::FreePort;

inline client::Job MakeJob(std::string model, std::string id = "") {
  client::Job j;
  j.id = std::move(id);
  j.model = std::move(model);
  j.inputs.push_back(Tensor::From<float>({1.f, 2.f}, {2}, DType::kFloat32));
  return j;
}

class ClientSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    options_.frontend = "tcp://127.0.0.1:" + std::to_string(port_);
    options_.redis = "redis://127.0.0.1:" + std::to_string(FreePort());
    options_.redis_prefix = "test:";
    options_.request_timeout_ms = 2000;
  }
  std::unique_ptr<client::Client> MakeClient() {
    std::unique_ptr<client::Client> c;
    Status s = client::Client::Create(options_, &c);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return c;
  }
  int port_ = 0;
  client::ClientOptions options_;
};

// A "done" result record for `id` (msgpack bytes, as a worker writes them), with `output` as its
// one output when given.
inline std::string DoneRecord(const std::string& id, int64_t batch_size,
                              const Tensor* output = nullptr) {
  protocol::ResultRecord r;
  r.id = id;
  r.status = "done";
  r.batch_size = batch_size;
  if (output != nullptr) {
    r.outputs.push_back(protocol::TensorRef{output->dtype, output->shape, output->data.data(),
                                            output->data.size()});
  }
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, r);
  return std::string(buf.data(), buf.size());
}

// A FINISHED body for one job holding `record` inline, as a worker publishes it.
inline std::string Notice(const std::string& id, const std::string& record) {
  protocol::InlineResults records{{id, record}};
  zmq::message_t m = protocol::EncodeFinished({id}, records);
  return std::string(static_cast<const char*>(m.data()), m.size());
}

// How many times Redis has run `command` (INFO commandstats).
inline int64_t CommandCalls(testutil::RedisServer& redis, const std::string& command) {
  protocol::RedisReply reply;
  auto c = redis.Connect();
  if (!c->Command({"INFO", "commandstats"}, &reply).ok()) return -1;
  const std::string key = "cmdstat_" + command + ":calls=";
  size_t at = reply.str.find(key);
  return at == std::string::npos ? 0 : std::stoll(reply.str.substr(at + key.size()));
}

// The stored-input keys in `redis` ("test:input:*"), sorted.
inline std::vector<std::string> InputKeys(testutil::RedisServer& redis) {
  protocol::RedisReply keys;
  EXPECT_TRUE(redis.Connect()->Command({"KEYS", "test:input:*"}, &keys).ok());
  std::vector<std::string> out;
  for (const auto& k : keys.elements) out.push_back(k.str);
  std::sort(out.begin(), out.end());  // (KEYS has no order)
  return out;
}

// Stores DoneRecord(id, batch_size) as id's result, as a worker does.
inline void WriteDone(testutil::RedisServer& redis, const std::string& id, int64_t batch_size) {
  protocol::RedisReply reply;
  auto c = redis.Connect();
  ASSERT_TRUE(
      c->Command({"SET", protocol::Keys("test:").Result(id), DoneRecord(id, batch_size)}, &reply)
          .ok());
}

// kThreads threads each send kJobsEach echo jobs through `call` (Submit + Wait, or Run) to a
// scripted broker with set_echo(true), and check that each got its own job's result back;
// returns how many did, and ADD_FAILUREs the first few that did not.
inline int EchoFromManyThreads(
    const std::function<Status(const client::Job& job, std::string* id, Result* r)>& call) {
  constexpr int kThreads = 8, kJobsEach = 40;
  std::atomic<int> good{0};
  std::vector<std::string> failures;
  std::mutex failures_mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kJobsEach; ++k) {
        const float tag = static_cast<float>(t * 1000 + k);
        client::Job job = MakeJob("m");
        job.inputs[0] = Tensor::From<float>({tag, -tag}, {2}, DType::kFloat32);
        std::string id;
        Result r;
        Status s = call(job, &id, &r);
        const bool echoed = s.ok() && r.state == JobState::kDone && r.id == id &&
                            r.outputs.size() == 1 &&
                            r.outputs[0].As<float>() == std::vector<float>{tag, -tag};
        if (echoed) {
          ++good;
        } else {
          std::lock_guard<std::mutex> lock(failures_mu);
          failures.push_back("thread " + std::to_string(t) + " job " + std::to_string(k) + ": " +
                             s.ToString());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < failures.size() && i < 5; ++i) ADD_FAILURE() << failures[i];
  return good.load();
}
inline constexpr int kEchoJobs = 8 * 40;

}  // namespace ferry::client_test
