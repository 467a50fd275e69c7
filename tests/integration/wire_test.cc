// The frontend's wire protocol spoken by hand over a raw DEALER, against real redis-server,
// ferry-broker and ferry-worker processes (one worker serving `tiny`): what a client in another
// language sees (docs/protocol.md) -- garbage frames, attached inputs, SUBMIT's "notify" and
// "ack" fields, a failed journal write. The broker's limits on the wire: wire_limits_test.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"
#include "raw_wire.h"
#include "reference.h"
#include "tiny_reference.h"

namespace ferry {
namespace {

using testutil::AttachedSubmitBody;
using testutil::Fleet;
using testutil::FleetOptions;
using testutil::RawDealer;
using testutil::RawExchange;
using testutil::RawSend;
using testutil::UnreadBytes;
using testutil::WaitUntilStopped;
using testutil::WaitUntilUnread;
using testutil::WireBytes;

// A fleet of one worker, and an SDK client to read results with.
class Wire : public ::testing::Test {
 protected:
  void SetUp() override {
    fleet_ = std::make_unique<Fleet>(FleetOptions{1});
    ASSERT_TRUE(fleet_->WaitForWorkers(1)) << fleet_->Logs();
    client::ClientOptions o;
    o.frontend = fleet_->frontend();
    o.redis = fleet_->redis().url();
    Status s = client::Client::Create(o, &client_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<client::Client> client_;
};

// The optional fields of RawSubmitBody, each packed only when set.
struct RawSubmitFields {
  std::string notify;  // "notify"
  std::string ack;     // "ack": packed as false when "false", else as this string (a bad type)
  int64_t rid = 0;     // "rid"
};

// The body of a SUBMIT of one job `id` of `model` with a random [8] float32 input.
std::string RawSubmitBody(const std::string& id, const std::string& model,
                          const RawSubmitFields& f = {}) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1 + !f.notify.empty() + !f.ack.empty() + (f.rid != 0));
  if (!f.notify.empty()) {
    protocol::PackString(pk, "notify");
    protocol::PackString(pk, f.notify);
  }
  if (!f.ack.empty()) {
    protocol::PackString(pk, "ack");
    if (f.ack == "false")
      pk.pack_false();
    else
      protocol::PackString(pk, f.ack);
  }
  if (f.rid != 0) {
    protocol::PackString(pk, "rid");
    pk.pack_int64(f.rid);
  }
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  protocol::PackSubmitJob(pk, id, model, {testutil::RandomFloats({8}, 7)}, 0, 0, 0);
  return std::string(buf.data(), buf.size());
}

TEST_F(Wire, GarbageFramesDoNotCrashTheBroker) {
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 2000);
  std::string code;
  EXPECT_EQ(RawExchange(s, {"hello"}, &code), "ERROR");
  EXPECT_EQ(code, "malformed");
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", "\xc1 not msgpack"}, &code), "ERROR");
  EXPECT_EQ(code, "malformed");
  EXPECT_EQ(RawExchange(s, {"FERRY1", "submit", ""}, &code), "ERROR");
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", "\x93\x01\x02\x03"}, &code), "ERROR");  // array
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", ""}, &code), "ERROR");                  // no "jobs"
  EXPECT_EQ(RawExchange(s, {"FERRY1", "FROB", ""}, &code), "ERROR");
  EXPECT_EQ(code, "unknown_command");
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", "", "extra", "frames"}, &code), "ERROR");
  // A job whose tensor has the wrong byte count is rejected in ACCEPTED, not fatal.
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(2);
  pk.pack_int(7);                                            // not a map
  protocol::PackTensor(pk, DType::kFloat32, {8}, "abc", 3);  // a map, but not a job
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", std::string(buf.data(), buf.size())}), "ACCEPTED");
  // Worker-side garbage too.
  zmq::socket_t w(ctx, zmq::socket_type::dealer);
  w.set(zmq::sockopt::linger, 0);
  w.connect(fleet_->backend());
  w.send(zmq::str_buffer("junk"), zmq::send_flags::none);
  w.send(zmq::str_buffer("FERRY1"), zmq::send_flags::sndmore);
  w.send(zmq::str_buffer("READY"), zmq::send_flags::sndmore);
  w.send(zmq::str_buffer("\x81\xa1x\x01"), zmq::send_flags::none);
  // Still serving.
  client::Job job;
  job.model = "tiny";
  job.inputs = {testutil::RandomFloats({8}, 5)};
  std::string id;
  ASSERT_TRUE(client_->Submit(job, &id).ok());
  Result r;
  ASSERT_TRUE(client_->Wait(id, 60000, &r).ok()) << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone);
  EXPECT_TRUE(fleet_->broker().Running());
}

