// shm_removed_peer: libfabric's shm provider alone, no project code: does a process survive a
// message longer than shm's inline size (4 KiB) from a peer it has removed from its AV?
//
// libfabric 1.17 (Debian 12, Ubuntu 22.04 and 24.04): no. fi_av_remove unmaps the peer's
// region while the peer keeps the id it was given; the peer's next long message (one that shm
// copies from the sender's memory instead of carrying inline) makes the receiver read through
// the unmapped region: SIGSEGV inside fi_cq_read. libfabric 2.x: it survives. The stages keep
// such peers in the AV on shm 1.17 (common/departures.hpp); tests/e2e/hostile_test.cpp
// (MessageFromAForgottenPeer) holds the stages to it.
//
//   shm_removed_peer           the receiver: starts the peer, prints what happened, exit 0
//   shm_removed_peer peer HEX  (started by the receiver)
// It prints "libfabric X.Y", then "survived" (exit 0); a crash ends it by SIGSEGV.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Ep {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
};

void Check(int rc, const char* what) {
  if (rc == 0) return;
  std::fprintf(stderr, "shm_removed_peer: %s: %s\n", what, fi_strerror(-rc));
  std::exit(1);
}

Ep Open() {
  Ep e;
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_SOURCE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->fabric_attr->prov_name = strdup("shm");
  Check(fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &e.info), "fi_getinfo");
  fi_freeinfo(hints);
  Check(fi_fabric(e.info->fabric_attr, &e.fabric, nullptr), "fi_fabric");
  Check(fi_domain(e.fabric, e.info, &e.domain, nullptr), "fi_domain");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  Check(fi_cq_open(e.domain, &cq_attr, &e.cq, nullptr), "fi_cq_open");
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  Check(fi_av_open(e.domain, &av_attr, &e.av, nullptr), "fi_av_open");
  Check(fi_endpoint(e.domain, e.info, &e.ep, nullptr), "fi_endpoint");
  Check(fi_ep_bind(e.ep, &e.cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
  Check(fi_ep_bind(e.ep, &e.av->fid, 0), "fi_ep_bind av");
  Check(fi_enable(e.ep), "fi_enable");
  return e;
}

std::string Hex(const std::vector<uint8_t>& b) {
  std::string s;
  char two[3];
  for (uint8_t c : b) {
    std::snprintf(two, sizeof(two), "%02x", c);
    s += two;
  }
  return s;
}

std::vector<uint8_t> Name(const Ep& e) {
  std::vector<uint8_t> name(256);
  size_t length = name.size();
  Check(fi_getname(&e.ep->fid, name.data(), &length), "fi_getname");
  name.resize(length);
  return name;
}

// Polls for one completion for up to `seconds`; true when one came.
bool PollOne(const Ep& e, double seconds, fi_addr_t* source = nullptr) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  fi_cq_data_entry entry;
  fi_addr_t from = FI_ADDR_UNSPEC;
  while (std::chrono::steady_clock::now() < end) {
    ssize_t n = fi_cq_readfrom(e.cq, &entry, 1, &from);
    if (n == 1) {
      if (source) *source = from;
      return true;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(e.cq, &err, 0);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return false;
}

int Peer(const std::string& hex) {
  Ep e = Open();
  std::vector<uint8_t> receiver;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    receiver.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  fi_addr_t to = FI_ADDR_UNSPEC;
  if (fi_av_insert(e.av, receiver.data(), 1, &to, 0, nullptr) != 1) return 1;
  std::vector<uint8_t> name = Name(e), big(8192, 0x5a);
  fi_context2 ctx[2];
  // First a short message carrying our name: the receiver inserts us, then removes us.
  while (fi_send(e.ep, name.data(), name.size(), nullptr, to, &ctx[0]) == -FI_EAGAIN)
    PollOne(e, 0.001);
  PollOne(e, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Then a long one from the same endpoint, to a receiver that no longer knows us.
  while (fi_send(e.ep, big.data(), big.size(), nullptr, to, &ctx[1]) == -FI_EAGAIN)
    PollOne(e, 0.001);
  PollOne(e, 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 3 && std::string(argv[1]) == "peer") return Peer(argv[2]);
  std::printf("libfabric %u.%u\n", FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
  Ep e = Open();
  std::vector<uint8_t> buffer(64 * 1024);
  fi_context2 ctx;
  Check(
      static_cast<int>(fi_recv(e.ep, buffer.data(), buffer.size(), nullptr, FI_ADDR_UNSPEC, &ctx)),
      "fi_recv");
  const std::string hex = Hex(Name(e));
  const pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", argv[0], "peer", hex.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  fi_cq_data_entry entry;
  fi_addr_t from = FI_ADDR_UNSPEC;
  bool got = false;
  for (int i = 0; i < 50000 && !got; ++i) {
    got = fi_cq_readfrom(e.cq, &entry, 1, &from) == 1;
    if (!got) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!got) {
    std::printf("no first message from the peer\n");
    return 1;
  }
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if (fi_av_insert(e.av, buffer.data(), 1, &peer, 0, nullptr) != 1) return 1;
  std::printf("peer inserted as %llu, now removed\n", static_cast<unsigned long long>(peer));
  Check(fi_av_remove(e.av, &peer, 1, 0), "fi_av_remove");
  Check(
      static_cast<int>(fi_recv(e.ep, buffer.data(), buffer.size(), nullptr, FI_ADDR_UNSPEC, &ctx)),
      "fi_recv");
  const bool second = PollOne(e, 5, &from);
  std::printf("%s\nsurvived\n",
              second ? "its long message arrived" : "its long message never came");
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}
