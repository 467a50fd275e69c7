// The broker's limits on the wire, spoken by hand over a raw DEALER against real redis-server,
// ferry-broker and ferry-worker processes: --max-message-bytes on a SUBMIT's body and data frames
// (and the SDK that knows it, or learns it: LIMITS, on every connection, broker kills included),
// data frames from workers, and the bytes of inline results queued for a producer that stops
// reading (--max-inline-backlog-bytes).
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"
#include "raw_wire.h"
#include "reference.h"

namespace ferry {
namespace {

using testutil::AttachedSubmitBody;
using testutil::Fleet;
using testutil::FleetOptions;
using testutil::RawDealer;
using testutil::RawExchange;
using testutil::RawSend;

// --max-message-bytes bounds a SUBMIT's body and data frames together (ERROR too_large, the
// connection stays), and a worker message with data frames is refused: a READY carrying one
// registers no worker, while the same READY without it does.
TEST(WireLimits, AttachedFramesCountAgainstTheMessageLimitAndWorkersSendNone) {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = {"--max-message-bytes", "2048", "--max-job-bytes", "1024"};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet.frontend(), 20000);
  const Tensor t = Tensor::From<float>(std::vector<float>(250, 1.0f), {250}, DType::kFloat32);
  auto body = [&](const std::vector<std::string>& ids) {
    return AttachedSubmitBody(ids, "null", t);
  };
  std::string code;
  // Two 1,000-byte frames: each fits ZeroMQ's per-frame limit, together they do not.
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", body({"lim-1", "lim-2"}), t.data, t.data}, &code),
            "ERROR");
  EXPECT_EQ(code, codes::kTooLarge);
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", body({"lim-1"}), t.data}), "ACCEPTED");
  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  Result r;
  ASSERT_TRUE(c->Wait("lim-1", 60000, &r).ok()) << fleet.Logs();
  ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  EXPECT_EQ(r.outputs.at(0).data, t.data);  // null: the input, from its data frame

  const std::string ready_body = testutil::ReadyBody("framed-worker", "null");
  zmq::socket_t w = RawDealer(ctx, fleet.backend(), 20000);
  // The framed READY, then a HEARTBEAT: the broker, not knowing the connection, answers
  // REANNOUNCE -- so it has read the READY before, and refused it.
  RawSend(w, {"FERRY1", "READY", ready_body, "a frame"});
  RawSend(w, {"FERRY1", "HEARTBEAT", ""});
  protocol::Message m;
  ASSERT_TRUE(protocol::RecvMessage(w, false, &m, /*dont_wait=*/false).ok());
  EXPECT_EQ(m.command, "REANNOUNCE");
  std::string json;
  ASSERT_TRUE(c->Stats(&json).ok());
  EXPECT_EQ(json.find("framed-worker"), std::string::npos) << json;
  // The same READY without the frame registers it.
  RawSend(w, {"FERRY1", "READY", ready_body});
  EXPECT_TRUE(testutil::WaitFor([&] {
    return c->Stats(&json).ok() && json.find("framed-worker") != std::string::npos;
  })) << json;
}

// A job for the "null" model (it returns its input): `floats` float32 values in one tensor.
client::Job NullJob(const std::string& id, size_t floats) {
  client::Job j;
  j.id = id;
  j.model = "null";
  std::vector<float> v(floats);
  for (size_t i = 0; i < floats; ++i) v[i] = static_cast<float>(i % 1000);
  j.inputs.push_back(Tensor::From<float>(v, {static_cast<int64_t>(floats)}, DType::kFloat32));
  return j;
}

// SubmitMany of `jobs` (null-model jobs): every one accepted, done, its input echoed.
void SubmitManyAndExpectEchoes(client::Client* c, const std::vector<client::Job>& jobs,
                               const Fleet& fleet) {
  std::vector<client::SubmitOutcome> out;
  ASSERT_TRUE(c->SubmitMany(jobs, &out).ok());
  Result r;
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status.ToString();
    ASSERT_TRUE(c->Wait(out[i].id, 60000, &r).ok()) << fleet.Logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
    EXPECT_EQ(r.outputs.at(0).data, jobs[i].inputs[0].data);
  }
}

