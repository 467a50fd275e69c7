#include "ferry/runtime/redis_flags.h"

#include <filesystem>

namespace ferry::runtime {

void AddRedisAccessFlags(FlagSet* flags, protocol::RedisAccessFiles* files) {
  flags->String("redis-password-file", &files->password_file,
                "read the Redis password from this file (one line) instead of the URL");
  flags->String("redis-tls-ca", &files->tls_ca,
                "CA certificates (PEM) that verify Redis's certificate (rediss://; default: the "
                "system's)");
  flags->String("redis-tls-cert", &files->tls_cert,
                "client certificate (PEM) for Redis's tls-auth-clients (rediss://)");
  flags->String("redis-tls-key", &files->tls_key, "the private key (PEM) of --redis-tls-cert");
}

std::vector<std::string> RedisAccessArgs(const protocol::RedisAccessFiles& files) {
  std::vector<std::string> args;
  auto add = [&](const char* flag, const std::string& path) {
    if (path.empty()) return;
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(path, ec);
    args.push_back(flag);
    args.push_back(ec ? path : abs.string());
  };
  add("--redis-password-file", files.password_file);
  add("--redis-tls-ca", files.tls_ca);
  add("--redis-tls-cert", files.tls_cert);
  add("--redis-tls-key", files.tls_key);
  return args;
}

}  // namespace ferry::runtime
