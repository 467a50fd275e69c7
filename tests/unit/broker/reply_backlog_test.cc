// ReplyBacklog (broker/src/reply_backlog.h) with real ZeroMQ sockets: a tracked reply's bytes
// count until ZeroMQ frees it, per producer; Fits draws the line for inline records at the
// inline limit, Admits for any reply at that plus kOtherRepliesBytes.
#include "reply_backlog.h"

#include <gtest/gtest.h>

#include <string>
#include <zmq.hpp>

namespace ferry::broker {
namespace {

zmq::message_t Body(const std::string& s) { return zmq::message_t(s.data(), s.size()); }

TEST(ReplyBacklog, TrackedBytesCountUntilZeroMqFreesTheMessage) {
  zmq::context_t ctx(1);
  zmq::socket_t out(ctx, zmq::socket_type::pair), in(ctx, zmq::socket_type::pair);
  in.bind("inproc://backlog");
  out.connect("inproc://backlog");
  ReplyBacklog backlog(100);
  const std::string small = "tiny body", big(5000, 'x');  // one inside the message, one not
  ASSERT_TRUE(out.send(backlog.Track("p1", Body(small), 40), zmq::send_flags::none));
  ASSERT_TRUE(out.send(backlog.Track("p1", Body(big), 50), zmq::send_flags::none));
  ASSERT_TRUE(out.send(backlog.Track("p2", Body(small), 7), zmq::send_flags::none));
  EXPECT_EQ(backlog.queued("p1"), 90);  // queued in ZeroMQ, not read yet
  EXPECT_EQ(backlog.queued("p2"), 7);
  EXPECT_TRUE(backlog.Fits("p1", 10));
  EXPECT_FALSE(backlog.Fits("p1", 11));
  EXPECT_TRUE(backlog.Fits("p3", 100));
  EXPECT_FALSE(backlog.Fits("p3", 101));

  {
    zmq::message_t m;
    ASSERT_TRUE(in.recv(m));
    EXPECT_EQ(m.to_string(), small);      // the bytes survive the wrapping
    EXPECT_EQ(backlog.queued("p1"), 90);  // still held, by the reader now
  }
  EXPECT_EQ(backlog.queued("p1"), 50);
  {
    zmq::message_t m;
    ASSERT_TRUE(in.recv(m));
    EXPECT_EQ(m.to_string(), big);
  }
  EXPECT_EQ(backlog.queued("p1"), 0);
  EXPECT_TRUE(backlog.Fits("p1", 100));
  // A message dropped unsent frees its bytes too.
  { zmq::message_t dropped = backlog.Track("p1", Body(big), 60); }
  EXPECT_EQ(backlog.queued("p1"), 0);
  // A body with no bytes to count is not counted.
  zmq::message_t plain = backlog.Track("p1", Body(small), 0);
  EXPECT_EQ(plain.to_string(), small);
  EXPECT_EQ(backlog.queued("p1"), 0);
  EXPECT_EQ(backlog.queued("p2"), 7);
}

TEST(ReplyBacklog, PastTheInlineLimitRepliesStillGoUntilTheRoomForOthersIsTaken) {
  ReplyBacklog backlog(100);
  const int64_t all = 100 + ReplyBacklog::kOtherRepliesBytes;
  zmq::message_t held = backlog.Track("p1", Body("an ACCEPTED"), 150);
  EXPECT_FALSE(backlog.Fits("p1", 1));           // no inline record now
  EXPECT_TRUE(backlog.Admits("p1", all - 150));  // an ids-only notice, an ACCEPTED: yes
  EXPECT_FALSE(backlog.Admits("p1", all - 149));
  EXPECT_TRUE(backlog.Admits("p2", all));
  EXPECT_FALSE(backlog.Admits("p2", all + 1));
  { zmq::message_t gone = std::move(held); }  // written out
  EXPECT_TRUE(backlog.Fits("p1", 100));
}

TEST(ReplyBacklog, ConnectionsWithNothingQueuedAreForgottenAndStillCountLater) {
  ReplyBacklog backlog(10);
  zmq::message_t held = backlog.Track("keep", Body("x"), 10);
  for (int i = 0; i < 200; ++i) backlog.Track("gone-" + std::to_string(i), Body("y"), 5);
  EXPECT_LT(backlog.connections(), 100u);  // 201 came; the idle ones are forgotten as they go
  EXPECT_GT(backlog.connections(), 0u);
  EXPECT_EQ(backlog.queued("keep"), 10);  // pruning keeps a connection with bytes queued
  EXPECT_FALSE(backlog.Fits("keep", 1));
  EXPECT_EQ(backlog.queued("gone-3"), 0);
  EXPECT_TRUE(backlog.Fits("gone-3", 10));
}

}  // namespace
}  // namespace ferry::broker
