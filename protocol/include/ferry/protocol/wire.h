#pragma once
// The framing of Ferry wire protocol v1 over ZeroMQ (docs/protocol.md, "Frames").
// Every message is multipart: [routing envelope...] "FERRY1" COMMAND BODY, where BODY is one
// msgpack map. ROUTER sockets see the envelope (the peer's routing id); DEALER peers do not.
//
// These helpers catch zmq::error_t and report Status; nothing here throws.

#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/types.h"
#include "ferry/status.h"

namespace ferry::protocol {

inline constexpr std::string_view kTag = "FERRY1";

// Commands. Producer <-> broker frontend.
inline constexpr std::string_view kSubmit = "SUBMIT";
inline constexpr std::string_view kAccepted = "ACCEPTED";
inline constexpr std::string_view kError = "ERROR";
inline constexpr std::string_view kStats = "STATS";
inline constexpr std::string_view kCancel = "CANCEL";
inline constexpr std::string_view kCancelled = "CANCELLED";
inline constexpr std::string_view kFinished = "FINISHED";  // broker -> producer: results readable
inline constexpr std::string_view kLimits = "LIMITS";      // a connection's first request
// Worker <-> broker backend.
inline constexpr std::string_view kReady = "READY";            // worker announces itself
inline constexpr std::string_view kChunk = "CHUNK";            // broker -> worker: jobs to run
inline constexpr std::string_view kDone = "DONE";              // worker -> broker: results written
inline constexpr std::string_view kHeartbeat = "HEARTBEAT";    // both ways
inline constexpr std::string_view kBye = "BYE";                // worker leaves (drain)
inline constexpr std::string_view kReannounce = "REANNOUNCE";  // broker -> unknown worker
// CANCEL also goes broker -> worker, for jobs already dispatched.

// Jobs per SUBMIT and ids per CANCEL: the broker's default limit (--max-jobs-per-message); a
// bigger message is refused whole (too_large), so the clients split at this many.
inline constexpr int64_t kMaxJobsPerMessage = 10000;
// Entries of one msgpack map in a body: what the decoders take (codec.cc). DONE and FINISHED
// carry maps keyed by job id (inline results, not_done), so their senders split at this many ids.
inline constexpr size_t kMaxMapEntries = 4096;
// Bytes of inline result records in one DONE: its sender starts another DONE past this many
// (a record bigger alone goes in a DONE of its own). The broker takes messages of at least
// kMinWorkerMessageBytes from workers, whatever --max-message-bytes says for producers, so
// that a DONE (records, ids, statuses) always fits.
inline constexpr size_t kMaxDoneInlineBytes = size_t{8} << 20;
inline constexpr int64_t kMinWorkerMessageBytes = int64_t{72} << 20;

// One received message, split into its parts.
struct Message {
  std::vector<zmq::message_t> envelope;  // frames before the tag (ROUTER side only)
  std::string command;
  zmq::message_t body;  // msgpack bytes; may be empty (treated as an empty map)
  // The data frames after the body (attached tensor bytes, docs/protocol.md "Attached inputs");
  // empty for most messages. Received as ZeroMQ delivered them: no copy.
  std::vector<zmq::message_t> frames;
  // The peer's ZAP User-Id: with CURVE, the Z85 public key the broker's ZAP handler admitted
  // (see broker/src/zap_handler.h); empty without CURVE.
  std::string user_id;
};

// Receives one whole multipart message (all parts are always drained, even on error).
// Returns kMalformed when the frames do not follow the layout; `out->envelope` is still filled
// (from the first frame, for a ROUTER) so the caller can answer with ERROR.
// `router`: the socket is a ROUTER, so the first frame is the peer's routing id.
// Returns kUnavailable when nothing could be read (EAGAIN / interrupted).
Status RecvMessage(zmq::socket_t& socket, bool router, Message* out, bool dont_wait = true);

// zmq_poll for Ferry's event loops, with fewer system calls (each costs ~1 µs on a VM, and
// these loops run several times per job). zmq_poll polls every descriptor once with timeout 0,
// then asks each ZeroMQ socket for its state (ZMQ_EVENTS: one more poll(2) inside libzmq), and when
// it blocked asks every socket again. This asks each socket first and returns at once when one is
// ready; otherwise it blocks in one poll(2), then asks only the sockets whose notification fd
// fired. Differences callers must allow for: plain descriptors (`fd` items) are reported only
// when the call blocked, and it may return 0 before the timeout (a notification without a
// message). Returns the number of items with revents, or -1 with zmq_errno() set (EINTR, ETERM).
// At most 8 items.
int PollSockets(zmq_pollitem_t* items, int n, long timeout_ms);

// Attached inputs: points each attached tensor of one job at its data frame (`frames`: the
// job's `n` frames, in input order; see AttachedInJob) after checking the frame's size against
// the tensor's dtype and shape. invalid_argument naming the tensor when one does not fit.
Status MatchFrames(std::vector<TensorRef>* inputs, const zmq::message_t* frames, size_t n);

// Moves an sbuffer's bytes into a ZeroMQ message without copying.
zmq::message_t ToMessage(msgpack::sbuffer&& buffer);

// Sends [envelope...] FERRY1 command body [frames...]. `body` and the `frames` (when given)
// are handed to ZeroMQ without copying; the frames are left empty.
Status SendMessage(zmq::socket_t& socket, const std::vector<zmq::message_t>* envelope,
                   std::string_view command, zmq::message_t body,
                   std::vector<zmq::message_t>* frames = nullptr);
// Sends with a single routing-id frame (ROUTER side).
Status SendTo(zmq::socket_t& socket, std::string_view routing_id, std::string_view command,
              zmq::message_t body, std::vector<zmq::message_t>* frames = nullptr);

}  // namespace ferry::protocol
