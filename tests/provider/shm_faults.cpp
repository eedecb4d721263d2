// shm_faults: libfabric's shm provider alone, no project code. Four faults of a peer that went
// away, each its own scenario.
//
// long-message: does a process survive a message longer than shm's inline size (4 KiB) from a
// peer it has removed from its AV?
//
// libfabric 1.17 (Debian 12, Ubuntu 22.04 and 24.04): no. fi_av_remove unmaps the peer's
// region while the peer keeps the id it was given; the peer's next long message (one that shm
// copies from the sender's memory instead of carrying inline) makes the receiver read through
// the unmapped region: SIGSEGV inside fi_cq_read. libfabric 2.x: it survives. The stages keep
// such peers in the AV on shm 1.17 (common/departures.hpp); tests/e2e/hostile_test.cpp
// (MessageFromAForgottenPeer) holds the stages to it.
//
// killed-peer: does a process survive sending to a new address after a peer that had spoken
// to it was killed (SIGKILL) and removed from its AV? shm keeps, in the receiver's own region,
// the id each peer gave it; a peer that closes its endpoint clears it, a killed one cannot,
// and fi_av_remove does not (smr_map_del in prov/shm/src/smr_av.c, 2.6). The AV's slots are
// handed out in turn, 256 of them; when the killed peer's slot comes round to an address that
// has not spoken to us, the stale id makes shm skip mapping the new peer's region and send
// through a null one: SIGSEGV in fi_send (smr_generic_sendmsg), 1.17 and 2.6 alike. The
// stages never send first to an address that has not spoken to them from itself
// (docs/wire-protocol.md, "Answering only who spoke"), which keeps them clear of it.
//
// closed-peer: does a process survive the first message of a peer that closed its endpoint
// (and so removed its file in /dev/shm) before the message was read? A peer's first message
// to us is preceded by a request to map it, carrying its name. libfabric 1.17: no. Reading
// that request, shm maps the name, finds no file, ignores the error and reads the null region
// (smr_progress_connreq in prov/shm/src/smr_progress.c, 1.17): SIGSEGV inside fi_cq_read.
// 2.x checks the mapping and drops the request. Nothing the receiver does before fi_cq_read
// can avoid it: any local process that sends one message and exits before we read it ends us.
//
// locked-peer: does a send to a peer return when the peer was killed while it held a lock
// of its shared-memory region? libfabric 1.17 guards each region with a pthread spinlock that
// lives in the region itself: the owner takes it on every progress call (smr_progress_cmd),
// a sender takes it before queuing anything (smr_generic_sendmsg; a WRITE, smr_generic_rma,
// the same). libfabric 2.6 has lock-free queues, but a region's inject buffers are a free
// stack under a spinlock in the region (fs_lock, new in 2.6.0; 2.0-2.5 have none): a sender
// takes one of the peer's for each message or WRITE too long to travel in the command, and
// the peer takes the lock to give it back as it reads it. A peer killed while it holds either
// never releases it, and the next fi_send or fi_write to that peer that needs it spins for
// good: the calling thread is lost. Here the peer is made to die holding it: this program's
// pthread_spin_lock, which libfabric's calls reach first, kills the peer once it has taken a
// lock that lives in /dev/shm, and 1 KiB messages make it take one. Nothing frees that
// thread here; the stages say so and exit (common/provider_watch.hpp).
//
// strangers: does a peer the receiver knows still reach it after many processes it never
// inserted into its AV have each sent it one message? 2.6: no, after 256 (every place of shm's
// peer table taken, the next sender gets a known peer's); 1.17: yes.
//
//   shm_faults [long-message|killed-peer|closed-peer|locked-peer|strangers]
//       the receiver: starts the peers, prints what happened (long-message by default)
//   shm_faults peer HEX | stay HEX | close HEX | lock HEX | echo HEX   (started by the receiver)
// It prints "libfabric X.Y", then "survived" (exit 0); a crash ends it by SIGSEGV, a wedge
// by "wedged" and exit 3, a known peer no longer answered by exit 3.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "shared_memory.hpp"