// Attached inputs (docs/protocol.md): tensors marked "attached" take the data frames after the
// body in order -- also one in a job rejected for another reason -- and the broker hands them
// to the worker. A job whose frame has the wrong size is rejected alone; a message whose frames
// and attached tensors differ in number, or a STATS with a data frame, is malformed as a whole.
// Every READY renews <prefix>models' week, a model the broker knows included (protocol.md:
// "EXPIRE one week after the last announcement"): the set outlives a broker that runs for over a
// week, so a restart still accepts its models' jobs before the workers announce again.
TEST_F(Wire, EveryAnnouncementRenewsTheModelsWeek) {
  auto redis = fleet_->redis().Connect();
  ASSERT_NE(redis, nullptr);
  auto ttl = [&] {
    protocol::RedisReply r;
    EXPECT_TRUE(redis->Command({"TTL", "ferry:models"}, &r).ok());
    return r.integer;
  };
  ASSERT_TRUE(testutil::WaitFor([&] { return ttl() > 3600; })) << "the first worker's READY";
  protocol::RedisReply r;
  ASSERT_TRUE(redis->Command({"EXPIRE", "ferry:models", "100"}, &r).ok());
  ASSERT_LE(ttl(), 100);
  zmq::context_t ctx(1);  // a second worker of the same model: nothing new to the broker
  zmq::socket_t w = RawDealer(ctx, fleet_->backend(), 20000);
  RawSend(w, {"FERRY1", "READY", testutil::ReadyBody("second-worker", "tiny")});
  EXPECT_TRUE(testutil::WaitFor([&] { return ttl() > 3600; }))
      << "TTL " << ttl() << ": the announcement did not renew the set";
}

// A member announcing new model names at every READY: the broker takes them until it knows
// 4,096 models (each keeps a queue, specs, metric series and a place in ferry:models), then
// refuses such a READY -- ERROR naming the limit -- and goes on serving. Before, they grew
// without end (1.9 GB and 37 s STATS after 400 READYs).
TEST_F(Wire, ABrokerKnowsAtMost4096Models) {
  zmq::context_t ctx(1);
  zmq::socket_t w = RawDealer(ctx, fleet_->backend(), 20000);
  protocol::WorkerHello hello;
  hello.worker = "churn";
  hello.device = "cpu";
  hello.host = "h";
  hello.pid = 1;
  hello.capacity = 1;
  for (int round = 0; round < 17; ++round) {  // 17 x 256 names, besides tiny: 4,353
    hello.models.clear();
    for (int i = 0; i < 256; ++i)
      hello.models.push_back({"churn-" + std::to_string(round * 256 + i), 1, std::nullopt});
    const zmq::message_t m = protocol::EncodeHello(hello);
    RawSend(w, {"FERRY1", "READY", std::string(static_cast<const char*>(m.data()), m.size())});
  }
  std::string refused;
  while (refused.empty()) {
    protocol::Message m;
    ASSERT_TRUE(protocol::RecvMessage(w, false, &m, /*dont_wait=*/false).ok()) << "no ERROR\n"
                                                                               << fleet_->Logs();
    if (m.command == protocol::kError) refused = std::string(m.body.to_string_view());
  }
  EXPECT_NE(refused.find("model(s) new to the broker, which knows 3841 already: at most 4096"),
            std::string::npos)
      << refused;
  std::string json;
  ASSERT_TRUE(client_->Stats(&json).ok());
  EXPECT_NE(json.find("\"churn-3839\""), std::string::npos);  // the last READY taken
  EXPECT_EQ(json.find("\"churn-3840\""), std::string::npos) << "a refused READY's model is known";
  Result r;
  client::Job j;
  j.model = "tiny";
  j.inputs.push_back(testutil::RandomFloats({8}, 2));
  ASSERT_TRUE(client_->Run(j, 30000, &r).ok()) << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone);
}

