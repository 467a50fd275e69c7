// CurveZMQ on a real fleet (docs/security.md, "What a member can do"): members whose keys the
// broker lists, misbehaving over raw DEALER sockets -- a worker that lies about the jobs it
// finished or about who it is, a producer cancelling somebody else's job, crafted SUBMITs (absurd
// TTLs and timeouts, millions of nils), requests whose replies are never read. Each gets a clear
// refusal and nothing it is not owed, while the fleet keeps serving with bounded memory. Who gets
// in at all: security_access_test.cc.
#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/metrics/names.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"
#include "security_fixture.h"

namespace ferry::security_test {
namespace {

// The "code" of an ERROR body ("" when there is none).
std::string ErrorCode(const protocol::Message& m) {
  msgpack::object_handle oh;
  std::string code;
  if (protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok())
    (void)protocol::GetString(oh.get(), "code", &code);
  return code;
}

// Resident set size of a process, from /proc (0 when unreadable).
TEST_F(Curve, AListedWorkerThatLiesAboutDoneFinishesNothing) {
  // raw0 serves `head` with room for one job and never answers: the first job runs on it, the
  // second waits in the queue. raw1 serves another model and holds nothing.
  zmq::socket_t holder = RawWorker(0, {"head"}, 1);
  zmq::socket_t liar = RawWorker(1, {"other"}, 4);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 3; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    client::Job job = TinyJob();
    job.model = "head";
    std::string id;
    Status st = client_->Submit(job, &id);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ids.push_back(id);
  }
  EXPECT_EQ(WorkerRecv(holder, 10000), "CHUNK");
  const int64_t finished = Counter(*client_, "finished");
  const int64_t duplicates = Counter(*client_, "duplicates");
  // raw1 claims both done (one running on raw0, one queued), twice, each time with 2^63-1
  // duplicates; raw0 claims the queued one.
  for (int i = 0; i < 2; ++i)
    RawSend(liar, "DONE", protocol::EncodeDone(ids, std::numeric_limits<int64_t>::max()));
  RawSend(holder, "DONE", protocol::EncodeDone({ids[1]}, 0));
  ExpectRuns(*client_);  // the broker reads the DONEs before it dispatches this job
  ASSERT_TRUE(
      testutil::WaitFor([&] { return PendingJobs(*client_) == 2; }, std::chrono::seconds(10)));
  EXPECT_EQ(Counter(*client_, "finished"), finished + 1);  // the `tiny` job just run
  // A duplicate is one of the ids reported: at most 2 per DONE, and no counter wraps.
  EXPECT_GE(Counter(*client_, "duplicates"), duplicates);
  EXPECT_LE(Counter(*client_, "duplicates"), duplicates + 4);
  for (const auto& id : ids) {
    Result r;
    ASSERT_TRUE(client_->Poll(id, &r).ok());
    EXPECT_EQ(r.state, JobState::kPending) << id;
  }
  EXPECT_NE(WorkerRecv(liar, 200), "CHUNK");
}

// A DONE from a connection that does not hold its jobs (a worker dropped as silent, whose jobs
// went elsewhere) finishes those whose result is in Redis, and the rest of what it says holds
// for them as for any DONE: `not_done` is the status the metrics count (a failed job is not
// counted `done`), and a job in `notified` gets no FINISHED (its producer had the notice on the
// job's `notify` channel). Before, both were dropped: the failed job counted `done`, and the
// notified one got a FINISHED too.
TEST_F(Curve, ALateDoneTellsHowItsJobsEndedAndWhichWereNotified) {
  zmq::socket_t holder = RawWorker(0, {"head"}, 2);
  zmq::socket_t late = RawWorker(1, {"other"}, 4);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 3; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  zmq::socket_t producer = RawProducer();
  const std::vector<std::pair<std::string, std::string>> jobs = {{"late-notified", "done"},
                                                                 {"late-failed", "failed"}};
  auto redis = fleet_->redis().Connect();
  ASSERT_TRUE(redis);
  for (const auto& [id, status] : jobs) {
    RawSend(producer, "SUBMIT", SubmitBody(id, "head", 0, 0, "ferry:notify:late-done"));
    ASSERT_EQ(RawRecv(producer, 10000), "ACCEPTED");
    // Its result, as the worker that ran it writes it.
    protocol::ResultRecord rec;
    rec.id = id;
    rec.status = status;
    rec.model = "head";
    rec.worker = "raw0:1:cpu";
    if (status == "failed") {
      rec.error_code = codes::kModelError;
      rec.error_message = "the model raised";
    }
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    protocol::PackResult(pk, rec);
    protocol::RedisReply r;
    ASSERT_TRUE(
        redis->Command({"SET", "ferry:result:" + id, std::string(buf.data(), buf.size())}, &r)
            .ok());
  }
  EXPECT_EQ(WorkerRecv(holder, 10000), "CHUNK");
  RawSend(late, "DONE", protocol::EncodeDone({"late-notified"}, 0, {}, {}, {"late-notified"}));
  RawSend(late, "DONE", protocol::EncodeDone({"late-failed"}, 0, {{"late-failed", "failed"}}));
  // FINISHEDs go out in order: the first names the failed job alone.
  protocol::Message m;
  ASSERT_EQ(RawRecv(producer, 10000, &m), "FINISHED") << fleet_->Logs();
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  std::vector<std::string> ids;
  ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", &ids).ok());
  EXPECT_EQ(ids, std::vector<std::string>{"late-failed"});
  EXPECT_EQ(PendingJobs(*client_), 0);
  const std::string finished = metrics::names::kJobsFinished;
  EXPECT_EQ(Metric(finished, {{"model", "head"}, {"status", "failed"}}), 1);
  EXPECT_EQ(Metric(finished, {{"model", "head"}, {"status", "done"}}), 1);
}

// A worker's BYE says it wrote the results of every job it received: a job the broker still
// counts as its (a CHUNK that crossed the worker's last DONE) never reached it, and goes to the
// next worker without spending an attempt. Before, it went with attempt + 1, and a job already
// at --max-attempts was poisoned without ever having run.
TEST_F(Curve, AJobHeldByAWorkerThatSaysByeGoesOnWithoutSpendingAnAttempt) {
  zmq::socket_t leaving = RawWorker(0, {"head"}, 1);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 2; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  client::Job job = TinyJob("crossed-the-bye");
  job.model = "head";
  std::string id;
  ASSERT_TRUE(client_->Submit(job, &id).ok());
  ASSERT_EQ(WorkerRecv(leaving, 10000), "CHUNK");  // (as if it had not arrived yet)
  RawSend(leaving, "BYE", protocol::EncodeEmpty());
  zmq::socket_t next = RawWorker(1, {"head"}, 1);
  protocol::Message m;
  ASSERT_EQ(WorkerRecv(next, 10000, &m), "CHUNK") << fleet_->Logs();
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  const msgpack::object* jobs = protocol::Find(oh.get(), "jobs");
  ASSERT_TRUE(jobs != nullptr && jobs->type == msgpack::type::ARRAY && jobs->via.array.size == 1);
  protocol::ChunkJob entry;
  ASSERT_TRUE(protocol::DecodeChunkEntry(jobs->via.array.ptr[0], &entry).ok());
  EXPECT_EQ(entry.id, id);
  EXPECT_EQ(entry.attempt, 1);
  EXPECT_EQ(Counter(*client_, "requeued"), 1);
}

TEST_F(Curve, OnlyTheOwnerOrAnOperatorCancelsAJob) {
  // A job that waits in the queue: raw0 holds the first `head` job and never answers.
  zmq::socket_t holder = RawWorker(0, {"head"}, 1);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 2; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  client::Job job = TinyJob();
  job.model = "head";
  std::string running, queued;
  ASSERT_TRUE(client_->Submit(job, &running).ok());
  ASSERT_TRUE(client_->Submit(job, &queued).ok());
  auto other = MakeClient("other");
  ASSERT_TRUE(other);
  for (const std::string& id : {running, queued})
    EXPECT_EQ(other->Cancel(id).code(), std::string(codes::kNotFound)) << id;
  EXPECT_EQ(PendingJobs(*client_), 2);
  auto op = MakeClient("operator");
  ASSERT_TRUE(op);
  Status s = op->Cancel(queued);
  EXPECT_TRUE(s.ok()) << s.ToString();
  Result r;
  ASSERT_TRUE(client_->Wait(queued, 10000, &r).ok());
  EXPECT_EQ(r.state, JobState::kCancelled);
  // The owner may cancel its running job (raw0 is asked to stop it).
  client::CancelReport report;
  ASSERT_TRUE(client_->CancelMany({running}, &report).ok());
  EXPECT_EQ(report.running, std::vector<std::string>{running});
}

TEST_F(Curve, AbsurdTtlIsRefusedAndAnEndlessTimeoutRuns) {
  zmq::socket_t s = RawProducer();
  // result_ttl_s 2^62: refused per job, by name, and no worker ever sees it.
  RawSend(s, "SUBMIT", SubmitBody("ttl-job", "tiny", 0, int64_t{1} << 62));
  protocol::Message m;
  ASSERT_EQ(RawRecv(s, 10000, &m), "ACCEPTED");
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  protocol::Accepted accepted;
  ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &accepted).ok());
  ASSERT_EQ(accepted.rejected.size(), 1u);
  EXPECT_EQ(accepted.rejected[0].id, "ttl-job");
  EXPECT_EQ(accepted.rejected[0].code, codes::kInvalidArgument);
  EXPECT_NE(accepted.rejected[0].message.find("--max-result-ttl-s"), std::string::npos);
  // timeout_ms INT64_MAX: no deadline (the arithmetic saturates), not "expired at once".
  RawSend(s, "SUBMIT", SubmitBody("endless-job", "tiny", std::numeric_limits<int64_t>::max()));
  ASSERT_EQ(RawRecv(s, 10000), "ACCEPTED");
  Result r;
  ASSERT_TRUE(client_->Wait("endless-job", 30000, &r).ok()) << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
  protocol::RedisReply ttl;
  ASSERT_TRUE(fleet_->redis().Connect()->Command({"TTL", "ferry:result:endless-job"}, &ttl).ok());
  EXPECT_GT(ttl.integer, 0);
  ExpectRuns(*client_);
}