// A frame over the broker's --max-message-bytes makes libzmq drop the connection unanswered.
// The SDK knows the limit (ClientOptions::max_message_bytes), so a job whose attached inputs
// would need more is too_large before anything is sent -- a Run with no timeout would wait for
// ever otherwise -- and several jobs under it go as SUBMITs the broker takes.
TEST(WireLimits, TheSdkRejectsAJobOverTheBrokersMessageLimitAndSplitsUnderIt) {
  constexpr int64_t kLimit = 1 << 20;
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = {"--max-message-bytes", std::to_string(kLimit)};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.stored_input_bytes = 0;  // every input through the broker, in frames of their own
  o.max_message_bytes = kLimit;
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  const client::Job big = NullJob("over-limit", 2 * kLimit / 4);  // 2 MiB in one frame
  std::string id;
  Status s = c->Submit(big, &id);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("max_message_bytes"), std::string::npos) << s.ToString();
  Result r;
  s = c->Run(big, 60000, &r);  // without the check: no answer, a timeout after 60 s
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  // Inside the body (no attached frames): the tensor's bytes plus 320 are the limit, and its
  // 128-character id, 16 dimensions and options take the body over it (a bound of 320 bytes
  // for all but the tensor's bytes let it through, and Run waited for ever).
  client::ClientOptions inline_only = o;
  inline_only.attached_input_bytes = 0;
  std::unique_ptr<client::Client> c2;
  ASSERT_TRUE(client::Client::Create(inline_only, &c2).ok());
  client::Job wide = NullJob(std::string(128, 'a'), (kLimit - 320) / 4);
  wide.inputs[0].shape.assign(15, 1);
  wide.inputs[0].shape.push_back((kLimit - 320) / 4);
  wide.priority = std::numeric_limits<int64_t>::max();
  wide.timeout_ms = 3600000;
  wide.result_ttl_s = 86400;
  s = c2->Run(wide, 60000, &r);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();

  // Eight jobs of 320 KB: one message would be 2.5 MiB (ERROR too_large for all eight).
  std::vector<client::Job> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(NullJob("under-" + std::to_string(i), 80000));
  ASSERT_NO_FATAL_FAILURE(SubmitManyAndExpectEchoes(c.get(), jobs, fleet));
  client::ClientOptions bad = o;
  bad.max_message_bytes = 1000;
  std::unique_ptr<client::Client> unused;
  EXPECT_EQ(client::Client::Create(bad, &unused).code(), codes::kInvalidArgument);
}

