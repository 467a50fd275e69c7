// Redis locked down as docs/security.md says, end to end: a real redis-server with a TLS port only
// (client certificates required; certificates made here by openssl) and the ACL users of
// deploy/redis/users.acl (this test fills in the password hashes of a copy). The broker runs as
// ferry-broker, the worker as ferry-worker, the C++ SDK as ferry-producer, every password from
// --redis-password-file / redis_password_file. The whole job path goes through it -- small
// results with the worker's notices (EVAL: SET + PUBLISH), big inputs by claim check (producer
// SET, worker GET and DEL), big results read with GET and deleted with DEL, cancellation (the
// broker's SET of the final result and its DEL of the inputs; the worker's), a rejected job (the
// producer's DEL), a broker killed and restarted (its journal read back with HSCAN and EXISTS) --
// so a command the ACL leaves out fails a job here. Then each user's limits are checked on raw
// connections, and the ways of getting in wrong: a wrong password stops the broker and the worker
// (exit 1, a message naming Redis and the user, never the password) and fails the SDK's Redis reads
// with `unavailable`; a server certificate from another CA stops the broker.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "process.h"
#include "tiny_reference.h"
#include "tls_certs.h"

namespace ferry {
namespace {

using client::CancelReport;
using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Process;
using testutil::ReadFile;
using testutil::WaitFor;

// Passwords distinct enough that a leak is found by a plain substring search.
constexpr char kBrokerPassword[] = "broker-pw-5d0c2a91";
constexpr char kWorkerPassword[] = "worker-pw-77e1b0c3";
constexpr char kProducerPassword[] = "producer-pw-0a9f3e6b";
constexpr char kAdminPassword[] = "admin-pw-41c8d2f7";
constexpr char kWrongPassword[] = "not-the-pw-913b7c55";

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The command line of a running process, as `ps` shows it.
std::string CommandLine(pid_t pid) {
  std::string text = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : text)
    if (c == '\0') c = ' ';
  return text;
}

using testutil::TinyExpected;
using testutil::TinyInput;

Job TinyJob(uint32_t seed) {
  Job j;
  j.model = "tiny";
  j.inputs.push_back(Tensor::From<float>(TinyInput(seed), {8}, DType::kFloat32));
  return j;
}

Job SlowJob(const std::string& id, float spins) {
  Job j;
  j.id = id;
  j.model = "slow";
  j.inputs.push_back(Tensor::From<float>({spins}, {1}, DType::kFloat32));
  return j;
}

// One Redis with a TLS port only and deploy/redis/users.acl, shared by the tests of this file.
class RedisSecurity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testutil::TempDir();
    const std::string& d = dir_->path();
    certs_ = new testutil::TestCertificates(testutil::MakeTestCertificates(d));
    // The shipped ACL with its three placeholders filled in, plus an administrator for the
    // test's own checks (the default user stays off).
    testutil::WriteAclFile(
        d + "/users.acl", testutil::DeployAclText(),
        {{"BROKER_PASSWORD_SHA256", kBrokerPassword},
         {"WORKER_PASSWORD_SHA256", kWorkerPassword},
         {"PRODUCER_PASSWORD_SHA256", kProducerPassword}},
        "user ferry-admin on >" + std::string(kAdminPassword) + " ~* &* +@all\n");
    testutil::WriteSecretFile(d + "/broker.pw", std::string(kBrokerPassword) + "\n");
    testutil::WriteSecretFile(d + "/worker.pw", std::string(kWorkerPassword) + "\n");
    testutil::WriteSecretFile(d + "/producer.pw", std::string(kProducerPassword) + "\n");
    testutil::WriteSecretFile(d + "/wrong.pw", std::string(kWrongPassword) + "\n");
    testutil::RedisServer::Options o;
    o.acl_file = d + "/users.acl";
    o.tls = true;  // port 0, tls-port only
    o.tls_cert = certs_->server_cert;
    o.tls_key = certs_->server_key;
    o.tls_ca = certs_->ca;
    o.tls_auth_clients = true;
    o.user = "ferry-admin";
    o.password = kAdminPassword;
    o.client_cert = certs_->client_cert;
    o.client_key = certs_->client_key;
    redis_ = new testutil::RedisServer(o);
  }
  static void TearDownTestSuite() {
    delete redis_;
    delete certs_;
    delete dir_;
  }
  void SetUp() override {
    auto admin = redis_->Connect();
    ASSERT_NE(admin, nullptr);
    protocol::RedisReply r;
    ASSERT_TRUE(admin->Command({"FLUSHALL"}, &r).ok());
    ASSERT_TRUE(admin->Command({"ACL", "LOG", "RESET"}, &r).ok());
  }

  static std::string Url(const std::string& user) {
    return "rediss://" + user + "@127.0.0.1:" + std::to_string(redis_->port());
  }
  static std::string PasswordFile(const std::string& role) {
    return dir_->path() + "/" + role + ".pw";
  }
  // --redis URL --redis-password-file FILE --redis-tls-ca/cert/key, for `user`.
  static std::vector<std::string> RedisArgs(const std::string& user, const std::string& pw_file,
                                            const std::string& ca = "") {
    return {"--redis",
            Url(user),
            "--redis-password-file",
            pw_file,
            "--redis-tls-ca",
            ca.empty() ? certs_->ca : ca,
            "--redis-tls-cert",
            certs_->client_cert,
            "--redis-tls-key",
            certs_->client_key};
  }
  // Broker and worker serve /metrics, so that their Redis probes (PING, INFO memory) run too.
  std::unique_ptr<Process> StartBroker(const std::string& pw_file, int frontend, int backend,
                                       const std::string& log, const std::string& ca = "") {
    std::vector<std::string> argv = {testutil::BrokerBin(),
                                     "--frontend",
                                     "tcp://127.0.0.1:" + std::to_string(frontend),
                                     "--backend",
                                     "tcp://127.0.0.1:" + std::to_string(backend),
                                     "--metrics-port",
                                     std::to_string(testutil::FreePort())};
    for (auto& a : RedisArgs("ferry-broker", pw_file, ca)) argv.push_back(a);
    return std::make_unique<Process>(argv, dir_->path() + "/" + log);
  }
  std::unique_ptr<Process> StartWorker(const std::string& pw_file, int backend,
                                       const std::string& log) {
    std::vector<std::string> argv = {testutil::WorkerBin(),
                                     "--broker",
                                     "tcp://127.0.0.1:" + std::to_string(backend),
                                     "--max-batch",
                                     "1",
                                     "--instances",
                                     "1",
                                     "--threads",
                                     "1",
                                     "--metrics-port",
                                     std::to_string(testutil::FreePort())};
    for (const char* m : {"tiny", "head", "expand", "slow"})
      argv.push_back("--model"), argv.push_back(std::string(m) + "=" + testutil::ModelPath(m));
    for (auto& a : RedisArgs("ferry-worker", pw_file)) argv.push_back(a);
    return std::make_unique<Process>(argv, dir_->path() + "/" + log);
  }
  static ClientOptions ProducerOptions(int frontend, const std::string& pw_file) {
    ClientOptions o;
    o.frontend = "tcp://127.0.0.1:" + std::to_string(frontend);
    o.redis = Url("ferry-producer");
    o.redis_password_file = pw_file;
    o.redis_tls_ca = certs_->ca;
    o.redis_tls_cert = certs_->client_cert;
    o.redis_tls_key = certs_->client_key;
    o.request_timeout_ms = 10000;
    return o;
  }
  // A raw connection as `user` (TLS, the client certificate).
  static std::unique_ptr<protocol::RedisClient> ConnectAs(const std::string& user,
                                                          const std::string& password) {
    protocol::RedisEndpoint ep = redis_->endpoint();
    ep.user = user;
    ep.password = password;
    std::unique_ptr<protocol::RedisClient> c;
    const Status s = protocol::RedisClient::Connect(ep, 5000, &c);
    EXPECT_TRUE(s.ok()) << user << ": " << s.ToString();
    return c;
  }
  static std::vector<std::string> Keys(const std::string& pattern) {
    std::vector<std::string> out;
    auto admin = redis_->Connect();
    protocol::RedisReply r;
    if (admin && admin->Command({"KEYS", pattern}, &r).ok())
      for (const auto& e : r.elements) out.push_back(e.str);
    return out;
  }
  static int64_t JournalLength() {
    auto admin = redis_->Connect();
    protocol::RedisReply r;
    if (!admin || !admin->Command({"HLEN", "ferry:journal"}, &r).ok()) return -1;
    return r.integer;
  }

  static testutil::TempDir* dir_;
  static testutil::TestCertificates* certs_;
  static testutil::RedisServer* redis_;
};
testutil::TempDir* RedisSecurity::dir_ = nullptr;
testutil::TestCertificates* RedisSecurity::certs_ = nullptr;
testutil::RedisServer* RedisSecurity::redis_ = nullptr;

