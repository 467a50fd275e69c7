#pragma once
// The metric names Ferry exposes, their help texts, label names and bucket layouts: the one
// place the broker, the worker, `ferry top`, the Grafana dashboard (deploy/grafana) and the KEDA
// trigger (deploy/kubernetes) agree on. docs/operations.md lists them all; change both together.
//
// Conventions (Prometheus): ferry_ prefix; counters end in _total; durations in seconds
// (_seconds); sizes in bytes (_bytes). Label names are the kLabel* constants.

#include <string>
#include <vector>

namespace ferry::metrics {
class Registry;

namespace names {

// ---- label names -----------------------------------------------------------------------------
inline constexpr const char* kLabelModel = "model";  // model name as the worker announced it
inline constexpr const char* kLabelCode = "code";    // rejection code: unknown_model, duplicate ...
inline constexpr const char* kLabelStatus = "status";  // final state: done, failed, poisoned, ...
inline constexpr const char* kLabelWorker = "worker";  // worker name (host:pid:device by default)
inline constexpr const char* kLabelDevice = "device";  // cpu, cuda:0, ...
inline constexpr const char* kLabelHost = "host";
inline constexpr const char* kLabelExecutor = "executor";    // executor thread index, "0", "1", ...
inline constexpr const char* kLabelComponent = "component";  // broker, worker
inline constexpr const char* kLabelVersion = "version";

// ---- broker: queues --------------------------------------------------------------------------
// gauge {model}: jobs queued, not yet dispatched. The KEDA trigger scales workers on its sum.
inline constexpr const char* kQueueDepth = "ferry_queue_depth";
inline constexpr const char* kQueueDepthHelp = "Jobs queued for the model, not yet dispatched.";
// gauge {model}: age of the oldest queued job (0 when the queue is empty).
inline constexpr const char* kQueueOldestAge = "ferry_queue_oldest_age_seconds";
inline constexpr const char* kQueueOldestAgeHelp = "Age of the oldest queued job of the model.";
// gauge: jobs accepted and not finished (queued or running).
inline constexpr const char* kJobsPending = "ferry_jobs_pending";
inline constexpr const char* kJobsPendingHelp = "Jobs accepted and not yet finished.";

// ---- broker: job counts ----------------------------------------------------------------------
// counter {model}
inline constexpr const char* kJobsAccepted = "ferry_jobs_accepted_total";
inline constexpr const char* kJobsAcceptedHelp = "Jobs accepted by the broker.";
// counter {code}: invalid_argument, unknown_model, duplicate, too_large, queue_full, unavailable
inline constexpr const char* kJobsRejected = "ferry_jobs_rejected_total";
inline constexpr const char* kJobsRejectedHelp = "Jobs rejected by the broker, by code.";
// counter {model, status}: done, failed, cancelled, expired, poisoned
inline constexpr const char* kJobsFinished = "ferry_jobs_finished_total";
inline constexpr const char* kJobsFinishedHelp = "Jobs with a final result, by status.";
// counter {model}: jobs put back in their queue because their worker died or left.
inline constexpr const char* kJobsRequeued = "ferry_jobs_requeued_total";
inline constexpr const char* kJobsRequeuedHelp = "Jobs requeued after their worker was lost.";
// counter {model}: jobs sent to workers (a requeued job counts again).
inline constexpr const char* kJobsDispatched = "ferry_jobs_dispatched_total";
inline constexpr const char* kJobsDispatchedHelp = "Jobs dispatched to workers.";
// counter: CHUNK messages sent to workers.
inline constexpr const char* kChunksDispatched = "ferry_chunks_dispatched_total";
inline constexpr const char* kChunksDispatchedHelp = "Chunks (groups of jobs) sent to workers.";
// counter: duplicates that did not run or were not stored twice (a DONE for a job no longer
// pending on the broker; a result SET NX that found one already there on the worker).
inline constexpr const char* kDuplicatesSuppressed = "ferry_duplicates_suppressed_total";
inline constexpr const char* kDuplicatesSuppressedHelp =
    "Duplicate completions or results that were ignored.";
inline constexpr const char* kMessagesRefused = "ferry_broker_messages_refused_total";
inline constexpr const char* kMessagesRefusedHelp =
    "Messages the broker refused: a producer's request answered with ERROR, a message from a "
    "key no longer allowed, or a worker's message it drops (a DONE for jobs it does not hold, a "
    "READY with bad fields).";
inline constexpr const char* kRepliesDropped = "ferry_broker_replies_dropped_total";
inline constexpr const char* kRepliesDroppedHelp =
    "Replies and notices to producers dropped: the producer was gone or had too many unread.";
inline constexpr const char* kInlineResultsWithheld = "ferry_broker_inline_results_withheld_total";
inline constexpr const char* kInlineResultsWithheldHelp =
    "Results sent as ids only in FINISHED, not inline, because their producer connection had "
    "--max-inline-backlog-bytes of inline results unread.";

// ---- latency histograms {model} (seconds; LatencyBuckets) --------------------------------------
// broker: accepted -> DONE received (the result is in Redis by then).
inline constexpr const char* kJobLatency = "ferry_job_latency_seconds";
inline constexpr const char* kJobLatencyHelp =
    "End-to-end time from acceptance to the result being stored.";
// broker: accepted -> first dispatched.
inline constexpr const char* kJobQueueTime = "ferry_job_queue_seconds";
inline constexpr const char* kJobQueueTimeHelp = "Time jobs waited in the broker's queue.";
// worker: the forward pass of the batch the job ran in (one observation per job).
inline constexpr const char* kJobComputeTime = "ferry_job_compute_seconds";
inline constexpr const char* kJobComputeTimeHelp =
    "Model compute time of the batch each job ran in.";
// worker {model} (BatchSizeBuckets): jobs per forward call.
inline constexpr const char* kBatchSize = "ferry_batch_size";
inline constexpr const char* kBatchSizeHelp = "Jobs per model forward call.";

// ---- broker: workers -------------------------------------------------------------------------
inline constexpr const char* kWorkersConnected = "ferry_workers_connected";
inline constexpr const char* kWorkersConnectedHelp = "Workers registered with the broker.";
// gauge {model}: connected workers that serve the model (0: its jobs wait, and fail after
// --orphan-timeout-s).
inline constexpr const char* kModelWorkers = "ferry_model_workers";
inline constexpr const char* kModelWorkersHelp = "Connected workers serving the model.";
// gauges {worker}: free credit (jobs the worker will still take) and jobs in flight.
inline constexpr const char* kWorkerCredit = "ferry_worker_credit";
inline constexpr const char* kWorkerCreditHelp = "Jobs the worker can still take.";
inline constexpr const char* kWorkerInFlight = "ferry_worker_in_flight";
inline constexpr const char* kWorkerInFlightHelp = "Jobs dispatched to the worker, not done.";

// ---- worker (each worker process exposes these about itself) ----------------------------------
// gauge {worker, device, host} = 1: identifies the process; join on `worker`.
inline constexpr const char* kWorkerInfo = "ferry_worker_info";
inline constexpr const char* kWorkerInfoHelp = "Always 1; labels describe the worker.";
// gauge {model} = 1 for each model loaded on the device; and their count.
inline constexpr const char* kModelResident = "ferry_model_resident";
inline constexpr const char* kModelResidentHelp = "1 for each model loaded by this worker.";
inline constexpr const char* kModelsResident = "ferry_worker_models_resident";
inline constexpr const char* kModelsResidentHelp = "Models loaded by this worker.";
// gauges {device}: bytes allocated on the device (CUDA caching allocator) and the budget.
inline constexpr const char* kDeviceMemoryUsed = "ferry_device_memory_used_bytes";
inline constexpr const char* kDeviceMemoryUsedHelp = "Device memory allocated by this worker.";
inline constexpr const char* kDeviceMemoryBudget = "ferry_device_memory_budget_bytes";
inline constexpr const char* kDeviceMemoryBudgetHelp = "Device memory this worker may use.";
// counter {executor}: seconds executors spent running batches. rate() / executors = busy ratio.
inline constexpr const char* kExecutorBusy = "ferry_executor_busy_seconds_total";
inline constexpr const char* kExecutorBusyHelp = "Seconds executor threads spent running batches.";
// gauge: executor threads of this worker (the denominator of the busy ratio).
inline constexpr const char* kExecutors = "ferry_worker_executors";
inline constexpr const char* kExecutorsHelp = "Executor threads of this worker.";
// counter {model}: batches run (forward calls).
inline constexpr const char* kBatches = "ferry_batches_total";
inline constexpr const char* kBatchesHelp = "Batches (model forward calls) run by this worker.";
// counter {model, status}: jobs the worker finished, by status (done, failed).
inline constexpr const char* kWorkerJobs = "ferry_worker_jobs_total";
inline constexpr const char* kWorkerJobsHelp = "Jobs finished by this worker, by status.";
// counter: Redis write failures of the result writer (each retried).
inline constexpr const char* kResultWriteErrors = "ferry_result_write_errors_total";
inline constexpr const char* kResultWriteErrorsHelp = "Failed result writes to Redis (retried).";

// ---- both ---------------------------------------------------------------------------------------
// gauge {component, version} = 1; and the process start time (unix seconds).
inline constexpr const char* kBuildInfo = "ferry_build_info";
inline constexpr const char* kBuildInfoHelp = "Always 1; labels give the component and version.";
inline constexpr const char* kProcessStartTime = "process_start_time_seconds";
inline constexpr const char* kProcessStartTimeHelp = "Start time of the process, unix seconds.";

// gauge: 1 when Redis answered the last probe (every 2 s, metrics/redis_probe.h), else 0.
inline constexpr const char* kRedisUp = "ferry_redis_up";
inline constexpr const char* kRedisUpHelp = "1 when Redis answered the last probe, else 0.";
// gauges (broker): Redis's INFO memory used_memory and maxmemory (0: no limit).
inline constexpr const char* kRedisUsedMemory = "ferry_redis_used_memory_bytes";
inline constexpr const char* kRedisUsedMemoryHelp = "Redis used_memory (INFO memory), bytes.";
inline constexpr const char* kRedisMaxMemory = "ferry_redis_maxmemory_bytes";
inline constexpr const char* kRedisMaxMemoryHelp = "Redis maxmemory (0: no limit), bytes.";
// The standard process metrics of Prometheus client libraries, read from /proc/self at each
// scrape (SampleProcessMetrics, from the MetricsServer before_scrape hooks).
inline constexpr const char* kProcessCpu = "process_cpu_seconds_total";
inline constexpr const char* kProcessCpuHelp = "User and system CPU time spent, seconds.";
inline constexpr const char* kProcessRss = "process_resident_memory_bytes";
inline constexpr const char* kProcessRssHelp = "Resident memory size, bytes.";
inline constexpr const char* kProcessOpenFds = "process_open_fds";
inline constexpr const char* kProcessOpenFdsHelp = "Open file descriptors.";
inline constexpr const char* kProcessMaxFds = "process_max_fds";
inline constexpr const char* kProcessMaxFdsHelp = "Limit of open file descriptors.";

// Bucket bounds. Latency: 0.5 ms .. 60 s. Batch size: powers of two 1 .. 1024.
const std::vector<double>& LatencyBuckets();
const std::vector<double>& BatchSizeBuckets();

// Registers ferry_build_info{component, version} = 1 and process_start_time_seconds (now).
void RegisterProcessInfo(Registry* registry, const std::string& component,
                         const std::string& version);

// Sets process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds and
// process_max_fds from /proc/self (Linux). The broker and the worker call it before each
// /metrics render (MetricsServerOptions::before_scrape). Thread-safe.
void SampleProcessMetrics(Registry* registry);

// Suggested --metrics-port values (the flag's default is 0 = disabled), used by the deploy/
// files: the broker on 9450; the worker on GPU i on kWorkerMetricsPortBase + i (9460, 9461, ...;
// in Kubernetes every worker pod uses 9460). `ferry up --metrics-port-base B` uses B and B+1+i.
inline constexpr int kBrokerMetricsPort = 9450;
inline constexpr int kWorkerMetricsPortBase = 9460;

}  // namespace names
}  // namespace ferry::metrics
