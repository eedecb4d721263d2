#include <gtest/gtest.h>

#include <netinet/in.h>

#include <cstdio>

#include "address.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"

using namespace common;

TEST(Address, RoundTripsEveryByteValueAndLength) {
  for (size_t length : {1u, 14u, 16u, 28u, 32u, 256u}) {
    std::vector<uint8_t> bytes(length);
    for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    const std::string hex = ToHex(bytes);
    EXPECT_EQ(hex.size(), 2 * length);
    EXPECT_EQ(FromHex(hex), bytes);
  }
  EXPECT_EQ(ToHex(std::vector<uint8_t>{0x00, 0xff, 0x7f, 0x80}), "00ff7f80");
  EXPECT_EQ(FromHex("00FFaB"), (std::vector<uint8_t>{0x00, 0xff, 0xab}));
}

TEST(Address, RejectsEmptyNonHexAndOddLength) {
  EXPECT_THROW(FromHex(""), UsageError);
  try {
    FromHex("12g4");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "address '12g4' is not hex (character 3)");
    EXPECT_EQ(e.exit_code(), kExitUsage);
  }
  try {
    FromHex("abc");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "address 'abc' has an odd number of hex digits (3)");
  }
  EXPECT_THROW(FromHex("0x00"), UsageError);
  EXPECT_THROW(FromHex("00 11"), UsageError);
}

TEST(Address, LengthsOfFixedFormats) {
  EXPECT_EQ(AddressLength(FI_SOCKADDR_IN), sizeof(sockaddr_in));
  EXPECT_EQ(AddressLength(FI_SOCKADDR_IN6), sizeof(sockaddr_in6));
  EXPECT_EQ(AddressLength(FI_ADDR_EFA), 32u);
  EXPECT_FALSE(AddressLength(FI_ADDR_STR).has_value());
}

TEST(Address, CheckAddressAgainstProviderFormat) {
  FiInfoPtr info(fi_allocinfo());
  info->fabric_attr->prov_name = strdup("efa");
  info->addr_format = FI_ADDR_EFA;
  EXPECT_NO_THROW(CheckAddress(std::vector<uint8_t>(32), *info));
  try {
    CheckAddress(std::vector<uint8_t>(16), *info);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "address has 16 bytes, but efa addresses (FI_ADDR_EFA) have 32");
  }
  info->addr_format = FI_ADDR_STR;
  const std::string name = "fi_shm://1234";
  std::vector<uint8_t> good(name.begin(), name.end());
  good.push_back(0);
  EXPECT_NO_THROW(CheckAddress(good, *info));
  good.pop_back();  // no terminating NUL
  EXPECT_THROW(CheckAddress(good, *info), UsageError);
  EXPECT_THROW(CheckAddress(std::vector<uint8_t>{0x01, 0x02, 0x00}, *info), UsageError);
}

TEST(Address, ListRoundTripsThroughAFile) {
  const std::string path = testing::TempDir() + "address_list_test";
  const std::vector<std::vector<uint8_t>> lanes = {{0x02, 0x00, 0xab}, {0xff}, {0x10, 0x20}};
  WriteAddressList(lanes, path);
  EXPECT_EQ(ReadAddressList(path), lanes);
  std::remove(path.c_str());
  EXPECT_THROW(ReadAddressList(path), UsageError);  // gone: one clear error
}
