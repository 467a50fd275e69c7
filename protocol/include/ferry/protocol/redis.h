#pragma once
// RedisClient: a small synchronous Redis connection with pipelining, over plain TCP or TLS
// (rediss://), authenticated with AUTH (and on its database, SELECT) at every (re)connection;
// hiredis parses the replies. Failures come in two channels -- the transport (connection,
// TLS, AUTH) and error replies; both are checked here and nowhere else. A transport failure
// drops the connection and the next call reconnects, so callers just retry with backoff.
//
// Thread-safety: none; one client per thread (or guard it with a mutex).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/protocol/util.h"
#include "ferry/status.h"

namespace ferry::protocol {

class RedisConnection;  // src/redis_transport.h

struct RedisReply {
  enum class Type { kNil, kString, kInteger, kArray, kStatus, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;
};

class RedisClient {
 public:
  // Connects (TLS, AUTH and SELECT as the endpoint says). Fails with kUnavailable when Redis
  // cannot be reached or refuses this client (the message says which: credentials, TLS, db).
  static Status Connect(const RedisEndpoint& endpoint, int timeout_ms,
                        std::unique_ptr<RedisClient>* out);
  // Makes a client that connects on first use (and reconnects after failures), for processes
  // that must start while Redis is down.
  static std::unique_ptr<RedisClient> Lazy(const RedisEndpoint& endpoint, int timeout_ms);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Queues a command for the next Flush: the arguments are copied once, straight into the
  // pipeline's wire form (RESP), which Flush writes from there. An empty `argv` is ignored
  // (Redis would not answer it).
  void Append(const std::vector<std::string_view>& argv);
  // Like Append, except that arguments of at least kByRefBytes are not copied: Flush sends them
  // from where they are (writev), so they must stay alive and unchanged until Flush returns.
  // For big values (job inputs, result records): no copy and no big allocation in this process.
  static constexpr size_t kByRefBytes = 16 * 1024;
  void AppendByRef(const std::vector<std::string_view>& argv);
  size_t pending() const { return pending_; }
  // False before the first connect and after a transport failure dropped the connection (the
  // next command connects again).
  bool connected() const { return conn_ != nullptr; }
  // How many connections this client has opened: a change means the last one broke and another
  // was opened (perhaps to a Redis that restarted meanwhile).
  int64_t connects() const { return connects_; }
  // For a connection that waits for no reply: true when it has something to read -- the peer
  // closed it (Redis stopped or restarted), since Redis sends nothing unasked -- and then drops
  // it (the next command connects again). One poll(2), no blocking.
  bool DroppedByPeer();
  // Bounds each later connect, read and write (and those of the open connection) by
  // `timeout_ms` (> 0) instead of the one given at Connect: for a caller with a deadline of its
  // own (a Wait), so that a stalled Redis holds it no longer than that.
  void SetTimeout(int timeout_ms);
  // Connects if not connected (at first, or again after a failure), as Flush does first: for a
  // caller that must know whether a failed Flush can have sent anything.
  Status EnsureConnected();
  // Sends every appended command in one round trip and reads all replies in order. Error replies
  // come back as RedisReply::Type::kError (the first also fails the Status when `replies` is
  // null: kUnavailable for one that goes away by itself, LOADING, BUSY, OOM, ...:
  // IsTransientRedisError; else kInternal). Transport failures return kUnavailable; when the
  // connection broke while the replies were read, `replies` holds the ones read before it (the
  // first commands').
  Status Flush(std::vector<RedisReply>* replies);