// A worker that stops (SIGSTOP: silent, its connection open) while the fleet keeps the broker
// busy is still found silent: the broker reads what waits before it judges, instead of judging
// only when nothing waits (on a busy fleet, whose messages keep arriving, a dead worker's jobs
// stayed with it for as long as the fleet stayed busy). Its jobs run on the other worker. The
// load: a producer submitting all the while (a journal write, a Redis round trip, most turns)
// and a raw member sending a HEARTBEAT every ~40 us, so that something often waits unread when
// a turn ends, though the broker reads faster than that. (The old broker failed this in some
// runs, not all: whether a heartbeat found the socket empty at least once was up to timing.)
TEST(WireLiveness, AWorkerSilentWhileTheFleetIsBusyIsDroppedAndItsJobsRunElsewhere) {
  FleetOptions fo;
  fo.workers = 2;
  fo.max_batch = 1;  // chunks of one job, to each worker in turn: the stopped one gets some
  fo.broker_args = {"--heartbeat-ms", "100", "--liveness", "5"};
  fo.worker_args = {"--heartbeat-ms", "100"};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(2)) << fleet.Logs();
  zmq::context_t ctx(1);
  zmq::socket_t chatty = RawDealer(ctx, fleet.backend(), 20000);
  RawSend(chatty, {"FERRY1", "READY", testutil::ReadyBody("chatty", "nobody-submits-this")});
  auto tiny = [](uint32_t seed) {
    client::Job j;
    j.model = "tiny";
    j.inputs.push_back(Tensor::From<float>(testutil::TinyInput(seed), {8}, DType::kFloat32));
    return j;
  };
  client::ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  std::unique_ptr<client::Client> c, background;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  ASSERT_TRUE(client::Client::Create(o, &background).ok());
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    auto next = std::chrono::steady_clock::now();
    while (!stop) {
      next += std::chrono::microseconds(40);
      while (std::chrono::steady_clock::now() < next) {
      }
      RawSend(chatty, {"FERRY1", "HEARTBEAT", std::string("\x80", 1)});
      zmq::message_t drop;  // the broker's HEARTBEATs: not read, dropped
      while (chatty.recv(drop, zmq::recv_flags::dontwait)) {
      }
    }
  });
  std::thread load([&] {
    std::string id;
    for (uint32_t i = 100; !stop; ++i) (void)background->Submit(tiny(i), &id);
  });
  fleet.worker(0).Signal(SIGSTOP);
  std::vector<client::Job> jobs;
  for (uint32_t i = 0; i < 16; ++i) jobs.push_back(tiny(i));
  std::vector<client::SubmitOutcome> outcomes;
  Status s = c->SubmitMany(jobs, &outcomes);
  bool all_done = s.ok();
  for (const auto& out : outcomes) {
    Result r;
    all_done = all_done && out.status.ok() && c->Wait(out.id, 30000, &r).ok() &&
               r.state == JobState::kDone;
  }
  // The 16 may all have gone to the running worker (the stopped one full of the background's
  // jobs) and be done before the stopped one's 0.5 s of silence: wait for the broker to judge
  // it, with the load still on.
  const bool dropped =
      testutil::WaitFor([&] { return fleet.broker().Log().find("silent") != std::string::npos; },
                        std::chrono::seconds(20));
  stop = true;
  flood.join();
  load.join();
  fleet.worker(0).Signal(SIGCONT);
  EXPECT_TRUE(all_done) << s.ToString() << fleet.Logs();
  EXPECT_TRUE(dropped) << fleet.broker().Log();
}

