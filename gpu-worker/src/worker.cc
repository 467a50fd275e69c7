#include "ferry/worker/worker.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>
#include <zmq.hpp>

#include "broker_link.h"
#include "executor.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/redis_probe.h"
#include "ferry/metrics/registry.h"
#include "ferry/protocol/hello_check.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"
#include "input_fetcher.h"
#include "job_queue.h"
#include "model_registry.h"
#include "outbox.h"
#include "result_writer.h"
#include "worker_metrics.h"

namespace ferry::worker {

class Worker::Impl {
 public:
  Impl(WorkerOptions options, std::unique_ptr<ModelRegistry> registry);
  ~Impl();
  Status Run();
  void RequestStop();
  int metrics_port() const;
  // What READY says now: every model, the resident ones, capacity, identity.
  protocol::WorkerHello Hello() const;

  const WorkerOptions options_;

 private:
  // Has the I/O thread re-announce (READY) after the resident set changed.
  void AnnounceResidency();

  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<metrics::Registry> metrics_registry_;
  std::unique_ptr<WorkerMetrics> metrics_;
  // With metrics: ferry_redis_up and /readyz; before the server, which calls it.
  std::unique_ptr<metrics::RedisProbe> redis_probe_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;  // started by Run with a port
  JobQueue queue_;
  Outbox outbox_;  // the result writer and AnnounceResidency -> the I/O thread
  zmq::context_t context_;

  std::mutex mu_;  // guards link_ against RequestStop during Run's start-up and shutdown
  std::atomic<bool> stop_requested_{false};
  std::unique_ptr<ResultWriter> writer_;
  std::unique_ptr<InputFetcher> fetcher_;  // stored inputs, Redis -> queue_
  std::unique_ptr<BrokerLink> link_;
  std::vector<std::unique_ptr<Executor>> executors_;
};

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;
Status Worker::Run() { return impl_->Run(); }
void Worker::RequestStop() { impl_->RequestStop(); }
const WorkerOptions& Worker::options() const { return impl_->options_; }
int Worker::metrics_port() const { return impl_->metrics_port(); }

namespace {

// What this worker's READY says, with `resident` the models loaded now.
protocol::WorkerHello MakeHello(const WorkerOptions& options, std::vector<std::string> resident) {
  protocol::WorkerHello hello;
  hello.worker = options.name;
  hello.device = options.device;
  hello.host = protocol::HostName();
  hello.pid = getpid();
  hello.capacity = options.capacity();
  hello.heartbeat_ms = options.heartbeat_ms;
  hello.redis_prefix = options.redis_prefix;
  for (const ModelConfig& m : options.models)
    hello.models.push_back({m.name, m.max_batch, m.inputs});  // inputs: nullopt when undeclared
  hello.resident = std::move(resident);
  return hello;
}

}  // namespace

Status Worker::Create(WorkerOptions options, std::unique_ptr<Worker>* out) {
  // Before the models load (minutes, for big ones): a wrong password, CA or database stops the
  // worker now. A Redis that is down does not; the result writer retries.
  protocol::RedisEndpoint redis;
  FERRY_RETURN_IF_ERROR(protocol::ResolveRedisEndpoint(options.redis, options.redis_files, &redis));
  bool refused = false;
  const Status access = protocol::CheckRedisAccess(redis, 2000, &refused);
  if (!access.ok() && refused) return access;
  if (access.ok())
    spdlog::info("redis {} (user {}{})", redis.Describe(), redis.UserName(),
                 redis.tls ? ", TLS" : "");
  else
    spdlog::warn("redis {}: {}; results wait until it answers", redis.Describe(), access.message());
  SetTorchThreads(static_cast<int>(options.threads));
  ResolveModelDefaults(&options);
  // A READY the broker refuses (ERROR) would leave this worker idle for good: said now.
  if (Status s = protocol::CheckHello(MakeHello(options, {})); !s.ok()) {
    const bool capacity = s.message().find("capacity") != std::string::npos;
    return Status::InvalidArgument(
        "the broker would refuse the READY of worker " + options.name.substr(0, 200) + ": " +
        s.message() +
        (capacity ? " (the worker's capacity is the largest max batch x (--instances + 1))" : ""));
  }
  ModelRegistry::Options ropts;
  ropts.memory_budget = options.memory_budget;
  auto registry = std::make_unique<ModelRegistry>(ropts, options.models);
  const int64_t start = protocol::MonotonicMicros();
  FERRY_RETURN_IF_ERROR(registry->LoadEager());
  const auto resident = registry->Resident();
  spdlog::info("{} of {} model(s) loaded and warm in {} ms; the rest load on first use",
               resident.size(), options.models.size(),
               (protocol::MonotonicMicros() - start) / 1000);
  out->reset(new Worker(std::make_unique<Impl>(std::move(options), std::move(registry))));
  return Status::Ok();
}

Worker::Impl::Impl(WorkerOptions options, std::unique_ptr<ModelRegistry> registry)
    : options_(std::move(options)),
      registry_(std::move(registry)),
      metrics_registry_(std::make_unique<metrics::Registry>()),
      metrics_(std::make_unique<WorkerMetrics>(metrics_registry_.get(), options_, registry_.get())),
      queue_(static_cast<size_t>(options_.capacity())),
      outbox_(static_cast<size_t>(options_.capacity()) + 16),
      context_(1) {}

int Worker::Impl::metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

Worker::Impl::~Impl() {
  // Normally Run() has already drained and joined everything; this is the error path.
  queue_.Close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    link_.reset();
  }
  executors_.clear();
  registry_->SetListener(nullptr);
  fetcher_.reset();
  outbox_.Close();
  writer_.reset();
  metrics_server_.reset();
}

