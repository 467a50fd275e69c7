// What an error reply means for a write: retried (it goes away by itself) or final, and which
// replies are ACL refusals -- as Redis 6.2, 7.0 and Valkey 9 word them, in a script or not. The
// texts are the servers' own, as redis-server 7.0.15 and valkey-server 9.1.2 answered them here,
// but for Redis 6.2's wrapped form (from its source: no 6.2 server here).
#include "ferry/protocol/redis_errors.h"

#include <gtest/gtest.h>

namespace ferry::protocol {
namespace {

TEST(RedisErrors, TransientCodesAreRetriedWhereverTheServerPutsThem) {
  EXPECT_TRUE(IsTransientRedisError("LOADING Redis is loading the dataset in memory"));
  EXPECT_TRUE(IsTransientRedisError("READONLY You can't write against a read only replica."));
  // Redis 7: the code of an error inside a script stays in front.
  EXPECT_TRUE(
      IsTransientRedisError("OOM command not allowed when used memory > 'maxmemory'. script: "
                            "13b22c8fd38581f2fc2871324f1588688ba75bcf, on @user_script:1."));
  // Redis 6.2 wraps it.
  EXPECT_TRUE(IsTransientRedisError(
      "ERR Error running script (call to f_13b22c8fd38581f2fc2871324f1588688ba75bcf): "
      "@user_script:1: -OOM command not allowed when used memory > 'maxmemory'."));
  EXPECT_TRUE(IsTransientRedisError(
      "ERR Error running script (call to f_0123): @user_script:1: -READONLY You can't write "
      "against a read only replica."));
}

TEST(RedisErrors, OtherErrorsAreFinal) {
  EXPECT_FALSE(IsTransientRedisError("ERR invalid expire time in 'set' command"));
  EXPECT_FALSE(
      IsTransientRedisError("WRONGTYPE Operation against a key holding the wrong kind of value"));
  EXPECT_FALSE(
      IsTransientRedisError("NOPERM this user has no permissions to run the 'get' command"));
  // A code's name inside other words, or a script error without one, is not the code.
  EXPECT_FALSE(IsTransientRedisError("ERR value refused: BUSY is not the reason"));
  EXPECT_FALSE(IsTransientRedisError("BUSYGROUP Consumer Group name already exists"));
  EXPECT_FALSE(IsTransientRedisError(
      "ERR Error running script (call to f_0123): @user_script:1: -BUSYGROUP Consumer Group "
      "name already exists"));
  EXPECT_FALSE(IsTransientRedisError(
      "ERR Error running script (call to f_0123): @user_script:1: attempt to compare nil "
      "with number (OOM)"));
  EXPECT_FALSE(IsTransientRedisError(""));
}

TEST(RedisErrors, AclRefusalsAreKnownInAScriptToo) {
  EXPECT_TRUE(IsAclRefusal("NOPERM this user has no permissions to access one of the channels"));
  // The notice script on redis-server 7.0.15: a user without the PUBLISH command, then one
  // with it but on no channel.
  EXPECT_TRUE(
      IsAclRefusal("ERR The user executing the script can't run this command or subcommand script: "
                   "bbafd2b1a91deb815210bf22d9554351db06a514, on @user_script:1."));
  EXPECT_TRUE(IsAclRefusal(
      "ERR The user executing the script can't publish to the channel mentioned in the command "
      "script: bbafd2b1a91deb815210bf22d9554351db06a514, on @user_script:1."));
  // The second on valkey-server 9.1.2.
  EXPECT_TRUE(IsAclRefusal(
      "ERR ACL failure in script: No permissions to access a channel script: on @user_script:1."));
  EXPECT_FALSE(IsAclRefusal("ERR unknown command 'EVAL'"));
  EXPECT_FALSE(IsAclRefusal("OOM command not allowed when used memory > 'maxmemory'."));
}

}  // namespace
}  // namespace ferry::protocol
