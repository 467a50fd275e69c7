// BrokerLink with a ResultWriter and an Outbox behind it, as in the worker: CHUNKs from the broker
// become queued jobs, their results are written to Redis and reported in DONE, each job exactly
// once; DONEs of notified jobs are held and coalesced; a drain holds DONEs until BYE. Real parts:
// a redis-server, a test-side ROUTER standing in for the broker over TCP, and the test thread
// playing the executor (JobQueue::TakeBatch, then ResultWriter::Submit).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "broker_link.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "job_queue.h"
#include "outbox.h"
#include "process.h"  // testutil: RedisServer, WaitFor
#include "result_writer.h"

namespace ferry::worker {
namespace {

// A CHUNK of one job with no inputs (nothing here runs a model); `notify` names a producer's
// channel for its result notice.
zmq::message_t Chunk(const std::string& id, const std::string& notify = "") {
  msgpack::sbuffer inputs;
  protocol::Packer ipk(inputs);
  ipk.pack_array(0);
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  protocol::PackChunkEntry(pk, id, "tiny", std::string_view(inputs.data(), inputs.size()), 1, 0, 0,
                           0, 0, 0, notify);
  return protocol::ToMessage(std::move(buf));
}

class BrokerLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:*");
    ASSERT_TRUE(outbox_.Init().ok());
    ResultWriter::Options wo;
    wo.redis = redis_.endpoint();
    wo.worker_name = "link-test";
    writer_ = std::make_unique<ResultWriter>(wo, &outbox_);
    BrokerLink::Options lo;
    lo.endpoint = router_.get(zmq::sockopt::last_endpoint);
    lo.hello.worker = "link-test";
    lo.hello.capacity = 8;
    lo.heartbeat_ms = 1000;
    lo.liveness = 1000;  // this broker sends no heartbeats
    lo.done_hold_us = done_hold_us_;
    link_ = std::make_unique<BrokerLink>(&context_, lo, &queue_, writer_.get(), &outbox_);
  }
  int64_t done_hold_us_ = 1000;  // set before SetUp by fixtures that need another
  void TearDown() override {
    if (started_) {
      link_->RequestDrain();
      link_->Join();
      outbox_.Close();
      writer_->Stop();
    }
  }

  void Start() {
    ASSERT_TRUE(link_->Start().ok());
    writer_->Start();
    started_ = true;
    protocol::Message ready;
    ASSERT_TRUE(Next(&ready));
    ASSERT_EQ(ready.command, "READY");
    worker_id_ = ready.envelope.at(0).to_string();
  }

  // The next message from the link that is not a HEARTBEAT, within 20 s.
  bool Next(protocol::Message* m) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      zmq_pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
      if (protocol::PollSockets(items, 1, 50) <= 0) continue;
      if (!protocol::RecvMessage(router_, /*router=*/true, m, /*dont_wait=*/true).ok()) continue;
      if (m->command != "HEARTBEAT") return true;
    }
    return false;
  }

  // Plays the executor for one batch: takes what is queued (waiting up to 20 s for it) and
  // writes the results.
  void RunBatch() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (queue_.size() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    ASSERT_GT(queue_.size(), 0u) << "no job reached the queue";
    std::vector<Job> jobs;
    ASSERT_TRUE(queue_.TakeBatch(8, &jobs));
    std::vector<JobResult> results(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      results[i].job = std::move(jobs[i]);
      results[i].job.chunk.reset();
      results[i].status = Status::Ok();
      results[i].batch_size = static_cast<int64_t>(jobs.size());
    }
    writer_->Submit(std::move(results));
  }

  // Sends `rounds` one-job CHUNKs, each after the previous job's DONE, and counts the DONE ids.
  void PingPong(const std::string& prefix, int rounds, std::map<std::string, int>* reported) {
    for (int i = 0; i < rounds; ++i) {
      const std::string id = prefix + std::to_string(i);
      ASSERT_TRUE(protocol::SendTo(router_, worker_id_, "CHUNK", Chunk(id)).ok());
      RunBatch();
      protocol::Message done;
      ASSERT_TRUE(Next(&done)) << "no DONE for " << id;
      ASSERT_EQ(done.command, "DONE");
      for (const auto& got : DoneIds(done)) ++(*reported)[got];
    }
  }

  // The ids a DONE reports.
  static std::vector<std::string> DoneIds(const protocol::Message& done) {
    msgpack::object_handle oh;
    std::vector<std::string> ids;
    EXPECT_TRUE(protocol::UnpackMap(done.body.data(), done.body.size(), &oh).ok());
    EXPECT_TRUE(protocol::GetStringArray(oh.get(), "ids", &ids).ok());
    return ids;
  }
  // The ids a DONE reports as notified.
  static std::vector<std::string> NotifiedIds(const protocol::Message& done) {
    msgpack::object_handle oh;
    std::vector<std::string> ids;
    EXPECT_TRUE(protocol::UnpackMap(done.body.data(), done.body.size(), &oh).ok());
    EXPECT_TRUE(protocol::DecodeDoneNotified(oh.get(), &ids).ok());
    return ids;
  }
  // Sends a one-job CHUNK, plays the executor for it, and waits until its result is written
  // and its DONE report is in the outbox (so that each job gets a report of its own).
  void RunOne(const std::string& id, const std::string& notify = "") {
    ASSERT_TRUE(protocol::SendTo(router_, worker_id_, "CHUNK", Chunk(id, notify)).ok());
    RunBatch();
    ASSERT_TRUE(testutil::WaitFor([&] { return writer_->pending() == 0; }));
  }

  testutil::RedisServer redis_;
  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  JobQueue queue_{64};
  Outbox outbox_{64};
  std::unique_ptr<ResultWriter> writer_;
  std::unique_ptr<BrokerLink> link_;
  std::string worker_id_;
  bool started_ = false;
};