// The broker answers LIMITS with its flags, and the SDK asks it first thing on each connection:
// a client left at the default max_message_bytes (64 MiB + 1 MiB) against a broker that takes
// 1 MiB refuses a bigger job (too_large, naming the broker's limit) instead of sending a frame
// the broker's libzmq would drop unanswered -- a Run would wait for ever -- refuses a job over
// the broker's --max-job-bytes before storing its inputs, and splits jobs under the broker's
// limit.
TEST(WireLimits, TheSdkLearnsTheBrokersLimitsAndKeepsToThem) {
  constexpr int64_t kLimit = 1 << 20;
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = {"--max-message-bytes",    std::to_string(kLimit),
                    "--max-job-bytes",        "4000000",
                    "--max-jobs-per-message", "500"};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();

  zmq::context_t ctx(1);
  zmq::socket_t raw = RawDealer(ctx, fleet.frontend(), 20000);
  RawSend(raw, {"FERRY1", "LIMITS", std::string("\x81\xa3rid\x2a", 6)});  // {"rid": 42}
  protocol::Message m;
  ASSERT_TRUE(protocol::RecvMessage(raw, false, &m, /*dont_wait=*/false).ok());
  ASSERT_EQ(m.command, "LIMITS");
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  protocol::BrokerLimits limits;
  ASSERT_TRUE(protocol::DecodeLimits(oh.get(), &limits).ok());
  EXPECT_EQ(limits.max_message_bytes, kLimit);
  EXPECT_EQ(limits.max_job_bytes, 4000000);
  EXPECT_EQ(limits.max_jobs_per_message, 500);
  int64_t rid = 0;
  EXPECT_TRUE(protocol::GetInt(oh.get(), "rid", &rid, 0).ok());
  EXPECT_EQ(rid, 42);

  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.stored_input_bytes = 0;  // every input through the broker, in frames of their own
  ASSERT_GT(o.max_message_bytes, 2 * kLimit);  // the default: above the broker's
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  const client::Job big = NullJob("over-the-brokers-limit", 2 * kLimit / 4);  // 2 MiB in one frame
  Result r;
  Status s = c->Run(big, 60000, &r);  // without LIMITS: no answer, a timeout after 60 s
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("limit of " + std::to_string(kLimit)), std::string::npos)
      << s.ToString();
  std::string id;
  s = c->Submit(big, &id);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();

  // A 4.8 MB input stored in Redis, over the broker's --max-job-bytes: refused by the SDK before
  // it is written (the broker's refusal, after the write, says "the limit is" instead).
  client::ClientOptions storing = o;
  storing.stored_input_bytes = 1 << 16;
  std::unique_ptr<client::Client> c3;
  ASSERT_TRUE(client::Client::Create(storing, &c3).ok());
  std::string json;
  ASSERT_TRUE(c3->Stats(&json).ok());  // answered after LIMITS: the limits are known
  s = c3->Submit(NullJob("over-the-job-limit", 1200000), &id);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("at most 4000000 a job (its --max-job-bytes): not sent"),
            std::string::npos)
      << s.ToString();
  s = c3->Run(NullJob("over-the-job-limit", 1200000), 60000, &r);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("--max-job-bytes"), std::string::npos) << s.ToString();

  // A job refused whole (over the broker's message limit, before it is sent): its stored input
  // is deleted under an id the SDK made, and kept under the caller's, which may be a pending
  // job's (a retry) whose input that key is.
  client::ClientOptions mixed = o;
  mixed.stored_input_bytes = 1 << 21;  // 2.4 MB stored; 1.2 MB in a frame: over 1 MiB
  std::unique_ptr<client::Client> c4;
  ASSERT_TRUE(client::Client::Create(mixed, &c4).ok());
  ASSERT_TRUE(c4->Stats(&json).ok());
  auto refused_whole = [](const std::string& job_id) {
    client::Job j = NullJob(job_id, 600000);
    j.inputs.push_back(Tensor::From<float>(std::vector<float>(300000), {300000}, DType::kFloat32));
    return j;
  };
  s = c4->Submit(refused_whole(""), &id);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  s = c4->Submit(refused_whole("a-callers-retry"), &id);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  auto redis = fleet.redis().Connect();
  ASSERT_NE(redis, nullptr);
  protocol::RedisReply keys;
  ASSERT_TRUE(redis->Command({"KEYS", "ferry:input:*"}, &keys).ok());
  ASSERT_EQ(keys.elements.size(), 1u);
  EXPECT_EQ(keys.elements[0].str, "ferry:input:a-callers-retry:0");

  // Eight jobs of 320 KB: one SUBMIT would be 2.5 MiB, refused whole; 600 small ones are more
  // than the broker's 500 a message.
  std::vector<client::Job> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(NullJob("split-" + std::to_string(i), 80000));
  for (int i = 0; i < 600; ++i) jobs.push_back(NullJob("many-" + std::to_string(i), 4));
  ASSERT_NO_FATAL_FAILURE(SubmitManyAndExpectEchoes(c.get(), jobs, fleet));
}

// CancelMany keeps to the broker's limits too: 2,000 ids of 104 characters (~210 KB) against a
// broker that takes 100 ids and 64 KiB a message. Before, the SDK split at 10,000 ids: the broker
// refused the CANCEL whole (too_large), or, over its message limit, dropped the connection without
// an answer (unavailable after the request timeout).
TEST(WireLimits, CancelManyIsSplitUnderTheBrokersLimits) {
  FleetOptions fo;
  fo.workers = 0;
  fo.broker_args = {"--max-message-bytes", "65536", "--max-jobs-per-message", "100"};
  Fleet fleet(fo);
  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.request_timeout_ms = 20000;
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 2000; ++i) {
    std::string id = "cancel-" + std::to_string(i) + "-";
    ids.push_back(id + std::string(104 - id.size(), 'x'));
  }
  client::CancelReport report;
  Status s = c->CancelMany(ids, &report);  // the first CANCEL is split before LIMITS is known
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(report.not_found, ids);  // none pending
  EXPECT_TRUE(report.cancelled.empty());
  EXPECT_TRUE(report.running.empty());
  s = c->CancelMany(ids, &report);  // and with the limits known
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(report.not_found.size(), ids.size());
}

