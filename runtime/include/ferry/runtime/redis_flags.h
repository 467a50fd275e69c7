#pragma once
// The Redis access flags every Ferry binary takes beside --redis URL, registered in one place so
// that they read the same everywhere (docs/operations.md, docs/security.md):
//   --redis-password-file FILE   the password (keeps it out of argv and `ps`)
//   --redis-tls-ca FILE          CA certificates (PEM) that verify Redis's (rediss:// only)
//   --redis-tls-cert FILE        client certificate (PEM), for Redis's tls-auth-clients
//   --redis-tls-key FILE         its private key (PEM)
// protocol::ResolveRedisEndpoint(url, files, &endpoint) then reads and checks them.

#include <string>
#include <vector>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/runtime/flags.h"

namespace ferry::runtime {

// `files` must outlive flags->Parse.
void AddRedisAccessFlags(FlagSet* flags, protocol::RedisAccessFiles* files);

// The same flags again, for a child process given `files` (only those that are set; paths
// made absolute).
std::vector<std::string> RedisAccessArgs(const protocol::RedisAccessFiles& files);

}  // namespace ferry::runtime