TEST_F(Wire, AttachedInputsTakeTheDataFramesInOrder) {
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 20000);
  const std::vector<float> x = testutil::TinyInput(3);
  const Tensor t = Tensor::From<float>(x, {8}, DType::kFloat32);
  auto body = [&](const std::vector<std::string>& ids) {
    return AttachedSubmitBody(ids, "tiny", t);
  };
  // Frames: the bad id's (zeros: were it skipped, "att-good" would compute on them), the
  // good job's bytes, and 4 bytes for an [8] float32.
  RawSend(s, {"FERRY1", "SUBMIT", body({"bad id", "att-good", "att-short"}), std::string(32, '\0'),
              t.data, "abcd"});
  protocol::Message m;
  ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok());
  ASSERT_EQ(m.command, "ACCEPTED");
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  protocol::Accepted accepted;
  ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &accepted).ok());
  EXPECT_EQ(accepted.ids, std::vector<std::string>{"att-good"});
  ASSERT_EQ(accepted.rejected.size(), 2u);
  EXPECT_EQ(accepted.rejected[0].code, codes::kInvalidArgument);
  EXPECT_EQ(accepted.rejected[1].id, "att-short");
  EXPECT_EQ(accepted.rejected[1].code, codes::kInvalidArgument);
  EXPECT_NE(accepted.rejected[1].message.find("data frame has 4 bytes"), std::string::npos)
      << accepted.rejected[1].message;
  Result r;
  ASSERT_TRUE(client_->Wait("att-good", 60000, &r).ok()) << fleet_->Logs();
  ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  const std::vector<float> y = r.outputs.at(0).As<float>();
  const std::vector<float> want = testutil::TinyExpected(x);
  ASSERT_EQ(y.size(), want.size());
  for (size_t j = 0; j < y.size(); ++j) EXPECT_NEAR(y[j], want[j], 1e-5) << j;

  // One attached tensor and no frame, or a frame too many: nothing of the message is taken.
  std::string code;
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", body({"att-lost"})}, &code), "ERROR");
  EXPECT_EQ(code, codes::kMalformed);
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", body({"att-lost"}), t.data, t.data}, &code),
            "ERROR");
  EXPECT_EQ(code, codes::kMalformed);
  EXPECT_EQ(RawExchange(s, {"FERRY1", "STATS", "", t.data}, &code), "ERROR");
  EXPECT_EQ(code, codes::kMalformed);
  // The id was not taken by either: now it is accepted (not a duplicate) and runs.
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", body({"att-lost"}), t.data}), "ACCEPTED");
  ASSERT_TRUE(client_->Wait("att-lost", 60000, &r).ok()) << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone);
  EXPECT_EQ(r.outputs.at(0).As<float>(), y);
}