// LIMITS on each new connection, and still answered after many broker kills: libzmq can take a
// LIMITS sent just as the connection drops into the dead connection's pipe, and without a resend
// the SDK held every request behind it for ever (seen after ~10 kills here). A second thread
// keeps requests in flight through each kill, as a busy producer does.
TEST(WireLimits, AProducerIsStillAnsweredAfterManyBrokerKills) {
  FleetOptions fo;
  fo.workers = 0;
  Fleet fleet(fo);
  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.request_timeout_ms = 1000;
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  std::atomic<bool> busy{true};
  std::thread other([&] {
    while (busy) {
      std::string json;
      (void)c->Stats(&json);
    }
  });
  for (int kill = 1; kill <= 60; ++kill) {
    fleet.broker().Signal(SIGKILL);
    fleet.broker().Wait();
    fleet.StartBroker();
    std::string json;
    bool answered = false;
    for (int attempt = 0; attempt < 30 && !answered; ++attempt) answered = c->Stats(&json).ok();
    EXPECT_TRUE(answered) << "no answer for 30 s after broker kill " << kill;
    if (!answered) break;
  }
  busy = false;
  other.join();
}

// ZeroMQ bounds the replies queued for a producer by count (10,000), not bytes, and a FINISHED
// may carry megabytes of inline results: a producer that stops reading would pin them in the
// broker. Past --max-inline-backlog-bytes queued for a connection, FINISHED carries ids only;
// every job is still announced, once, and what does come inline is the record in Redis.
TEST(WireLimits, AProducerThatStopsReadingGetsIdsOnlyPastItsInlineBacklog) {
  constexpr int kJobs = 64;  // 61 MB of results: far more than the socket buffers between
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"expand"};  // [16] float32 -> [240000] float32: a 960 KB record a job
  fo.broker_args = {"--max-inline-backlog-bytes", "2000000"};
  fo.worker_args = {"--inline-result-bytes", "1048576"};  // each record may ride in DONE
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvhwm, 1);  // hold as little as possible on this side
  s.set(zmq::sockopt::rcvbuf, 65536);
  s.set(zmq::sockopt::rcvtimeo, 30000);
  s.connect(fleet.frontend());

  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) ids.push_back("backlog-" + std::to_string(i));
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(2);
  protocol::PackString(pk, "inline_results");
  pk.pack_true();
  protocol::PackString(pk, "jobs");
  pk.pack_array(kJobs);
  for (const auto& id : ids)
    protocol::PackSubmitJob(pk, id, "expand", {testutil::RandomFloats({16}, 3)}, 0, 0, 0);
  RawSend(s, {"FERRY1", "SUBMIT", std::string(buf.data(), buf.size())});

  // Every result lands in Redis while this socket is not read.
  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  for (const auto& id : ids) {
    Result r;
    ASSERT_TRUE(c->Wait(id, 60000, &r).ok()) << id << "\n" << fleet.Logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  }

  // Now read: the ACCEPTED, and FINISHED notices until every id has come.
  std::unique_ptr<protocol::RedisClient> redis = fleet.redis().Connect();
  ASSERT_TRUE(redis);
  const protocol::Keys keys;
  std::map<std::string, int> announced;
  int inline_records = 0;
  while (announced.size() < ids.size()) {
    protocol::Message m;
    ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok())
        << announced.size() << " ids announced\n"
        << fleet.Logs();
    if (m.command != protocol::kFinished) {
      ASSERT_EQ(m.command, protocol::kAccepted);
      continue;
    }
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    std::vector<std::string> got;
    ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", &got).ok());
    for (const auto& id : got) ++announced[id];
    protocol::InlineResults results;
    ASSERT_TRUE(protocol::DecodeInlineResults(oh.get(), &results).ok());
    for (const auto& [id, record] : results) {
      ++inline_records;
      protocol::RedisReply stored;
      ASSERT_TRUE(redis->Command({"GET", keys.Result(std::string(id))}, &stored).ok());
      EXPECT_TRUE(stored.str == record) << id << ": the inline record is not the stored one";
    }
  }
  for (const auto& id : ids) EXPECT_EQ(announced[id], 1) << id;
  EXPECT_EQ(announced.size(), ids.size());
  // Some came inline (the backlog had room at first), and not all: the rest were withheld.
  EXPECT_GT(inline_records, 0);
  EXPECT_LT(inline_records, kJobs);
}

}  // namespace
}  // namespace ferry