namespace {

// Armed in the `lock` peer only: the next lock it takes in shared memory, it dies holding.
std::atomic<bool> die_holding_a_shared_lock{false};

}  // namespace

// libfabric's calls to pthread_spin_lock come here first (an executable's symbol is found
// before libc's); it takes the lock, and in the armed peer dies holding one of shared memory.
extern "C" int pthread_spin_lock(pthread_spinlock_t* lock) {
  using Lock = int (*)(pthread_spinlock_t*);
  static const Lock real = reinterpret_cast<Lock>(dlsym(RTLD_NEXT, "pthread_spin_lock"));
  const int rc = real(lock);
  if (die_holding_a_shared_lock && !SharedMemoryFileOf(lock).empty()) {
    static const char said[] = "peer: killed holding a lock in shared memory\n";
    (void)!write(STDOUT_FILENO, said, sizeof(said) - 1);
    raise(SIGKILL);
  }
  return rc;
}

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
  std::fprintf(stderr, "shm_faults: %s: %s\n", what, fi_strerror(-rc));
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

std::vector<uint8_t> Unhex(const std::string& hex) {
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

// Starts this program as the peer `mode`, given the receiver's address.
pid_t StartPeer(const char* self, const char* mode, const Ep& receiver) {
  const std::string hex = Hex(Name(receiver));
  const pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", self, mode, hex.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return child;
}

// Removes what shm made for process `pid` in /dev/shm (PID:...): a process that does not
// close its endpoint (killed, or wedged) leaves its regions there, 13 MB each.
void RemoveRegionsOf(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec))
    if (entry.path().filename().string().rfind(prefix, 0) == 0)
      std::filesystem::remove(entry.path(), ec);
}

// Waits for the peer to end (`nohang`: returns 0 while it runs), and removes its regions.
pid_t Reap(pid_t child, int* status, bool nohang = false) {
  const pid_t done = waitpid(child, status, nohang ? WNOHANG : 0);
  if (done == child) RemoveRegionsOf(child);
  return done;
}