TEST_F(RedisSecurity, TheWholeJobPathRunsAsLeastPrivilegeUsersOverTls) {
  const int frontend = testutil::FreePort(), backend = testutil::FreePort();
  auto broker = StartBroker(PasswordFile("broker"), frontend, backend, "broker.log");
  auto worker = StartWorker(PasswordFile("worker"), backend, "worker.log");
  auto logs = [&] { return "--- broker\n" + broker->Log() + "--- worker\n" + worker->Log(); };
  ASSERT_TRUE(WaitFor(
      [&] { return testutil::CountWorkers("tcp://127.0.0.1:" + std::to_string(frontend)) == 1; },
      std::chrono::seconds(60)))
      << logs();
  // Secrets never on a command line.
  for (Process* p : {broker.get(), worker.get()}) {
    const std::string cmdline = CommandLine(p->pid());
    EXPECT_TRUE(Contains(cmdline, "--redis-password-file")) << cmdline;
    for (const char* pw : {kBrokerPassword, kWorkerPassword}) EXPECT_FALSE(Contains(cmdline, pw));
  }

  // Small results, read as they are written: the worker's notices (EVAL of SET + PUBLISH) on the
  // producer's subscription (SUBSCRIBE), and the broker's FINISHED.
  ClientOptions po = ProducerOptions(frontend, PasswordFile("producer"));
  po.consume_results = true;  // what Wait reads from Redis (GET), it then deletes (DEL)
  std::unique_ptr<Client> producer;
  ASSERT_TRUE(Client::Create(po, &producer).ok());
  for (uint32_t i = 0; i < 6; ++i) {
    Result r;
    std::string id;
    const Status s = producer->Run(TinyJob(i), 60000, &r, &id);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString() << "\n" << logs();
    const std::vector<float> got = r.outputs.at(0).As<float>(), want = TinyExpected(TinyInput(i));
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-4) << i << "," << j;
  }
  // Results the producer polls for (not inline: read from Redis, GET).
  {
    std::vector<SubmitOutcome> out;
    std::vector<Job> jobs = {TinyJob(10), TinyJob(11)};
    ASSERT_TRUE(producer->SubmitMany(jobs, &out).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(out[i].status.ok()) << out[i].status.ToString();
      Result r;
      ASSERT_TRUE(WaitFor([&] {
        return producer->Poll(out[i].id, &r).ok() && r.state == JobState::kDone;
      })) << logs();
      EXPECT_NEAR(r.outputs.at(0).As<float>().at(3), TinyExpected(TinyInput(10 + i))[3], 1e-4);
    }
  }

  // Big inputs by claim check (>= stored_input_bytes, 64 KiB): the producer SETs them, the
  // worker GETs them and DELs them with the result.
  for (uint32_t i = 0; i < 3; ++i) {
    std::vector<float> pcm(32768);
    for (size_t k = 0; k < pcm.size(); ++k) pcm[k] = static_cast<float>((k * 7 + i) % 1000);
    Job j;
    j.model = "head";
    j.inputs.push_back(Tensor::From<float>(pcm, {32768}, DType::kFloat32));  // 128 KiB
    Result r;
    const Status s = producer->Run(j, 60000, &r);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString() << "\n" << logs();
    const std::vector<float> head = r.outputs.at(0).As<float>();
    ASSERT_EQ(head.size(), 4u);
    for (size_t k = 0; k < 4; ++k) EXPECT_EQ(head[k], pcm[k]);
  }
  // A rejected job's stored inputs are deleted by the producer (DEL).
  {
    Job j;
    j.model = "no-such-model";
    j.inputs.push_back(
        Tensor::From<float>(std::vector<float>(32768, 1.0f), {32768}, DType::kFloat32));
    Result r;
    EXPECT_EQ(producer->Run(j, 10000, &r).code(), codes::kUnknownModel);
  }
  EXPECT_TRUE(WaitFor([&] { return Keys("ferry:input:*").empty(); })) << "input keys left";

  // Big results (960 KB, not inline): read from Redis (GET), and deleted right after (DEL).
  for (uint32_t i = 0; i < 2; ++i) {
    std::vector<float> x(16);
    for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k + i);
    Job j;
    j.model = "expand";
    j.inputs.push_back(Tensor::From<float>(x, {16}, DType::kFloat32));
    Result r;
    std::string id;
    const Status s = producer->Run(j, 60000, &r, &id);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString() << "\n" << logs();
    const std::vector<float> y = r.outputs.at(0).As<float>();
    ASSERT_EQ(y.size(), 240000u);
    EXPECT_EQ(y[0], x[0]);
    EXPECT_EQ(y[239999], x[15]);
    EXPECT_TRUE(Keys("ferry:result:" + id).empty()) << "the result was not deleted after its read";
  }

  // Cancellation, every input stored in Redis (stored_input_bytes 1): the worker holds A and B
  // (its credit is 2), C and D wait in the broker. Cancelling C and D: the broker SETs their
  // final results and DELs their inputs; cancelling B: the worker drops it before its batch
  // starts and writes its result and DELs its input.
  ClientOptions co = ProducerOptions(frontend, PasswordFile("producer"));
  co.stored_input_bytes = 1;
  co.push_results = false;
  std::unique_ptr<Client> canceller;
  ASSERT_TRUE(Client::Create(co, &canceller).ok());
  const std::vector<Job> slow = {SlowJob("sec-a", 1500), SlowJob("sec-b", 1500),
                                 SlowJob("sec-c", 5), SlowJob("sec-d", 5)};
  std::vector<SubmitOutcome> out;
  ASSERT_TRUE(canceller->SubmitMany(slow, &out).ok());
  for (const auto& o : out) ASSERT_TRUE(o.status.ok()) << o.id << ": " << o.status.ToString();
  CancelReport report;
  ASSERT_TRUE(canceller->CancelMany({"sec-b", "sec-c", "sec-d"}, &report).ok());
  const std::set<std::string> cancelled(report.cancelled.begin(), report.cancelled.end());
  EXPECT_EQ(cancelled.count("sec-c") + cancelled.count("sec-d"), 2u)
      << "C and D were not queued in the broker; the test did not reach its path";
  // The broker dies with A and B on the worker; restarted, it reads its journal back (HSCAN;
  // EXISTS for jobs whose result is there) and the fleet carries on.
  broker->Signal(SIGKILL);
  broker->Wait();
  broker = StartBroker(PasswordFile("broker"), frontend, backend, "broker2.log");
  for (const char* id : {"sec-a", "sec-b", "sec-c", "sec-d"}) {
    Result r;
    Status s;
    for (int tries = 0; tries < 6; ++tries) {  // unavailable while the broker restarts
      s = canceller->Wait(id, 60000, &r);
      if (s.code() != codes::kUnavailable) break;
    }
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString() << "\n" << logs();
    if (std::string(id) == "sec-a")
      EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
    else if (std::string(id) != "sec-b")
      EXPECT_EQ(r.state, JobState::kCancelled) << id << ": " << r.error.ToString();
    else
      EXPECT_TRUE(r.state == JobState::kCancelled || r.state == JobState::kDone);
  }
  EXPECT_TRUE(WaitFor([&] { return Keys("ferry:input:*").empty(); }))
      << "input keys left after cancellation\n"
      << logs();
  EXPECT_TRUE(WaitFor([&] { return JournalLength() == 0; })) << "journal not emptied\n" << logs();

  // No Redis refusal anywhere: every command the fleet sent was allowed. Redis's ACL log holds
  // each command, key or channel it denied (and each failed AUTH), whoever sent it.
  const std::string all = logs() + ReadFile(dir_->path() + "/broker.log");
  EXPECT_FALSE(Contains(all, "NOPERM")) << all;
  {
    auto admin = redis_->Connect();
    ASSERT_NE(admin, nullptr);
    protocol::RedisReply log;
    ASSERT_TRUE(admin->Command({"ACL", "LOG"}, &log).ok());
    std::string denied;
    for (const auto& entry : log.elements)  // [key, value, key, value, ...]
      for (size_t i = 0; i + 1 < entry.elements.size(); i += 2)
        if (entry.elements[i].str == "reason" || entry.elements[i].str == "object" ||
            entry.elements[i].str == "username")
          denied += entry.elements[i].str + "=" + entry.elements[i + 1].str + " ";
    EXPECT_TRUE(log.elements.empty()) << "Redis denied: " << denied;
  }
  for (const char* pw : {kBrokerPassword, kWorkerPassword, kProducerPassword})
    EXPECT_FALSE(Contains(all, pw)) << "a password in a log";
  broker->Signal(SIGTERM);
  worker->Signal(SIGTERM);
  EXPECT_EQ(worker->Wait(std::chrono::seconds(30)), 0) << logs();
  EXPECT_EQ(broker->Wait(std::chrono::seconds(30)), 0) << logs();
}