// Attached inputs: a CHUNK's data frames reach the queued jobs in order (their tensors point
// into the frames, no copy); a job whose frame has the wrong size fails alone, and a CHUNK whose
// frames and attached tensors differ in number fails each of its jobs -- with invalid_argument
// in Redis and in DONE, so nothing the broker sent is lost.
TEST_F(BrokerLinkTest, AttachedInputsPointIntoTheChunksFramesAndBrokenOnesFail) {
  Start();
  auto entry = [](protocol::Packer& pk, const std::string& id, DType dtype,
                  std::vector<int64_t> shape) {
    msgpack::sbuffer inputs;
    protocol::Packer ipk(inputs);
    ipk.pack_array(1);
    protocol::PackAttachedTensor(ipk, dtype, shape);
    protocol::PackChunkEntry(pk, id, "tiny", std::string_view(inputs.data(), inputs.size()), 1, 0,
                             0, 0, 0);
  };
  auto chunk = [&](const std::vector<std::string>& ids) {
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(static_cast<uint32_t>(ids.size()));
    for (const auto& id : ids)
      entry(pk, id, id == "att-b" ? DType::kInt16 : DType::kFloat32, {id == "att-b" ? 2 : 4});
    return protocol::ToMessage(std::move(buf));
  };
  const std::string a(16, 'a'), c(16, 'c');
  std::vector<zmq::message_t> frames;
  frames.emplace_back(a.data(), a.size());
  frames.emplace_back("xyz", 3);  // att-b: [2] int16 needs 4 bytes
  frames.emplace_back(c.data(), c.size());
  ASSERT_TRUE(
      protocol::SendTo(router_, worker_id_, "CHUNK", chunk({"att-a", "att-b", "att-c"}), &frames)
          .ok());
  ASSERT_TRUE(testutil::WaitFor([&] { return queue_.size() == 2; })) << queue_.size();
  std::vector<Job> jobs;
  ASSERT_TRUE(queue_.TakeBatch(8, &jobs));
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].entry.id, "att-a");
  EXPECT_EQ(std::string(jobs[0].entry.inputs.at(0).data, jobs[0].entry.inputs[0].size), a);
  EXPECT_EQ(jobs[1].entry.id, "att-c");
  EXPECT_EQ(std::string(jobs[1].entry.inputs.at(0).data, jobs[1].entry.inputs[0].size), c);
  std::vector<JobResult> results(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    results[i].job = std::move(jobs[i]);
    results[i].job.chunk.reset();
    results[i].status = Status::Ok();
  }
  writer_->Submit(std::move(results));
  // One attached tensor and no frame at all: the CHUNK cannot be trusted; its job fails.
  ASSERT_TRUE(protocol::SendTo(router_, worker_id_, "CHUNK", chunk({"att-d"})).ok());

  std::map<std::string, std::string> status;  // id -> "done" or its not_done status
  while (status.size() < 4) {
    protocol::Message done;
    ASSERT_TRUE(Next(&done)) << "DONE missing; have " << status.size();
    if (done.command != "DONE") continue;
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(done.body.data(), done.body.size(), &oh).ok());
    protocol::DoneStatuses not_done;
    ASSERT_TRUE(protocol::DecodeDoneStatuses(oh.get(), &not_done).ok());
    for (const auto& id : DoneIds(done)) status[id] = "done";
    for (const auto& [id, st] : not_done) status[id] = st;
  }
  EXPECT_EQ(status["att-a"], "done");
  EXPECT_EQ(status["att-c"], "done");
  EXPECT_EQ(status["att-b"], "failed");
  EXPECT_EQ(status["att-d"], "failed");
  auto redis = redis_.Connect();
  ASSERT_NE(redis, nullptr);
  for (const char* id : {"att-b", "att-d"}) {
    std::string value;
    bool found = false;
    ASSERT_TRUE(redis->Get(std::string("ferry:result:") + id, &value, &found).ok());
    ASSERT_TRUE(found) << id;
    Result r;
    ASSERT_TRUE(protocol::DecodeResult(value.data(), value.size(), &r).ok());
    EXPECT_EQ(r.state, JobState::kFailed) << id;
    EXPECT_EQ(r.error.code(), codes::kInvalidArgument) << id;
    EXPECT_NE(r.error.message().find(id == std::string("att-b") ? "3 bytes" : "data frame"),
              std::string::npos)
        << r.error.message();
  }
}