protocol::WorkerHello Worker::Impl::Hello() const {
  return MakeHello(options_, registry_->Resident());
}

void Worker::Impl::AnnounceResidency() {
  std::string names;
  for (const auto& n : registry_->Resident()) names += (names.empty() ? "" : ",") + n;
  spdlog::info("worker {}: resident models now [{}]; re-announcing", options_.name, names);
  outbox_.RequestReady();  // the I/O thread sends READY with Hello(): the current residency
}

void Worker::Impl::RequestStop() {
  stop_requested_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (link_) link_->RequestDrain();
}

Status Worker::Impl::Run() {
  protocol::RedisEndpoint redis;
  FERRY_RETURN_IF_ERROR(
      protocol::ResolveRedisEndpoint(options_.redis, options_.redis_files, &redis));
  FERRY_RETURN_IF_ERROR(outbox_.Init());

  if (options_.metrics_port != 0 && !metrics_server_) {
    metrics::MetricsServerOptions mo;
    mo.port =
        options_.metrics_port < 0 ? metrics::kAnyPort : static_cast<int>(options_.metrics_port);
    mo.bind_address = options_.metrics_addr;
    WorkerMetrics* m = metrics_.get();
    metrics::Registry* reg = metrics_registry_.get();
    mo.before_scrape = [m, reg] {  // thread-safe reads: registry, allocator, /proc/self
      m->Sample();
      metrics::names::SampleProcessMetrics(reg);
    };
    // /healthz: Redis answers. /readyz: also the broker was heard from within heartbeat_ms *
    // liveness and took this worker's READY (the models were loaded by Create).
    metrics::RedisProbe::Options po;
    po.endpoint = redis;
    redis_probe_ = std::make_unique<metrics::RedisProbe>(reg, std::move(po));
    metrics::RedisProbe* probe = redis_probe_.get();
    mo.depends = [probe](std::string* why) { return probe->Up(why); };
    mo.ready = [this](std::string* why) {
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t last = link_ ? link_->last_broker_message_us() : 0;
      const int64_t silent_us = protocol::NowMicros() - last;
      if (last == 0 || silent_us > link_->SilenceMicros()) {
        *why = "broker " + options_.broker +
               (last == 0 ? " not heard from yet"
                          : " silent for " + std::to_string(silent_us / 1000) + " ms");
        return false;
      }
      // A refused worker still hears from the broker (its answers to each re-announce).
      if (std::string refusal = link_->refusal(); !refusal.empty()) {
        *why = "broker " + options_.broker + " refused this worker: " + refusal;
        return false;
      }
      return true;
    };
    Status s = metrics::MetricsServer::Start(metrics_registry_.get(), mo, &metrics_server_);
    if (!s.ok())
      return Status(s.code(), "--metrics-addr " + options_.metrics_addr + " --metrics-port " +
                                  std::to_string(options_.metrics_port) + ": " + s.message());
    spdlog::info("worker {}: metrics on http://{}:{}/metrics", options_.name, options_.metrics_addr,
                 metrics_server_->port());
  }

  ResultWriter::Options wopts;
  wopts.redis = redis;
  wopts.prefix = options_.redis_prefix;
  wopts.default_ttl_s = options_.result_ttl_s;
  wopts.inline_result_bytes = static_cast<size_t>(options_.inline_result_bytes);
  wopts.worker_name = options_.name;
  wopts.metrics = metrics_.get();

  InputFetcher::Options fopts;
  fopts.redis = redis;
  fopts.prefix = options_.redis_prefix;

  BrokerLink::Options lopts;
  lopts.endpoint = options_.broker;
  lopts.curve_server_public = options_.curve_server_public;
  lopts.curve_secret = options_.curve_secret;
  lopts.heartbeat_ms = options_.heartbeat_ms;
  lopts.liveness = options_.liveness;
  lopts.hello = Hello();
  lopts.hello_fn = [this] { return Hello(); };

  {
    std::lock_guard<std::mutex> lock(mu_);
    writer_ = std::make_unique<ResultWriter>(wopts, &outbox_);
    fetcher_ = std::make_unique<InputFetcher>(fopts, &queue_, writer_.get());
    link_ = std::make_unique<BrokerLink>(&context_, lopts, &queue_, writer_.get(), &outbox_,
                                         fetcher_.get());
    FERRY_RETURN_IF_ERROR(link_->Start());
    if (stop_requested_.load()) link_->RequestDrain();
  }
  registry_->SetListener([this] { AnnounceResidency(); });
  writer_->Start();
  fetcher_->Start();
  for (int64_t i = 0; i < options_.instances; ++i) {
    Executor::Options eopts;
    eopts.index = static_cast<int>(i);
    eopts.device = options_.device;
    eopts.threads = static_cast<int>(options_.threads);
    eopts.flush_denormals = options_.flush_denormals;
    eopts.default_max_batch = static_cast<size_t>(options_.max_batch);
    eopts.worker = options_.name;
    eopts.metrics = metrics_.get();
    executors_.push_back(
        std::make_unique<Executor>(eopts, registry_.get(), &queue_, writer_.get()));
    executors_.back()->Start();
  }
  spdlog::info(
      "worker {} running on {}: {} executor(s) x {} torch thread(s){}, {} model(s), "
      "{} resident, capacity {}, memory budget {}",
      options_.name, options_.device, options_.instances, options_.threads,
      options_.flush_denormals ? " flushing denormals" : "", options_.models.size(),
      registry_->Resident().size(), options_.capacity(),
      options_.memory_budget > 0 ? std::to_string(options_.memory_budget) + " bytes"
                                 : std::string("unlimited"));

  link_->Join();  // returns once drained and BYE is sent
  queue_.Close();
  for (auto& e : executors_) e->Join();
  registry_->SetListener(nullptr);
  fetcher_->Stop();  // drained with the link: nothing waits there any more
  outbox_.Close();   // nobody takes reports any more
  writer_->Stop();
  spdlog::info("worker {} stopped", options_.name);
  return Status::Ok();
}

}  // namespace ferry::worker
