#pragma once
// A job as the broker holds it from ACCEPTED until its final result is in Redis.

#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace ferry::broker {

// kParked: restored from the journal within a liveness period of its deadline; not dispatched,
// so that a worker still running it can claim it (READY "held") before it expires (scheduler.h).
enum class JobPhase { kQueued, kParked, kDispatched };

struct Job {
  std::string id;
  std::string model;
  int64_t priority = 0;
  int64_t timeout_ms = 0;    // 0 = no deadline
  int64_t result_ttl_s = 0;  // 0 = the broker's default
  int64_t attempt = 1;       // 1 for the first dispatch; +1 per requeue after a worker loss
  int64_t submitted_us = 0;  // wall clock, when accepted
  int64_t deadline_us = 0;   // wall clock by which it must start (submitted + timeout); 0 = none
  int64_t seq = 0;           // acceptance order (FIFO within a priority)
  std::string inputs_raw;    // the msgpack "inputs" array, forwarded to workers as is
  // Inputs the producer stored in Redis (Keys::Input(id, index)): their indexes and bytes. The
  // broker never touches those bytes; whoever writes the final result deletes them.
  std::vector<int32_t> stored_inputs;
  int64_t stored_bytes = 0;
  // Attached inputs (docs/protocol.md "Attached inputs"): the data frames the SUBMIT carried,
  // in input order, held as received and handed to every CHUNK of the job by reference
  // (ZeroMQ shares a frame's buffer between copies): the broker never copies those bytes.
  std::vector<zmq::message_t> frames;
  int64_t attached_bytes = 0;
  std::string producer;  // routing id of the producer connection (for FINISHED notices)
  std::string owner;     // with CURVE: the submitting connection's public key (who may CANCEL it)
  bool inline_result = false;  // the producer asked for small results inside FINISHED
  std::string notify;          // the producer's Pub/Sub channel for result notices from the worker
                               // ("" = none); not journaled: after a broker restart, FINISHED only
  JobPhase phase = JobPhase::kQueued;
  std::string worker;  // routing id of the worker holding it, when dispatched
};

}  // namespace ferry::broker
