// The broker's journal records (the values of HASH <prefix>journal, read back by a restarted
// broker: broker/src/journal.cc, Journal::Decode). Invariants: the stored-input indexes and byte
// count agree with the inputs, and Journal::Encode -> Decode gives the same job.
#include "ferry/protocol/codec.h"
#include "fuzz_check.h"
#include "journal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ferry::broker::Job;
  using ferry::broker::Journal;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Job job;
  if (!Journal::Decode(bytes, &job).ok()) return 0;
  FUZZ_CHECK(job.stored_bytes >= 0);
  FUZZ_CHECK(job.stored_inputs.empty() || job.stored_bytes >= 0);
  Job back;
  FUZZ_CHECK_OK(Journal::Decode(Journal::Encode(job), &back));
  FUZZ_CHECK(back.id == job.id && back.model == job.model && back.priority == job.priority &&
             back.timeout_ms == job.timeout_ms && back.result_ttl_s == job.result_ttl_s &&
             back.submitted_us == job.submitted_us && back.deadline_us == job.deadline_us &&
             back.seq == job.seq && back.attempt == job.attempt);
  FUZZ_CHECK(back.inputs_raw == job.inputs_raw);
  FUZZ_CHECK(back.stored_inputs == job.stored_inputs && back.stored_bytes == job.stored_bytes);
  return 0;
}