// The same on the wire, as a client in another language does it: SUBSCRIBE, then SUBMIT with
// "notify". The notice (a FINISHED body) arrives on the channel, and the broker sends no FINISHED
// for that job -- proven by a second job without "notify", whose FINISHED comes and is the only
// one. A "notify" that is not the fleet's channel form is refused with ERROR invalid_argument.
TEST_F(Wire, RawNotifyChannelGetsTheNoticeInsteadOfFinished) {
  protocol::RedisEndpoint ep;
  ep.port = fleet_->redis().port();
  const std::string channel = "ferry:notify:raw-test-1";
  std::unique_ptr<protocol::RedisSubscriber> sub;
  ASSERT_TRUE(protocol::RedisSubscriber::Connect(ep, 2000, channel, &sub).ok());

  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 20000);
  auto submit = [](const std::string& id, const std::string& notify) {
    return RawSubmitBody(id, "tiny", {notify});
  };
  std::string code;
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", submit("raw-bad", "elsewhere:x")}, &code), "ERROR");
  EXPECT_EQ(code, "invalid_argument");
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", submit("raw-bad", "ferry:notify:")}, &code),
            "ERROR");
  EXPECT_EQ(code, "invalid_argument");

  ASSERT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", submit("raw-notified", channel)}), "ACCEPTED");
  // The notice, from Redis.
  std::vector<std::string> notice_ids;
  protocol::InlineResults notice_records;
  std::string payload;
  ASSERT_TRUE(testutil::NextPubSubMessage(sub.get(), &payload))
      << "no notice on " << channel << "\n"
      << fleet_->Logs();
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(payload.data(), payload.size(), &oh).ok());
  ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", &notice_ids).ok());
  ASSERT_TRUE(protocol::DecodeInlineResults(oh.get(), &notice_records).ok());
  EXPECT_EQ(notice_ids, std::vector<std::string>{"raw-notified"});
  ASSERT_EQ(notice_records.size(), 1u);
  Result stored;
  ASSERT_TRUE(client_->Poll("raw-notified", &stored).ok());
  EXPECT_EQ(stored.state, JobState::kDone);
  std::unique_ptr<protocol::RedisClient> redis;
  ASSERT_TRUE(protocol::RedisClient::Connect(ep, 2000, &redis).ok());
  std::string value;
  bool found = false;
  ASSERT_TRUE(redis->Get("ferry:result:raw-notified", &value, &found).ok());
  ASSERT_TRUE(found);
  EXPECT_EQ(std::string(notice_records[0].second), value) << "the notice's record is Redis's";

  // A job without "notify": its FINISHED is the first and only one this connection gets (the
  // worker reports in order, so a FINISHED for the first job would have come before it).
  ASSERT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", submit("raw-plain", "")}), "ACCEPTED");
  protocol::Message m;
  ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) << fleet_->Logs();
  ASSERT_EQ(m.command, "FINISHED");
  msgpack::object_handle fh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &fh).ok());
  std::vector<std::string> finished;
  ASSERT_TRUE(protocol::GetStringArray(fh.get(), "ids", &finished).ok());
  EXPECT_EQ(finished, std::vector<std::string>{"raw-plain"});
}

// SUBMIT "ack": false on the wire: the broker sends ACCEPTED only to report a rejection, and a
// job it accepted silently still runs (its FINISHED comes).
TEST_F(Wire, RawSubmitWithoutAckIsAnsweredOnlyForRejections) {
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 20000);
  // A one-job SUBMIT body with "rid" and, unless "", "ack" (see RawSubmitFields).
  auto submit = [](const std::string& id, const std::string& model, const std::string& ack,
                   int64_t rid) {
    return RawSubmitBody(id, model, {"", ack, rid});
  };
  auto send = [&s](const std::string& body) { RawSend(s, {"FERRY1", "SUBMIT", body}); };
  // The next message that is not FINISHED, into *m (*oh: its body, which refers to m's bytes);
  // FINISHED ids go to *finished.
  auto next_reply = [&s](std::vector<std::string>* finished, protocol::Message* m,
                         msgpack::object_handle* oh) {
    while (true) {
      if (!protocol::RecvMessage(s, false, m, /*dont_wait=*/false).ok()) return std::string();
      if (!protocol::UnpackMap(m->body.data(), m->body.size(), oh).ok()) return std::string("?");
      if (m->command != protocol::kFinished) return m->command;
      std::vector<std::string> ids;
      EXPECT_TRUE(protocol::GetStringArray(oh->get(), "ids", &ids).ok());
      finished->insert(finished->end(), ids.begin(), ids.end());
    }
  };
  std::string code;
  EXPECT_EQ(RawExchange(s, {"FERRY1", "SUBMIT", submit("raw-ack-bad", "tiny", "no", 1)}, &code),
            "ERROR");
  EXPECT_EQ(code, "invalid_argument");

  std::vector<std::string> finished;
  protocol::Message reply;
  msgpack::object_handle oh;
  protocol::Accepted a;
  send(submit("raw-quiet-rejected", "no-such-model", "false", 2));
  ASSERT_EQ(next_reply(&finished, &reply, &oh), "ACCEPTED") << fleet_->Logs();
  ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &a).ok());
  EXPECT_EQ(a.rid, 2);
  EXPECT_TRUE(a.ids.empty());
  ASSERT_EQ(a.rejected.size(), 1u);
  EXPECT_EQ(a.rejected[0].id, "raw-quiet-rejected");
  EXPECT_EQ(a.rejected[0].code, "unknown_model");

  // Accepted silently, then one with the default ack: the first reply is the second one's (an
  // ACCEPTED for the first would have been sent before it).
  send(submit("raw-quiet", "tiny", "false", 3));
  send(submit("raw-loud", "tiny", "", 4));
  ASSERT_EQ(next_reply(&finished, &reply, &oh), "ACCEPTED") << fleet_->Logs();
  ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &a).ok());
  EXPECT_EQ(a.rid, 4);
  EXPECT_EQ(a.ids, std::vector<std::string>{"raw-loud"});
  // Both ran: a FINISHED names each (the worker reports in order; nothing else arrives).
  while (std::count(finished.begin(), finished.end(), "raw-quiet") == 0 ||
         std::count(finished.begin(), finished.end(), "raw-loud") == 0) {
    protocol::Message m;
    ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok())
        << "no FINISHED for both jobs\n"
        << fleet_->Logs();
    ASSERT_EQ(m.command, "FINISHED");
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    std::vector<std::string> ids;
    ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", &ids).ok());
    finished.insert(finished.end(), ids.begin(), ids.end());
  }
  Result stored;
  ASSERT_TRUE(client_->Poll("raw-quiet", &stored).ok());
  EXPECT_EQ(stored.state, JobState::kDone);
}