TEST_F(BrokerLinkTest, BackToBackChunksAreAllReceivedAndReportedOnce) {
  // The next CHUNK goes out the moment a DONE arrives, while the link may still be busy with
  // the outbox: every one must be received, run and reported once.
  Start();
  std::map<std::string, int> reported;
  PingPong("burst-", 300, &reported);
  ASSERT_EQ(reported.size(), 300u);
  for (const auto& [id, n] : reported) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(link_->outstanding(), 0);
}

TEST_F(BrokerLinkTest, DrainingLinkHoldsDonesUntilBye) {
  Start();
  std::map<std::string, int> reported;
  PingPong("before-", 3, &reported);
  // Two jobs in flight, then a drain: their DONEs are held and go out just before BYE (sent
  // earlier, they would give the broker credit back mid-drain).
  ASSERT_TRUE(protocol::SendTo(router_, worker_id_, "CHUNK", Chunk("held-0")).ok());
  ASSERT_TRUE(protocol::SendTo(router_, worker_id_, "CHUNK", Chunk("held-1")).ok());
  // Both queued (the link counts a job as outstanding just before it queues it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (queue_.size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(queue_.size(), 2u);
  link_->RequestDrain();
  // The link notices the drain at its next wake-up (within 100 ms).
  ASSERT_TRUE(testutil::WaitFor([&] { return link_->draining(); }));
  RunBatch();  // both jobs, one DONE report
  protocol::Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, "DONE");
  EXPECT_EQ(DoneIds(m), (std::vector<std::string>{"held-0", "held-1"}));
  // The last DONE says "bye": the broker removes the worker with it (no credit back).
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  const msgpack::object* bye = protocol::Find(oh.get(), "bye");
  ASSERT_NE(bye, nullptr);
  EXPECT_TRUE(bye->type == msgpack::type::BOOLEAN && bye->via.boolean);
  ASSERT_TRUE(Next(&m));
  EXPECT_EQ(m.command, "BYE");
  link_->Join();
  EXPECT_EQ(link_->outstanding(), 0);
}

// DONEs of notified jobs (the producer has the notice from Redis) wait in the link and go out
// together: when a DONE that is not all notified comes (the held ones first), or when holding
// one more would pass capacity / 4 ids (8 / 4 = 2 here). The hold is long here, so that only
// those two rules can send them.
class BrokerLinkHoldTest : public BrokerLinkTest {
 protected:
  void SetUp() override {
    done_hold_us_ = 60'000'000;
    BrokerLinkTest::SetUp();
  }
};