// What each user may not do, on raw connections.
TEST_F(RedisSecurity, EachUserIsHeldToItsOwnCommandsAndKeys) {
  auto admin = redis_->Connect();
  ASSERT_NE(admin, nullptr);
  protocol::RedisReply r;
  ASSERT_TRUE(admin->Command({"HSET", "ferry:journal", "job-1", "record"}, &r).ok());
  ASSERT_TRUE(admin->Command({"SET", "ferry:result:real", "record"}, &r).ok());
  ASSERT_TRUE(admin->Command({"SET", "ferry:input:job-1:0", "bytes"}, &r).ok());

  auto refused = [](protocol::RedisClient* c, const std::vector<std::string_view>& argv) {
    protocol::RedisReply reply;
    const Status s = c->Command(argv, &reply);
    // NOPERM; inside a script: "The user executing the script can't access ..." (Redis 7),
    // "ACL failure in script: ..." (Valkey 9).
    return !s.ok() &&
           (Contains(s.message(), "NOPERM") || Contains(s.message(), "user executing the script") ||
            Contains(s.message(), "ACL failure in script"));
  };
  auto allowed = [](protocol::RedisClient* c, const std::vector<std::string_view>& argv) {
    protocol::RedisReply reply;
    return c->Command(argv, &reply).ok();
  };

  auto producer = ConnectAs("ferry-producer", kProducerPassword);
  ASSERT_NE(producer, nullptr);
  // No forged results, no reading or changing the journal, no forged notices.
  EXPECT_TRUE(refused(producer.get(), {"SET", "ferry:result:x", "forged"}));
  EXPECT_TRUE(refused(producer.get(), {"SET", "ferry:result:x", "forged", "EX", "60", "NX"}));
  // Deleting a result is allowed (consume_results), as GETDEL allowed it before.
  EXPECT_TRUE(allowed(producer.get(), {"DEL", "ferry:result:consumed"}));
  EXPECT_TRUE(refused(producer.get(), {"HGETALL", "ferry:journal"}));
  EXPECT_TRUE(refused(producer.get(), {"HSCAN", "ferry:journal", "0"}));
  EXPECT_TRUE(refused(producer.get(), {"HGET", "ferry:journal", "job-1"}));
  EXPECT_TRUE(refused(producer.get(), {"HDEL", "ferry:journal", "job-1"}));
  EXPECT_TRUE(refused(producer.get(), {"PUBLISH", "ferry:notify:someone", "forged"}));
  EXPECT_TRUE(refused(producer.get(), {"EVAL", "return 1", "1", "ferry:result:x"}));
  EXPECT_TRUE(refused(producer.get(), {"GET", "ferry:input:job-1:0"}));  // others' inputs
  EXPECT_TRUE(refused(producer.get(), {"KEYS", "*"}));
  EXPECT_TRUE(refused(producer.get(), {"FLUSHALL"}));
  EXPECT_TRUE(refused(producer.get(), {"CONFIG", "GET", "*"}));
  EXPECT_TRUE(refused(producer.get(), {"SET", "other:key", "v"}));
  // What it needs.
  EXPECT_TRUE(allowed(producer.get(), {"SET", "ferry:input:p:0", "bytes", "EX", "60"}));
  // The Python client's run() renews its inputs' expiry when it resubmits after silence.
  EXPECT_TRUE(allowed(producer.get(), {"EXPIRE", "ferry:input:p:0", "60"}));
  EXPECT_TRUE(refused(producer.get(), {"EXPIRE", "ferry:result:real", "1"}));
  EXPECT_TRUE(allowed(producer.get(), {"DEL", "ferry:input:p:0"}));
  EXPECT_TRUE(allowed(producer.get(), {"GET", "ferry:result:real"}));

  auto worker = ConnectAs("ferry-worker", kWorkerPassword);
  ASSERT_NE(worker, nullptr);
  EXPECT_TRUE(refused(worker.get(), {"HGETALL", "ferry:journal"}));
  EXPECT_TRUE(refused(worker.get(), {"HSCAN", "ferry:journal", "0"}));
  EXPECT_TRUE(refused(worker.get(), {"GET", "ferry:result:real"}));  // others' results
  EXPECT_TRUE(refused(worker.get(), {"DEL", "ferry:result:real"}));
  EXPECT_TRUE(refused(worker.get(), {"SMEMBERS", "ferry:models"}));
  EXPECT_TRUE(refused(worker.get(), {"SET", "ferry:input:job-1:0", "changed"}));
  EXPECT_TRUE(
      refused(worker.get(), {"EVAL", "return redis.call('GET', KEYS[1])", "1", "ferry:journal"}));
  // A script runs with the worker's rights: it cannot read a result either.
  EXPECT_TRUE(refused(worker.get(),
                      {"EVAL", "return redis.call('GET', KEYS[1])", "1", "ferry:result:real"}));
  EXPECT_TRUE(allowed(worker.get(), {"GET", "ferry:input:job-1:0"}));

  auto broker = ConnectAs("ferry-broker", kBrokerPassword);
  ASSERT_NE(broker, nullptr);
  EXPECT_TRUE(refused(broker.get(), {"GET", "ferry:input:job-1:0"}));  // never reads inputs
  EXPECT_TRUE(refused(broker.get(), {"GET", "ferry:result:real"}));
  EXPECT_TRUE(refused(broker.get(), {"FLUSHALL"}));
  EXPECT_TRUE(refused(broker.get(), {"PUBLISH", "ferry:notify:someone", "forged"}));
  EXPECT_TRUE(allowed(broker.get(), {"HSCAN", "ferry:journal", "0"}));
  EXPECT_TRUE(allowed(broker.get(), {"INFO", "memory"}));  // the /metrics memory gauges
  EXPECT_TRUE(refused(worker.get(), {"INFO", "memory"}));
  EXPECT_TRUE(refused(producer.get(), {"PING"}));

  // The default user is off: no password, no entry.
  protocol::RedisEndpoint anonymous = redis_->endpoint();
  anonymous.user.clear();
  anonymous.password.clear();
  bool turned_away = false;
  EXPECT_FALSE(protocol::CheckRedisAccess(anonymous, 5000, &turned_away).ok());
  EXPECT_TRUE(turned_away);
}