  // One command, one round trip; an error reply becomes a failed Status (as in Flush).
  Status Command(const std::vector<std::string_view>& argv, RedisReply* reply);
  // GET (through GetMany): `found` false when the key does not exist.
  Status Get(std::string_view key, std::string* value, bool* found);
  // One GET per key, pipelined in one round trip, each value read from the socket straight
  // into its string (one copy, by the kernel -- or by OpenSSL's decryption under TLS: for big
  // values, no staging buffer and no extra copy). (*values)[i] is keys[i]'s value; nullopt when the
  // key does not exist. An error reply fails the call, as in Flush (WRONGTYPE: internal; LOADING:
  // unavailable), after every reply is read: the connection stays usable; transport failures
  // with unavailable.
  // `consume`: GETDEL instead of GET -- each key is deleted as it is read (Redis >= 6.2).
  Status GetMany(const std::vector<std::string_view>& keys,
                 std::vector<std::optional<std::string>>* values, bool consume = false);
  // The same, each value read into memory the caller gives instead of a string (which would
  // be zero-filled first: for a 960 KB value that costs half as much as reading it):
  // `into(i, size)` returns where keys[i]'s `size` bytes go, or null to have them skipped (read
  // from the socket through a small buffer and dropped: a value the caller cannot use costs no
  // memory); it is not called for a key that does not exist or whose reply is an error.
  // (*found)[i]: whether keys[i] existed (also when its value was skipped). With `errors`,
  // (*errors)[i] is keys[i]'s error reply (e.g. "WRONGTYPE ..."; empty: none) and error replies
  // do not fail the call; without, the first fails it (as in Flush). Either way every reply is
  // read: the connection stays in step. Transport failures: unavailable (and the connection is
  // dropped, the next call reconnects). An exception from `into` fails the call with internal.
  using Destination = std::function<char*(size_t index, size_t size)>;
  Status GetManyInto(const std::vector<std::string_view>& keys, const Destination& into,
                     std::vector<bool>* found, bool consume = false,
                     std::vector<std::string>* errors = nullptr);

 private:
  explicit RedisClient(const RedisEndpoint& endpoint, int timeout_ms);
  void Drop();

  RedisEndpoint endpoint_;
  int timeout_ms_;
  std::unique_ptr<RedisConnection> conn_;  // null until connected, and after a failure
  // Writes the queued commands straight to the connection, the by-reference arguments between
  // the bytes of queued_ (a gather write on plain TCP).
  Status WriteQueued(const std::string& commands,
                     const std::vector<std::pair<size_t, std::string_view>>& refs);
  void AppendCommand(const std::vector<std::string_view>& argv, bool by_ref);

  int64_t connects_ = 0;
  size_t pending_ = 0;
  std::string queued_;  // the pending_ commands, RESP-encoded back to back
  // By-reference arguments: (offset in queued_ where their bytes belong, the bytes).
  std::vector<std::pair<size_t, std::string_view>> refs_;
};

// RedisSubscriber: one connection in Pub/Sub mode, subscribed to one channel, read without
// blocking by a thread that polls fd() (e.g. beside ZeroMQ sockets in zmq_poll). Used by the
// producer SDK for result notices that workers PUBLISH.
//
// Thread-safety: none; one thread at a time.
class RedisSubscriber {
 public:
  // Connects, SUBSCRIBEs and waits for the confirmation: once this returns, every message
  // published to `channel` is delivered. kUnavailable when Redis cannot be reached.
  static Status Connect(const RedisEndpoint& endpoint, int timeout_ms, const std::string& channel,
                        std::unique_ptr<RedisSubscriber>* out);
  ~RedisSubscriber();
  RedisSubscriber(const RedisSubscriber&) = delete;
  RedisSubscriber& operator=(const RedisSubscriber&) = delete;

  // The socket to poll for reading.
  int fd() const;
  // Reads what the socket holds now (one read on plain TCP; with TLS, until nothing is left
  // inside OpenSSL either, which poll() could not see; call when fd() is readable) and calls
  // on_message with each complete message's payload (valid during the call only). kUnavailable
  // when the connection closed or failed: the subscriber is then unusable.
  Status ReadAvailable(const std::function<void(std::string_view payload)>& on_message);

 private:
  explicit RedisSubscriber(std::unique_ptr<RedisConnection> conn);
  std::unique_ptr<RedisConnection> conn_;
};

// For a process's start (ferry-broker, ferry-worker, ferry-bench): connects once -- TCP, TLS,
// AUTH, SELECT, and a PING when no password is given -- so that a wrong password, user, CA,
// certificate or database stops the process at once with a clear message instead of failing
// every write later. Returns ok when Redis let this client in. On failure *refused says whether
// Redis (or its TLS) turned this client away -- no retry cures that: exit -- or could not be
// reached at all (or did not answer in time), which a process that reconnects may ride out.
Status CheckRedisAccess(const RedisEndpoint& endpoint, int timeout_ms, bool* refused);

}  // namespace ferry::protocol