// Waits up to 5 s for the peer's first message; its bytes are its address.
bool FirstMessage(const Ep& e) {
  fi_cq_data_entry entry;
  for (int i = 0; i < 50000; ++i) {
    if (fi_cq_read(e.cq, &entry, 1) == 1) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::printf("no first message from the peer\n");
  return false;
}

void Close(Ep& e) {
  for (fid* f : {&e.ep->fid, &e.av->fid, &e.cq->fid, &e.domain->fid, &e.fabric->fid})
    Check(fi_close(f), "fi_close");
  fi_freeinfo(e.info);
}

// A peer that sends its name, then: (peer) a long message after the receiver removed it;
// (stay) waits to be killed; (close) tries once, then closes its endpoint, as a process exits.
int Peer(const std::string& hex, const std::string& mode) {
  Ep e = Open();
  std::vector<uint8_t> receiver = Unhex(hex);
  fi_addr_t to = FI_ADDR_UNSPEC;
  if (fi_av_insert(e.av, receiver.data(), 1, &to, 0, nullptr) != 1) return 1;
  std::vector<uint8_t> name = Name(e), big(8192, 0x5a);
  fi_context2 ctx[2];
  if (mode == "close") {
    // On 1.17 the first fi_send queues the request to map us and returns -FI_EAGAIN until the
    // receiver has read it; one try is what a process that gives up at once leaves behind.
    const ssize_t rc = fi_send(e.ep, name.data(), name.size(), nullptr, to, &ctx[0]);
    if (rc == 0) PollOne(e, 2);
    Close(e);
    return 0;
  }
  // First a short message carrying our name: the receiver inserts us, then removes us.
  while (fi_send(e.ep, name.data(), name.size(), nullptr, to, &ctx[0]) == -FI_EAGAIN)
    PollOne(e, 0.001);
  PollOne(e, 2);
  if (mode == "lock") {  // dies in the next progress call that takes our region's lock
    die_holding_a_shared_lock = true;
    PollOne(e, 5);
    std::printf("peer: no lock in shared memory taken in 5 s; killed all the same\n");
    raise(SIGKILL);
  }
  if (mode == "stay") {  // until killed: the receiver keeps the id we gave it
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  if (mode == "echo") {  // answers each message with one byte, until killed
    std::vector<uint8_t> in(64 * 1024);
    fi_context2 rx;
    char one = 1;
    Check(static_cast<int>(fi_recv(e.ep, in.data(), in.size(), nullptr, FI_ADDR_UNSPEC, &rx)),
          "fi_recv");
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < end) {
      fi_cq_data_entry entry;
      if (fi_cq_read(e.cq, &entry, 1) == 1 && (entry.flags & FI_RECV)) {
        Check(static_cast<int>(fi_recv(e.ep, in.data(), in.size(), nullptr, FI_ADDR_UNSPEC, &rx)),
              "fi_recv");
        while (fi_send(e.ep, &one, 1, nullptr, to, &ctx[1]) == -FI_EAGAIN) PollOne(e, 0.001);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Then a long one from the same endpoint, to a receiver that no longer knows us.
  while (fi_send(e.ep, big.data(), big.size(), nullptr, to, &ctx[1]) == -FI_EAGAIN)
    PollOne(e, 0.001);
  PollOne(e, 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Close(e);  // which removes our region from /dev/shm
  return 0;
}

// Posts one receive of `buffer`'s size.
void PostRecv(const Ep& e, std::vector<uint8_t>& buffer, fi_context2& ctx) {
  Check(
      static_cast<int>(fi_recv(e.ep, buffer.data(), buffer.size(), nullptr, FI_ADDR_UNSPEC, &ctx)),
      "fi_recv");
}

// The receiver's endpoint, with one receive of 64 KiB posted into `buffer`.
Ep OpenReceiver(std::vector<uint8_t>& buffer, fi_context2& ctx) {
  Ep e = Open();
  buffer.assign(64 * 1024, 0);
  PostRecv(e, buffer, ctx);
  return e;
}

// Starts the peer `mode` and waits for its first message (its address, in `buffer`, into which
// `e` has a receive posted); inserts it into `e`'s AV as `*peer`. False when it never spoke.
bool StartAndInsertPeer(const char* self, const char* mode, Ep& e, std::vector<uint8_t>& buffer,
                        pid_t* child, fi_addr_t* peer) {
  *child = StartPeer(self, mode, e);
  if (!FirstMessage(e)) return false;
  return fi_av_insert(e.av, buffer.data(), 1, peer, 0, nullptr) == 1;
}

int LongMessage(const char* self) {
  std::vector<uint8_t> buffer;
  fi_context2 ctx;
  Ep e = OpenReceiver(buffer, ctx);
  pid_t child = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC, from = FI_ADDR_UNSPEC;
  if (!StartAndInsertPeer(self, "peer", e, buffer, &child, &peer)) return 1;
  std::printf("peer inserted as %llu, now removed\n", static_cast<unsigned long long>(peer));
  Check(fi_av_remove(e.av, &peer, 1, 0), "fi_av_remove");
  PostRecv(e, buffer, ctx);
  const bool second = PollOne(e, 5, &from);
  std::printf("%s\nsurvived\n",
              second ? "its long message arrived" : "its long message never came");
  int status = 0;
  Reap(child, &status);
  return 0;
}

int KilledPeer(const char* self) {
  std::vector<uint8_t> buffer;
  fi_context2 ctx;
  Ep e = OpenReceiver(buffer, ctx);
  pid_t child = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if (!StartAndInsertPeer(self, "stay", e, buffer, &child, &peer)) return 1;
  kill(child, SIGKILL);
  int status = 0;
  Reap(child, &status);
  Check(fi_av_remove(e.av, &peer, 1, 0), "fi_av_remove");
  std::printf("peer inserted as %llu, killed, removed\n", static_cast<unsigned long long>(peer));
  // Addresses nobody listens at, each sent one message and removed: the 257th takes the
  // killed peer's slot again. A sound provider answers each send with -FI_EAGAIN (or takes it).
  std::vector<uint8_t> nowhere = buffer;
  nowhere.resize(std::strlen(reinterpret_cast<const char*>(buffer.data())));
  nowhere.insert(nowhere.end(), {'-', 'x', '0', '0', '0', '\0'});
  char one = 1;
  int inserted = 0;
  for (int i = 0; i < 300; ++i) {
    std::snprintf(reinterpret_cast<char*>(nowhere.data() + nowhere.size() - 4), 4, "%03d", i);
    fi_addr_t to = FI_ADDR_UNSPEC;
    if (fi_av_insert(e.av, nowhere.data(), 1, &to, 0, nullptr) != 1) continue;
    ++inserted;
    fi_context2 send_ctx;
    (void)fi_send(e.ep, &one, 1, nullptr, to, &send_ctx);
    PollOne(e, 0.001);
    Check(fi_av_remove(e.av, &to, 1, 0), "fi_av_remove");
  }
  std::printf("sent to %d addresses nobody listens at\nsurvived\n", inserted);
  return 0;
}

int ClosedPeer(const char* self) {
  std::vector<uint8_t> buffer;
  fi_context2 ctx;
  Ep e = OpenReceiver(buffer, ctx);
  // No fi_cq_read until the peer has sent, closed and exited.
  const pid_t child = StartPeer(self, "close", e);
  int status = 0;
  Reap(child, &status);
  std::printf("the peer sent once and closed (exit %d)\n",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  const bool arrived = PollOne(e, 2);
  std::printf("%s\nsurvived\n", arrived ? "its message arrived" : "its message never came");
  return 0;
}

int LockedPeer(const char* self) {
  std::vector<uint8_t> buffer;
  fi_context2 ctx;
  Ep e = OpenReceiver(buffer, ctx);
  pid_t child = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if (!StartAndInsertPeer(self, "lock", e, buffer, &child, &peer)) return 1;
  // Messages to the peer (which makes it progress, and so take its lock), from a thread this
  // one can give up on: a wedged send never returns. It stops at the first send it began
  // after the peer was dead, once that returns.
  std::atomic<bool> peer_dead{false}, returned{false};
  std::thread sender([&] {
    // 1 KiB: more than fits in a command, so each one takes an inject buffer of the peer's,
    // which it returns as it reads them (2.x takes the lock there).
    std::vector<char> message(1024, 1);
    std::vector<fi_context2> contexts(100000);
    size_t next = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end && next < contexts.size()) {
      const bool after_death = peer_dead;
      const ssize_t rc =
          fi_send(e.ep, message.data(), message.size(), nullptr, peer, &contexts[next]);
      if (after_death) break;
      if (rc == 0) ++next;
      PollOne(e, 0.001);
    }
    returned = true;
  });
  int status = 0;
  for (int i = 0; i < 1000 && Reap(child, &status, true) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!WIFSIGNALED(status)) {
    std::printf("the peer did not die\n");
    kill(child, SIGKILL);
    _exit(1);
  }
  std::printf("the peer is dead (SIGKILL)\n");
  peer_dead = true;
  for (int i = 0; i < 500 && !returned; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!returned) {
    std::printf("wedged: fi_send to the killed peer has not returned in 5 s\n");
    std::fflush(stdout);
    RemoveRegionsOf(getpid());
    _exit(3);  // the sender spins inside shm for good: nothing can join it or close ours
  }
  sender.join();
  std::printf("fi_send to the killed peer returned\nsurvived\n");
  return 0;
}

}  // namespace

// Sends one byte to `peer` and waits up to 2 s for its one-byte answer (the echo peer's).
bool Answers(Ep& e, std::vector<uint8_t>& buffer, fi_context2& rx, fi_addr_t peer) {
  char one = 1;
  fi_context2 tx;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (fi_send(e.ep, &one, 1, nullptr, peer, &tx) == -FI_EAGAIN)
    if (!PollOne(e, 0.001) && std::chrono::steady_clock::now() > end) return false;
  while (std::chrono::steady_clock::now() < end) {
    fi_cq_data_entry entry;
    ssize_t n = fi_cq_read(e.cq, &entry, 1);
    if (n == 1 && (entry.flags & FI_RECV)) {
      PostRecv(e, buffer, rx);
      return true;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(e.cq, &err, 0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return false;
}

// strangers: does a peer the receiver knows still reach it after many processes it never
// inserted into its AV have each sent it one message? shm maps every sender that writes to
// it, whether or not the receiver ever names it, and frees that place in its table of 256
// peers only when the receiver removes the sender from its AV, which a receiver can do only
// for a sender it inserted.
int Strangers(const char* self) {
  std::vector<uint8_t> buffer;
  fi_context2 rx;
  Ep e = OpenReceiver(buffer, rx);
  pid_t echo = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if (!StartAndInsertPeer(self, "echo", e, buffer, &echo, &peer)) return 1;
  PostRecv(e, buffer, rx);
  if (!Answers(e, buffer, rx, peer)) {
    std::printf("the echo peer never answered\n");
    kill(echo, SIGKILL);
    return 1;
  }
  std::printf("the echo peer answers\n");
  int status = 0, rc = 0, strangers = 0;
  constexpr int kBatch = 8;  // started together: each sends its name, then waits to be killed
  while (strangers < 264 && rc == 0) {
    std::vector<pid_t> batch;
    for (int i = 0; i < kBatch; ++i) batch.push_back(StartPeer(self, "stay", e));
    int read = 0;
    for (; read < kBatch && FirstMessage(e); ++read) PostRecv(e, buffer, rx);
    for (pid_t one : batch) {
      kill(one, SIGKILL);
      Reap(one, &status);
    }
    strangers += read;
    if (read < kBatch) {
      std::printf("only %d of %d strangers were heard\n", read, kBatch);
      rc = 1;
    } else if (!Answers(e, buffer, rx, peer)) {
      std::printf("after %d strangers, the echo peer no longer answers\n", strangers);
      rc = 3;
    }
  }
  if (rc == 0)
    std::printf("after %d strangers, the echo peer still answers\nsurvived\n", strangers);
  kill(echo, SIGKILL);
  Reap(echo, &status);
  return rc;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 3) {
    const std::string mode = argv[1];
    if (mode == "peer" || mode == "stay" || mode == "close" || mode == "lock" || mode == "echo")
      return Peer(argv[2], mode);
  }
  const std::string scenario = argc > 1 ? argv[1] : "long-message";
  if (scenario != "long-message" && scenario != "killed-peer" && scenario != "closed-peer" &&
      scenario != "locked-peer" && scenario != "strangers") {
    std::fprintf(stderr,
                 "shm_faults: invalid scenario '%s' (long-message, killed-peer, closed-peer, "
                 "locked-peer or strangers)\n",
                 scenario.c_str());
    return 2;
  }
  std::printf("libfabric %u.%u\n", FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
  if (scenario == "killed-peer") return KilledPeer(argv[0]);
  if (scenario == "closed-peer") return ClosedPeer(argv[0]);
  if (scenario == "locked-peer") return LockedPeer(argv[0]);
  if (scenario == "strangers") return Strangers(argv[0]);
  return LongMessage(argv[0]);
}
