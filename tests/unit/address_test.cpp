#include <gtest/gtest.h>

#include <netinet/in.h>

#include <cstdio>
#include <cstring>

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

// Two spellings of one peer give one canonical address; two peers never do.
TEST(Address, CanonicalFormIsThePeerNotTheSpelling) {
  auto text = [](const std::string& s) {
    std::vector<uint8_t> bytes(s.begin(), s.end());
    bytes.push_back(0);
    return bytes;
  };
  // shm: the name after the first "://", up to its NUL (trailing bytes are not the name).
  const auto shm = CanonicalAddress(text("fi_shm://1234:0:1"), FI_ADDR_STR);
  EXPECT_EQ(CanonicalAddress(text("1234:0:1"), FI_ADDR_STR), shm);
  EXPECT_EQ(CanonicalAddress(text("fi_ns://1234:0:1"), FI_ADDR_STR), shm);
  auto padded = text("fi_shm://1234:0:1");
  padded.insert(padded.end(), {'x', 'y', 0});
  EXPECT_EQ(CanonicalAddress(padded, FI_ADDR_STR), shm);
  EXPECT_NE(CanonicalAddress(text("fi_shm://1234:0:2"), FI_ADDR_STR), shm);
  // A socket address: family, port and host; sin_zero is not the peer.
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(5000);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<uint8_t> a(sizeof in), b(sizeof in);
  std::memcpy(a.data(), &in, sizeof in);
  std::memset(in.sin_zero, 0x5a, sizeof in.sin_zero);
  std::memcpy(b.data(), &in, sizeof in);
  EXPECT_NE(a, b);
  EXPECT_EQ(CanonicalAddress(a, FI_SOCKADDR_IN), CanonicalAddress(b, FI_SOCKADDR_IN));
  in.sin_port = htons(5001);
  std::memcpy(b.data(), &in, sizeof in);
  EXPECT_NE(CanonicalAddress(a, FI_SOCKADDR_IN), CanonicalAddress(b, FI_SOCKADDR_IN));
  // efa: GID, QPN and QKEY; the pad and the provider's pointer are not the peer.
  std::vector<uint8_t> efa(32, 0x11), other = efa;
  other[18] = 0;
  other[30] = 0x77;
  EXPECT_EQ(CanonicalAddress(efa, FI_ADDR_EFA), CanonicalAddress(other, FI_ADDR_EFA));
  other[16] = 0x12;  // another QPN
  EXPECT_NE(CanonicalAddress(efa, FI_ADDR_EFA), CanonicalAddress(other, FI_ADDR_EFA));
}