// A job whose id is pending is `duplicate` whatever else is wrong with it -- an unknown model, a
// job that does not decode past its id -- so that any other rejection tells the producer the
// id is not pending and the job's stored inputs are its own to delete (protocol.md). Before, a
// malformed job with a pending id was `invalid_argument`, and the SDKs deleted the pending
// job's stored inputs.
TEST_F(Wire, APendingIdIsADuplicateWhateverElseIsWrong) {
  fleet_->worker(0).Signal(SIGSTOP);  // the job below stays pending on it
  client::Job job;
  job.model = "tiny";
  job.inputs = {testutil::RandomFloats({8}, 3)};
  std::string id;
  ASSERT_TRUE(client_->Submit(job, &id).ok());
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 20000);
  msgpack::sbuffer no_inputs;  // {"jobs": [{"id": id, "model": "tiny"}]}
  protocol::Packer pk(no_inputs);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  pk.pack_map(2);
  protocol::PackString(pk, "id");
  protocol::PackString(pk, id);
  protocol::PackString(pk, "model");
  protocol::PackString(pk, "tiny");
  for (const std::string& body :
       {RawSubmitBody(id, "no-such-model"), std::string(no_inputs.data(), no_inputs.size())}) {
    RawSend(s, {"FERRY1", "SUBMIT", body});
    protocol::Message reply;
    ASSERT_TRUE(protocol::RecvMessage(s, false, &reply, /*dont_wait=*/false).ok());
    ASSERT_EQ(reply.command, "ACCEPTED");
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(reply.body.data(), reply.body.size(), &oh).ok());
    protocol::Accepted a;
    ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &a).ok());
    ASSERT_EQ(a.rejected.size(), 1u);
    EXPECT_EQ(a.rejected[0].id, id);
    EXPECT_EQ(a.rejected[0].code, codes::kDuplicate) << a.rejected[0].message;
  }
  fleet_->worker(0).Signal(SIGCONT);
  Result r;
  ASSERT_TRUE(client_->Wait(id, 60000, &r).ok()) << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone);
}