TEST_F(RedisSecurity, AWrongPasswordStopsTheBrokerAndTheWorkerAtStart) {
  const int frontend = testutil::FreePort(), backend = testutil::FreePort();
  auto broker = StartBroker(PasswordFile("wrong"), frontend, backend, "broker-wrong.log");
  EXPECT_EQ(broker->Wait(std::chrono::seconds(30)), 1) << broker->Log();
  auto worker = StartWorker(PasswordFile("wrong"), backend, "worker-wrong.log");
  EXPECT_EQ(worker->Wait(std::chrono::seconds(30)), 1) << worker->Log();
  for (auto [log, user] : {std::pair{broker->Log(), "\"ferry-broker\""},
                           std::pair{worker->Log(), "\"ferry-worker\""}}) {
    EXPECT_TRUE(Contains(log, "redis 127.0.0.1:" + std::to_string(redis_->port()))) << log;
    EXPECT_TRUE(Contains(log, "refused the credentials of user " + std::string(user))) << log;
    EXPECT_FALSE(Contains(log, kWrongPassword)) << log;
  }
}

TEST_F(RedisSecurity, AWrongPasswordMakesTheSdksRedisReadsUnavailable) {
  ClientOptions o = ProducerOptions(testutil::FreePort(), PasswordFile("wrong"));
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(o, &c).ok());  // Create does not connect
  Result r;
  const Status s = c->Poll("some-job", &r);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "\"ferry-producer\"")) << s.message();
  EXPECT_FALSE(Contains(s.message(), kWrongPassword)) << s.message();
  EXPECT_EQ(c->Wait("some-job", 300, &r).code(), codes::kUnavailable);
}

TEST_F(RedisSecurity, AServerCertificateFromAnotherCaStopsTheBroker) {
  const int frontend = testutil::FreePort(), backend = testutil::FreePort();
  auto broker =
      StartBroker(PasswordFile("broker"), frontend, backend, "broker-ca.log", certs_->other_ca);
  EXPECT_EQ(broker->Wait(std::chrono::seconds(30)), 1) << broker->Log();
  const std::string log = broker->Log();
  EXPECT_TRUE(Contains(log, "certificate did not verify")) << log;
  EXPECT_TRUE(Contains(log, "--redis-tls-ca " + certs_->other_ca)) << log;
}

}  // namespace
}  // namespace ferry
