// The frontend's wire protocol spoken by hand over a raw DEALER, against real redis-server,
// ferry-broker and ferry-worker processes (one worker serving `tiny`): what a client in another
// language sees (docs/protocol.md) -- garbage frames, SUBMIT's "notify" and "ack" fields.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
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
#include "reference.h"
#include "tiny_reference.h"

namespace ferry {
namespace {

using testutil::Fleet;
using testutil::FleetOptions;

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

// A DEALER connected to `endpoint`, for speaking the wire protocol by hand.
zmq::socket_t RawDealer(zmq::context_t& ctx, const std::string& endpoint, int rcvtimeo_ms) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, rcvtimeo_ms);
  s.connect(endpoint);
  return s;
}

// Sends raw frames over a DEALER as one message.
void RawSend(zmq::socket_t& s, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    s.send(zmq::buffer(frames[i]),
           i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

// Sends raw frames over a DEALER and returns the reply's command ("" when none within its
// receive timeout), skipping FINISHED notices as a client does.
std::string RawExchange(zmq::socket_t& s, const std::vector<std::string>& frames,
                        std::string* code = nullptr) {
  RawSend(s, frames);
  protocol::Message m;
  do {
    if (!protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) return "";
  } while (m.command == protocol::kFinished);
  if (code) {
    msgpack::object_handle oh;
    if (protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok())
      protocol::GetString(oh.get(), "code", code);
  }
  return m.command;
}

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

// The body of a SUBMIT of one job per id, of `model`, with `t` as its one input, attached (its
// bytes are to follow as a data frame per job).
std::string AttachedSubmitBody(const std::vector<std::string>& ids, const std::string& model,
                               const Tensor& t) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(static_cast<uint32_t>(ids.size()));
  for (const auto& id : ids) protocol::PackSubmitJob(pk, id, model, {t}, 0, 0, 0, {}, {true});
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

  protocol::WorkerHello hello;
  hello.worker = "framed-worker";
  hello.device = "cpu";
  hello.host = "h";
  hello.pid = 1;
  hello.capacity = 1;
  hello.models = {{"null", 1, std::nullopt}};
  const zmq::message_t ready = protocol::EncodeHello(hello);
  const std::string ready_body(static_cast<const char*>(ready.data()), ready.size());
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
  auto job = [](const std::string& id, size_t floats) {
    client::Job j;
    j.id = id;
    j.model = "null";
    std::vector<float> v(floats);
    for (size_t i = 0; i < floats; ++i) v[i] = static_cast<float>(i % 1000);
    j.inputs.push_back(Tensor::From<float>(v, {static_cast<int64_t>(floats)}, DType::kFloat32));
    return j;
  };
  const client::Job big = job("over-limit", 2 * kLimit / 4);  // 2 MiB in one frame
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
  client::Job wide = job(std::string(128, 'a'), (kLimit - 320) / 4);
  wide.inputs[0].shape.assign(15, 1);
  wide.inputs[0].shape.push_back((kLimit - 320) / 4);
  wide.priority = std::numeric_limits<int64_t>::max();
  wide.timeout_ms = 3600000;
  wide.result_ttl_s = 86400;
  s = c2->Run(wide, 60000, &r);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();

  // Eight jobs of 320 KB: one message would be 2.5 MiB (ERROR too_large for all eight).
  std::vector<client::Job> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(job("under-" + std::to_string(i), 80000));
  std::vector<client::SubmitOutcome> out;
  ASSERT_TRUE(c->SubmitMany(jobs, &out).ok());
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status.ToString();
    ASSERT_TRUE(c->Wait(out[i].id, 60000, &r).ok()) << fleet.Logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
    EXPECT_EQ(r.outputs.at(0).data, jobs[i].inputs[0].data);
  }
  client::ClientOptions bad = o;
  bad.max_message_bytes = 1000;
  std::unique_ptr<client::Client> unused;
  EXPECT_EQ(client::Client::Create(bad, &unused).code(), codes::kInvalidArgument);
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

// When the journal write of a turn fails, the broker rejects that turn's jobs `unavailable`; a
// job that already ended within the turn keeps its one fate. Here a CANCEL read right after the
// SUBMIT cancels the job while it is queued, and a second SUBMIT of the same id follows: the
// first ACCEPTED names the job (no rejection beside it), CANCELLED names it, its result says
// cancelled, and the second SUBMIT -- a job the failed write did not keep -- is the one rejected
// `unavailable`. The write fails because Redis refuses HSET (an ACL rule); the broker is stopped
// (SIGSTOP) while the three messages reach its socket, so that it reads them in one turn.
TEST_F(Wire, AJobCancelledInTheTurnOfAFailedJournalWriteIsNotAlsoRejected) {
  zmq::context_t ctx(1);
  zmq::socket_t s = RawDealer(ctx, fleet_->frontend(), 20000);
  ASSERT_EQ(RawExchange(s, {"FERRY1", "STATS", ""}), "STATS") << fleet_->Logs();  // connected
  auto admin = fleet_->redis().Connect();
  ASSERT_TRUE(admin);
  protocol::RedisReply r;
  ASSERT_TRUE(admin->Command({"ACL", "SETUSER", "default", "-hset"}, &r).ok());  // no journal
  const std::string id = "cancelled-in-a-failed-turn";
  fleet_->broker().Signal(SIGSTOP);
  RawSend(s, {"FERRY1", "SUBMIT", RawSubmitBody(id, "tiny", {"", "", 1})});
  const zmq::message_t cancel = protocol::EncodeIds({id}, 2);
  RawSend(
      s, {"FERRY1", "CANCEL", std::string(static_cast<const char*>(cancel.data()), cancel.size())});
  RawSend(s, {"FERRY1", "SUBMIT", RawSubmitBody(id, "tiny", {"", "", 3})});
  fleet_->broker().Signal(SIGCONT);
  std::map<int64_t, protocol::Accepted> accepted;  // by rid
  protocol::Cancelled cancelled;
  for (int replies = 0; replies < 3;) {
    protocol::Message m;
    ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) << "no reply\n"
                                                                               << fleet_->Logs();
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    if (m.command == protocol::kAccepted) {
      protocol::Accepted a;
      ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &a).ok());
      accepted[a.rid] = a;
      ++replies;
    } else if (m.command == protocol::kCancelled) {
      ASSERT_TRUE(protocol::DecodeCancelled(oh.get(), &cancelled).ok());
      ++replies;
    }
  }
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