// When the journal write of a turn fails, the broker rejects that turn's jobs `unavailable`; a
// job that already ended within the turn keeps its one fate. Here a CANCEL read right after the
// SUBMIT cancels the job while it is queued, and a second SUBMIT of the same id follows: the
// first ACCEPTED names the job (no rejection beside it), CANCELLED names it, its result says
// cancelled, and the second SUBMIT -- a job the failed write did not keep -- is the one rejected
// `unavailable`. The job's FINISHED comes after its ACCEPTED, never before (the cancelled result
// is written at once, but its notice waits for the turn's replies). The write fails because
// Redis refuses HSET (an ACL rule); the broker is stopped (SIGSTOP) while the three messages
// reach its socket, so that it reads them in one turn.
TEST_F(Wire, AJobCancelledInTheTurnOfAFailedJournalWriteIsNotAlsoRejected) {
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 20000);
  ASSERT_EQ(RawExchange(s, {"FERRY1", "STATS", ""}), "STATS") << fleet_->Logs();  // connected
  auto admin = fleet_->redis().Connect();
  ASSERT_TRUE(admin);
  protocol::RedisReply r;
  ASSERT_TRUE(admin->Command({"ACL", "SETUSER", "default", "-hset"}, &r).ok());  // no journal
  const std::string id = "cancelled-in-a-failed-turn";
  const zmq::message_t cancel = protocol::EncodeIds({id}, 2);
  const std::vector<std::string> messages[] = {
      {"FERRY1", "SUBMIT", RawSubmitBody(id, "tiny", {"", "", 1})},
      {"FERRY1", "CANCEL", std::string(static_cast<const char*>(cancel.data()), cancel.size())},
      {"FERRY1", "SUBMIT", RawSubmitBody(id, "tiny", {"", "", 3})}};
  fleet_->broker().Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntilStopped(fleet_->broker().pid())) << "the broker did not stop";
  const size_t before = UnreadBytes(fleet_->frontend());
  size_t bytes = 0;
  for (const auto& frames : messages) {
    RawSend(s, frames);
    bytes += WireBytes(frames);
  }
  ASSERT_TRUE(WaitUntilUnread(fleet_->frontend(), before, bytes))
      << "not all reached the broker: " << UnreadBytes(fleet_->frontend()) << " unread, " << before
      << " before, " << bytes << " sent";
  fleet_->broker().Signal(SIGCONT);
  std::map<int64_t, protocol::Accepted> accepted;  // by rid
  protocol::Cancelled cancelled;
  std::vector<std::string> order;  // ACCEPTED (of rid 1) and FINISHED, as they came
  for (int replies = 0; replies < 3 || order.size() < 2;) {
    protocol::Message m;
    ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) << "no reply\n"
                                                                               << fleet_->Logs();
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    if (m.command == protocol::kAccepted) {
      protocol::Accepted a;
      ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &a).ok());
      accepted[a.rid] = a;
      if (a.rid == 1) order.push_back(m.command);
      ++replies;
    } else if (m.command == protocol::kCancelled) {
      ASSERT_TRUE(protocol::DecodeCancelled(oh.get(), &cancelled).ok());
      ++replies;
    } else if (m.command == protocol::kFinished) {
      order.push_back(m.command);
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"ACCEPTED", "FINISHED"}));
  ASSERT_TRUE(admin->Command({"ACL", "SETUSER", "default", "+hset"}, &r).ok());
  EXPECT_EQ(cancelled.ids, std::vector<std::string>{id}) << fleet_->Logs();
  EXPECT_EQ(accepted[1].ids, std::vector<std::string>{id});
  for (const auto& rejection : accepted[1].rejected)
    ADD_FAILURE() << "also rejected: " << rejection.code << " " << rejection.message;
  EXPECT_TRUE(accepted[3].ids.empty());
  ASSERT_EQ(accepted[3].rejected.size(), 1u);
  EXPECT_EQ(accepted[3].rejected[0].code, codes::kUnavailable);
  Result result;
  ASSERT_TRUE(client_->Wait(id, 30000, &result).ok()) << fleet_->Logs();
  EXPECT_EQ(result.state, JobState::kCancelled) << result.error.ToString();
}

}  // namespace
}  // namespace ferry