TEST_F(BrokerLinkHoldTest, NotifiedDonesAreHeldAndSentTogetherBeforeTheNextPlainDone) {
  Start();
  const std::string channel = "ferry:notify:link-test";
  RunOne("n0", channel);
  RunOne("n1", channel);
  RunOne("p0");  // no notify: its DONE sends the held ones first
  protocol::Message first, second;
  ASSERT_TRUE(Next(&first));
  ASSERT_EQ(first.command, "DONE");
  EXPECT_EQ(DoneIds(first), (std::vector<std::string>{"n0", "n1"}));
  EXPECT_EQ(NotifiedIds(first), (std::vector<std::string>{"n0", "n1"}));
  ASSERT_TRUE(Next(&second));
  ASSERT_EQ(second.command, "DONE");
  EXPECT_EQ(DoneIds(second), std::vector<std::string>{"p0"});
  EXPECT_TRUE(NotifiedIds(second).empty());

  // The bound: two held, a third would pass it.
  RunOne("n2", channel);
  RunOne("n3", channel);
  RunOne("n4", channel);
  ASSERT_TRUE(Next(&first));
  EXPECT_EQ(DoneIds(first), (std::vector<std::string>{"n2", "n3"}));
  RunOne("p1");
  ASSERT_TRUE(Next(&second));
  EXPECT_EQ(DoneIds(second), std::vector<std::string>{"n4"});
  EXPECT_EQ(NotifiedIds(second), std::vector<std::string>{"n4"});
  ASSERT_TRUE(Next(&second));
  EXPECT_EQ(DoneIds(second), std::vector<std::string>{"p1"});
}

// With the default hold (1 ms) a held DONE goes out by itself, with nothing else happening.
TEST_F(BrokerLinkTest, HeldNotifiedDoneGoesOutWhenItsHoldEnds) {
  Start();
  RunOne("n0", "ferry:notify:link-test");
  protocol::Message done;
  ASSERT_TRUE(Next(&done));
  ASSERT_EQ(done.command, "DONE");
  EXPECT_EQ(DoneIds(done), std::vector<std::string>{"n0"});
  EXPECT_EQ(NotifiedIds(done), std::vector<std::string>{"n0"});
}

// A drain sends the held DONEs of notified jobs before BYE, however long their hold.
TEST_F(BrokerLinkHoldTest, HeldNotifiedDonesGoOutBeforeBye) {
  Start();
  RunOne("n0", "ferry:notify:link-test");
  ASSERT_TRUE(testutil::WaitFor([&] { return link_->outstanding() == 0; }));  // taken, held
  link_->RequestDrain();
  protocol::Message m;
  ASSERT_TRUE(Next(&m));
  ASSERT_EQ(m.command, "DONE");
  EXPECT_EQ(DoneIds(m), std::vector<std::string>{"n0"});
  EXPECT_EQ(NotifiedIds(m), std::vector<std::string>{"n0"});
  ASSERT_TRUE(Next(&m));
  EXPECT_EQ(m.command, "BYE");
  link_->Join();
}

// With the default hold (1 ms), held DONEs go out by themselves, each job once, and the link
// ends with nothing outstanding.
TEST_F(BrokerLinkTest, NotifiedDonesGoOutWhenDueEachJobOnce) {
  Start();
  std::map<std::string, int> reported;
  for (int i = 0; i < 50; ++i) RunOne("k" + std::to_string(i), "ferry:notify:link-test");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (reported.size() < 50 && std::chrono::steady_clock::now() < deadline) {
    protocol::Message m;
    ASSERT_TRUE(Next(&m));
    ASSERT_EQ(m.command, "DONE");
    EXPECT_EQ(NotifiedIds(m), DoneIds(m));
    for (const auto& id : DoneIds(m)) ++reported[id];
  }
  ASSERT_EQ(reported.size(), 50u);
  for (const auto& [id, n] : reported) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(link_->outstanding(), 0);
}

// The worker asks (Outbox::RequestReady, after its resident models changed): the link sends
// READY again, with what hello_fn says now.
TEST_F(BrokerLinkTest, ReannouncesWhenTheOutboxAsks) {
  Start();
  outbox_.RequestReady();
  protocol::Message m;
  ASSERT_TRUE(Next(&m));
  EXPECT_EQ(m.command, "READY");
}

}  // namespace
}  // namespace ferry::worker