TEST_F(Curve, ALyingReadyIsRefusedAndEvictsNobody) {
  std::string json;
  ASSERT_TRUE(client_->Stats(&json).ok());
  const size_t at = json.find("\"id\":\"");
  ASSERT_NE(at, std::string::npos) << json;
  const std::string live = json.substr(at + 6, json.find('"', at + 6) - at - 6);
  // raw0 takes the live worker's name; raw1 announces 3,005 models; raw1 again with control
  // characters in its name.
  zmq::socket_t thief = RawWorker(0, {"tiny"}, 4);
  std::vector<std::string> junk;
  for (int i = 0; i < 3005; ++i) junk.push_back("junk-" + std::to_string(i));
  zmq::socket_t flood =
      CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[1], BrokerPublicKey());
  RawSend(flood, "READY", HelloBody("raw1:1:cpu", junk, 4));
  protocol::Message m;
  EXPECT_EQ(RawRecv(flood, 10000, &m), "ERROR");
  EXPECT_EQ(ErrorCode(m), codes::kInvalidArgument);
  RawSend(flood, "READY", HelloBody("raw1\x1b[2J\n:1:cpu", {"tiny"}, 4));
  EXPECT_EQ(RawRecv(flood, 10000, &m), "ERROR");
  zmq::socket_t name_thief =
      CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[0], BrokerPublicKey());
  RawSend(name_thief, "READY", HelloBody(live, {"tiny"}, 4));
  EXPECT_EQ(RawRecv(name_thief, 10000, &m), "ERROR");
  // The live worker still serves; no junk model became known.
  for (int i = 0; i < 5; ++i) ExpectRuns(*client_);
  ASSERT_TRUE(client_->Stats(&json).ok());
  EXPECT_NE(json.find(live), std::string::npos);
  EXPECT_EQ(json.find("junk-"), std::string::npos);
  EXPECT_EQ(json.find("\x1b"), std::string::npos);
  EXPECT_GE(Metric(metrics::names::kMessagesRefused), 3);
}

