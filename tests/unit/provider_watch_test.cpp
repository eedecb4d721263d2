// What a program says when a provider call crashes (common/provider_watch.hpp): inside a marked
// call, the call and the provider's limit; anywhere else, a defect of ours. Either way the
// signal still ends the program, as a supervisor expects of a crash.
#include <gtest/gtest.h>

#include <csignal>

#include "provider_watch.hpp"

namespace {

TEST(ProviderWatchDeathTest, ACrashInsideAProviderCallIsSaidAndStillACrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        common::SetWatchedProvider("tcp");
        const common::InProvider inside("fi_cq_read");
        std::raise(SIGSEGV);
      },
      testing::KilledBySignal(SIGSEGV),
      // The provider and version it happened on, and no cause of another provider's.
      "error: a thread crashed \\(SIGSEGV\\) inside the provider's fi_cq_read \\(tcp, "
      "libfabric [0-9]+\\.[0-9]+\\); README.md, \"When the provider cannot go on\"; exiting");
}

TEST(ProviderWatchDeathTest, ACrashOutsideIsOurs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        { const common::InProvider inside("fi_send"); }  // the watchdog is there; the call done
        std::raise(SIGBUS);
      },
      testing::KilledBySignal(SIGBUS),
      "error: a thread crashed \\(SIGBUS\\) outside any provider call: a defect of this program");
}

}  // namespace
