#include "ferry/worker/worker.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>

#include "ferry/protocol/util.h"

namespace ferry::worker {

Status Worker::Create(WorkerOptions options, std::unique_ptr<Worker>* out) {
  SetTorchThreads(static_cast<int>(options.threads));
  ModelMap models;
  for (const ModelSpec& spec : options.models) {
    const int64_t start = protocol::MonotonicMicros();
    std::unique_ptr<Model> model;
    FERRY_RETURN_IF_ERROR(Model::Create(spec.name, spec.path, options.device, &model));
    spdlog::info("model {} loaded from {} on {} in {} ms", spec.name, spec.path, options.device,
                 (protocol::MonotonicMicros() - start) / 1000);
    models.emplace(spec.name, std::move(model));
  }
  out->reset(new Worker(std::move(options), std::move(models)));
  return Status::Ok();
}

Worker::Worker(WorkerOptions options, ModelMap models)
    : options_(std::move(options)),
      models_(std::move(models)),
      queue_(static_cast<size_t>(options_.capacity())),
      context_(1) {}

Worker::~Worker() {
  // Normally Run() has already drained and joined everything; this is the error path.
  queue_.Close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    link_.reset();
  }
  executors_.clear();
  writer_.reset();
}

void Worker::RequestStop() {
  stop_requested_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (link_) link_->RequestDrain();
}

Status Worker::Run() {
  protocol::RedisEndpoint redis;
  FERRY_RETURN_IF_ERROR(protocol::ParseRedisUrl(options_.redis, &redis));
  const std::string outbox = "inproc://ferry-worker-outbox-" +
                             std::to_string(reinterpret_cast<uintptr_t>(this));

  ResultWriter::Options wopts;
  wopts.redis = redis;
  wopts.prefix = options_.redis_prefix;
  wopts.default_ttl_s = options_.result_ttl_s;
  wopts.worker_name = options_.name;
  wopts.outbox_address = outbox;

  BrokerLink::Options lopts;
  lopts.endpoint = options_.broker;
  lopts.heartbeat_ms = options_.heartbeat_ms;
  lopts.outbox_address = outbox;
  lopts.hello.worker = options_.name;
  lopts.hello.device = options_.device;
  lopts.hello.host = protocol::HostName();
  lopts.hello.pid = getpid();
  lopts.hello.capacity = options_.capacity();
  for (const auto& [name, model] : models_)
    lopts.hello.models.push_back({name, options_.max_batch});

  {
    std::lock_guard<std::mutex> lock(mu_);
    writer_ = std::make_unique<ResultWriter>(&context_, wopts);
    link_ = std::make_unique<BrokerLink>(&context_, lopts, &queue_, writer_.get());
    FERRY_RETURN_IF_ERROR(link_->Start());  // binds the outbox before the writer connects
    if (stop_requested_.load()) link_->RequestDrain();
  }
  writer_->Start();
  for (int64_t i = 0; i < options_.instances; ++i) {
    executors_.push_back(std::make_unique<Executor>(static_cast<int>(i),
                                                    static_cast<size_t>(options_.max_batch),
                                                    &models_, &queue_, writer_.get()));
    executors_.back()->Start();
  }
  spdlog::info("worker {} running on {}: {} executor(s) x {} torch thread(s), max batch {}",
               options_.name, options_.device, options_.instances, options_.threads,
               options_.max_batch);

  link_->Join();  // returns once drained and BYE is sent
  queue_.Close();
  for (auto& e : executors_) e->Join();
  writer_->Stop();
  spdlog::info("worker {} stopped", options_.name);
  return Status::Ok();
}

}  // namespace ferry::worker
