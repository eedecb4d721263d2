// The provider quirks table (common/provider_quirks.hpp): each behaviour once, with its
// versions, words and source; Has() at each row's edges, and never for another provider.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "provider_quirks.hpp"

using namespace common;

TEST(ProviderQuirks, EachRowIsWhole) {
  std::set<Quirk> seen;
  std::set<std::pair<Quirk, std::string>> rows;  // a behaviour once per provider
  for (const QuirkRow& row : Quirks()) {
    seen.insert(row.quirk);
    EXPECT_TRUE(rows.insert({row.quirk, row.provider}).second)
        << "a quirk with two rows for " << row.provider << ": " << row.behaviour;
    EXPECT_FALSE(std::string(row.provider).empty());
    EXPECT_GT(std::string(row.behaviour).size(), 20u);
    EXPECT_GT(std::string(row.found).size(), 10u) << row.behaviour;
    if (row.until != 0) {
      EXPECT_LT(row.from, row.until) << row.behaviour;
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(Quirk::kDeliversInOrder) + 1);  // each one
}

TEST(ProviderQuirks, VersionsAtTheEdges) {
  // shm's 1.x region faults end with 2.0; in-order completion with 1.18, where completion
  // before delivery and commands held until answered begin.
  EXPECT_TRUE(Has(Quirk::kUnmapsRemovedPeer, "shm", FI_VERSION(1, 17)));
  EXPECT_FALSE(Has(Quirk::kUnmapsRemovedPeer, "shm", FI_VERSION(2, 0)));
  EXPECT_TRUE(Has(Quirk::kCompletesInOrder, "shm", FI_VERSION(1, 17)));
  EXPECT_FALSE(Has(Quirk::kCompletesInOrder, "shm", FI_VERSION(1, 18)));
  EXPECT_FALSE(Has(Quirk::kCompletesBeforeDelivery, "shm", FI_VERSION(1, 17)));
  EXPECT_TRUE(Has(Quirk::kCompletesBeforeDelivery, "shm", FI_VERSION(1, 18)));
  EXPECT_TRUE(Has(Quirk::kHoldsCommandUntilAnswered, "shm", FI_VERSION(2, 6)));
  EXPECT_FALSE(Has(Quirk::kPeerPlacesForStrangers, "shm", FI_VERSION(2, 5)));
  EXPECT_TRUE(Has(Quirk::kPeerPlacesForStrangers, "shm", FI_VERSION(2, 6)));
  // Another provider has none of shm's; only efa reads FI_MORE.
  EXPECT_FALSE(Has(Quirk::kCompletesInOrder, "tcp", FI_VERSION(1, 17)));
  EXPECT_FALSE(Has(Quirk::kHoldsCommandUntilAnswered, "efa", FI_VERSION(2, 6)));
  EXPECT_TRUE(Has(Quirk::kReadsMore, "efa", FI_VERSION(1, 17)));
  EXPECT_FALSE(Has(Quirk::kReadsMore, "shm", FI_VERSION(2, 6)));
  EXPECT_FALSE(Has(Quirk::kReadsMore, nullptr, FI_VERSION(2, 6)));
  // A WRITE lands in order over tcp's one connection, and over shm before 1.18; not over efa.
  EXPECT_TRUE(Has(Quirk::kDeliversInOrder, "tcp;ofi_rxm", FI_VERSION(2, 6)));
  EXPECT_TRUE(Has(Quirk::kDeliversInOrder, "shm", FI_VERSION(1, 17)));
  EXPECT_FALSE(Has(Quirk::kDeliversInOrder, "shm", FI_VERSION(1, 18)));
  EXPECT_FALSE(Has(Quirk::kDeliversInOrder, "efa", FI_VERSION(2, 6)));
}