// A member's flood of frames without Ferry's framing on the backend is counted and its warnings
// rate-limited, as every other bad frame (security.md). Before, each one was a log line and
// none was counted.
TEST_F(Curve, AFloodOfUnframedWorkerMessagesIsCountedAndItsWarningsLimited) {
  const double refused = Metric(metrics::names::kMessagesRefused);
  zmq::socket_t junk =
      CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[0], BrokerPublicKey());
  for (int i = 0; i < 200; ++i) junk.send(zmq::buffer(std::string("junk")), zmq::send_flags::none);
  ASSERT_TRUE(testutil::WaitFor([&] {
    return Metric(metrics::names::kMessagesRefused) - refused >= 200;
  })) << Metric(metrics::names::kMessagesRefused) - refused
      << " counted\n"
      << fleet_->Logs();
  const std::string log = fleet_->broker().Log();
  size_t warnings = 0;
  for (size_t at = log.find("malformed worker message"); at != std::string::npos;
       at = log.find("malformed worker message", at + 1))
    ++warnings;
  EXPECT_GE(warnings, 1u);
  EXPECT_LE(warnings, 11u) << "a warning per frame";
  ExpectRuns(*client_);
}

TEST_F(Curve, AHugeSubmitOrCancelIsRefusedSmallAndCheaply) {
  zmq::socket_t s = RawProducer();
  const int64_t rss_before = testutil::RssBytes(fleet_->broker().pid());
  ASSERT_GT(rss_before, 0);
  const double refused = Metric(metrics::names::kMessagesRefused);
  // 2^20 nils in "jobs" (1 MiB), four times: beyond the decoder's limits (malformed, before
  // anything is built from it). 20,000 nils: beyond the jobs a message may carry (too_large).
  auto nils = [](int n) {
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(n);
    for (int i = 0; i < n; ++i) pk.pack_nil();
    return protocol::ToMessage(std::move(buf));
  };
  for (int round = 0; round < 4; ++round) RawSend(s, "SUBMIT", nils(1 << 20));
  for (int round = 0; round < 4; ++round) {
    protocol::Message m;
    ASSERT_EQ(RawRecv(s, 10000, &m), "ERROR");
    EXPECT_EQ(ErrorCode(m), codes::kMalformed);
    EXPECT_LT(m.body.size(), 1024u);
  }
  protocol::Message m;
  RawSend(s, "SUBMIT", nils(20000));
  ASSERT_EQ(RawRecv(s, 10000, &m), "ERROR");
  EXPECT_EQ(ErrorCode(m), codes::kTooLarge);
  EXPECT_LT(m.body.size(), 1024u);
  // CANCEL of 20,000 ids: too_large too.
  RawSend(s, "CANCEL", protocol::EncodeIds(std::vector<std::string>(20000, "x")));
  ASSERT_EQ(RawRecv(s, 10000, &m), "ERROR");
  EXPECT_EQ(ErrorCode(m), codes::kTooLarge);
  // Each refusal is counted; no job was, as rejected (none was read).
  EXPECT_EQ(Metric(metrics::names::kMessagesRefused) - refused, 6);
  EXPECT_EQ(Metric(metrics::names::kJobsRejected), 0);
  ExpectRuns(*client_);
  EXPECT_EQ(Workers(), 1);
  EXPECT_LT(testutil::RssBytes(fleet_->broker().pid()) - rss_before, int64_t{64} << 20);
}

TEST_F(Curve, UnreadRepliesAreDroppedAndCountedNotHoarded) {
  zmq::socket_t s = RawProducer();
  s.set(zmq::sockopt::rcvhwm, 1);  // reads nothing: the replies pile up at the broker
  const int64_t rss_before = testutil::RssBytes(fleet_->broker().pid());
  ASSERT_GT(rss_before, 0);
  for (int i = 0; i < 50000; ++i) RawSend(s, "STATS", protocol::EncodeEmpty(0));
  ASSERT_TRUE(testutil::WaitFor([&] { return Metric(metrics::names::kRepliesDropped) > 0; },
                                std::chrono::seconds(60)))
      << fleet_->Logs();
  ExpectRuns(*client_);
  EXPECT_EQ(Workers(), 1);
  EXPECT_LT(testutil::RssBytes(fleet_->broker().pid()) - rss_before, int64_t{200} << 20);
}
}  // namespace
}  // namespace ferry::security_test
