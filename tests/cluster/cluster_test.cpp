// The cluster suite: real multi-NIC traffic between two network namespaces joined by shaped
// veth pairs (scripts/minicluster). Needs root and iproute2: without them the whole suite
// exits 77 with the reason, which Meson reports as skipped.
#include <gtest/gtest.h>
#include <rdma/fabric.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "process.hpp"

using namespace testing_support;
using namespace std::chrono_literals;

namespace {

constexpr int kNics = 4;

std::string Script() {
  return std::string(std::getenv("E2E_SOURCE_DIR")) + "/scripts/minicluster";
}

// A mini-cluster of this test process's own (its own namespace names), always taken down,
// also when a test fails half-way.
class MiniCluster {
 public:
  MiniCluster(int nics, int rate_mbit) {
    setenv("MINICLUSTER_NAME", name_.c_str(), 1);
    Result up = RunToEnd(
        {"/bin/bash", Script(), "up", std::to_string(nics), std::to_string(rate_mbit)}, 60s);
    ok_ = up.exit_code == 0;
    log_ = up.out + up.err;
  }
  ~MiniCluster() { RunToEnd({"/bin/bash", Script(), "down"}, 60s); }
  bool ok() const { return ok_; }
  const std::string& log() const { return log_; }
  const std::string& name() const { return name_; }
  std::vector<std::string> On(const char* host, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/bin/bash", Script(), "exec", host});
    return argv;
  }
  long long TxBytes(const char* host, const std::string& nic) const {
    Result r =
        RunToEnd(On(host, {"/bin/cat", "/sys/class/net/" + nic + "/statistics/tx_bytes"}), 10s);
    return r.exit_code == 0 ? std::stoll(r.out) : -1;
  }

 private:
  std::string name_ = "jt" + std::to_string(getpid());
  bool ok_ = false;
  std::string log_;
};

// Serves one client in host A and runs it in host B; returns the client's result.
Result Transfer(const MiniCluster& mc, const std::string& stage,
                std::vector<std::string> server_args, std::vector<std::string> client_args,
                Result* server_result, std::chrono::seconds limit = 120s) {
  TempDir dir;
  const std::string address_file = dir.path() + "/addr";
  std::vector<std::string> server = {StageBinary(stage), "-p",        "tcp", "--memory", "host",
                                     "--address-file",   address_file};
  server.insert(server.end(), server_args.begin(), server_args.end());
  if (std::find(server.begin(), server.end(), "--exit-after") == server.end())
    server.insert(server.end(), {"--exit-after", "1"});  // one client, unless told how many
  Process p(mc.On("A", server));
  const std::string address = WaitForLine(address_file, 20s);
  if (address.empty()) {
    *server_result = p.Wait(1s);
    return Result{};
  }
  std::vector<std::string> client = {StageBinary(stage), "-p", "tcp", address, "--memory", "host"};
  client.insert(client.end(), client_args.begin(), client_args.end());
  Result r = RunToEnd(mc.On("B", client), limit);
  *server_result = p.Wait(30s);
  return r;
}

TEST(Cluster, QueuingOnOneNicThenMultiNicOnFour) {
  MiniCluster mc(kNics, 1000);
  ASSERT_TRUE(mc.ok()) << mc.log();
  const std::string a = mc.name() + "a", b = mc.name() + "b";

  Result server;
  Result one = Transfer(mc, "05_queuing", {"--domain", a + "0"},
                        {"--domain", b + "0", "-S", "64k", "--pages", "256", "--requests", "2",
                         "--link-gbps", "1", "--json"},
                        &server);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err << server.out << server.err;
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_EQ(NumberAfter(one.out, "\"verified_bytes\":"), 256LL * 65536 * 2);

  long long before[kNics];
  for (int i = 0; i < kNics; ++i) before[i] = mc.TxBytes("A", a + std::to_string(i));
  Result four = Transfer(mc, "06_multi_nic", {"--nics", "4"},
                         {"--nics", "4", "-S", "64k", "--pages", "512", "--requests", "2",
                          "--repeat", "2", "--link-gbps", "1", "--json"},
                         &server);
  ASSERT_EQ(four.exit_code, 0) << four.out << four.err << server.out << server.err;
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_EQ(NumberAfter(four.out, "\"verified_bytes\":"), 512LL * 65536 * 2);
  EXPECT_EQ(NumberAfter(four.out, "\"lanes\":"), 4);
  // Every NIC carried its share: a quarter of 128 MiB each, give or take headers.
  const long long share = 512LL * 65536 * 2 * 2 / kNics;
  for (int i = 0; i < kNics; ++i) {
    const long long sent = mc.TxBytes("A", a + std::to_string(i)) - before[i];
    EXPECT_GT(sent, share * 9 / 10) << "NIC " << i;
    EXPECT_LT(sent, share * 12 / 10) << "NIC " << i;
  }
}

// 07 across the namespaces: 4 NICs as 2 groups of 2 (a thread each), every page verified,
// every NIC carrying its share.
TEST(Cluster, FullEngineOnFourNics) {
  MiniCluster mc(kNics, 1000);
  ASSERT_TRUE(mc.ok()) << mc.log();
  const std::string a = mc.name() + "a";
  long long before[kNics];
  for (int i = 0; i < kNics; ++i) before[i] = mc.TxBytes("A", a + std::to_string(i));
  Result server;
  Result r = Transfer(mc, "07_full_p5", {"--nics", "4"},
                      {"--nics", "4", "--threads", "2", "-S", "64k", "--pages", "512", "--requests",
                       "2", "--repeat", "2", "--link-gbps", "1", "--json"},
                      &server);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << server.out << server.err;
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_NE(server.out.find("4 lanes, 2 threads"), std::string::npos) << server.out;
  EXPECT_EQ(NumberAfter(r.out, "\"verified_bytes\":"), 512LL * 65536 * 2);
  EXPECT_EQ(NumberAfter(r.out, "\"lanes\":"), 4);
  const long long share = 512LL * 65536 * 2 * 2 / kNics;  // plus 16 warmup pages per NIC
  for (int i = 0; i < kNics; ++i) {
    const long long sent = mc.TxBytes("A", a + std::to_string(i)) - before[i];
    EXPECT_GT(sent, share * 9 / 10) << "NIC " << i;
    EXPECT_LT(sent, share * 12 / 10) << "NIC " << i;
    // The client's summary puts each NIC's own count of the bytes it received beside the
    // pages its lane received: exactly its share, and on the wire that plus the protocol's
    // headers (TCP/IP and rxm, about 1% at 64 KiB pages and MTU 9000), no more.
    const std::string nic = "{\"name\":\"" + mc.name() + "b" + std::to_string(i) + "\",";
    EXPECT_EQ(NumberAfter(r.out, nic + "\"bytes\":"), share) << r.out;
    const long long wire = NumberAfter(r.out.substr(r.out.find(nic)), "\"wire_bytes\":");
    EXPECT_GE(wire, share) << "NIC " << i << ": " << r.out;
    EXPECT_LT(wire, share * 103 / 100) << "NIC " << i << ": " << r.out;
  }
  EXPECT_NE(server.out.find("NIC counters: 4 NICs sent "), std::string::npos) << server.out;
}

// Pages are dealt to lanes as one deck across requests: 2 or 3 pages a request over 4 NICs
// still load every NIC equally (page i on lane i % lanes left NICs 2 and 3 at 0 bytes with
// --pages 2), by each lane's count of what it received and by the NIC's own counter. A run of
// fewer pages than lanes is refused, naming the lanes that would be idle.
TEST(Cluster, FewPagesAreDealtToEveryLane) {
  MiniCluster mc(kNics, 1000);
  ASSERT_TRUE(mc.ok()) << mc.log();
  TempDir dir;
  const std::string address_file = dir.path() + "/addr";
  Process server(mc.On("A", {StageBinary("07_full_p5"), "-p", "tcp", "--memory", "host", "--nics",
                             "4", "--exit-after", "2", "--address-file", address_file}));
  const std::string address = WaitForLine(address_file, 20s);
  ASSERT_FALSE(address.empty()) << server.Output();
  const auto client = [&](std::vector<std::string> args) {
    std::vector<std::string> command = {
        StageBinary("07_full_p5"), "-p", "tcp", address, "--memory", "host", "--nics", "4"};
    command.insert(command.end(), args.begin(), args.end());
    return RunToEnd(mc.On("B", command), 60s);
  };
  Result refused = client({"--pages", "1", "--requests", "2"});
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("2 pages over 4 lanes: lanes 2-3 would carry nothing"),
            std::string::npos)
      << refused.err;
  for (const char* pages : {"2", "3"}) {
    Result r =
        client({"-S", "64k", "--pages", pages, "--requests", "8", "--repeat", "4", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err << server.Output();
    const long long share = std::stoll(pages) * 8 * 4 * 65536 / kNics;
    for (int i = 0; i < kNics; ++i) {
      const std::string nic = "{\"name\":\"" + mc.name() + "b" + std::to_string(i) + "\",";
      ASSERT_NE(r.out.find(nic), std::string::npos) << r.out;
      EXPECT_EQ(NumberAfter(r.out, nic + "\"bytes\":"), share)
          << "--pages " << pages << " NIC " << i;
      EXPECT_GE(NumberAfter(r.out.substr(r.out.find(nic)), "\"wire_bytes\":"), share)
          << "--pages " << pages << " NIC " << i << ": " << r.out;
    }
  }
  EXPECT_EQ(server.Wait(30s).exit_code, 0) << server.Output();
}

// A NIC down for good mid-transfer (07 does not fail over, README.md "When a NIC fails"):
// the client ends in bounded time, exit 1, naming that NIC's lane and its link down, with no
// crash; the server drops the silent client and serves the next one on the
// NICs that still work.
TEST(Cluster, NicDownMidTransfer) {
  MiniCluster mc(kNics, 1000);
  ASSERT_TRUE(mc.ok()) << mc.log();
  TempDir dir;
  const std::string address_file = dir.path() + "/addr";
  Process server(mc.On("A", {StageBinary("07_full_p5"), "-p", "tcp", "--memory", "host", "--nics",
                             "4", "--peer-timeout", "3", "--address-file", address_file}));
  const std::string address = WaitForLine(address_file, 20s);
  ASSERT_FALSE(address.empty()) << server.Output();
  // 4 GiB over 4 x 1 Gbit/s: about 9 s, of which the NIC takes the third second.
  Process client(mc.On("B", {StageBinary("07_full_p5"), "-p", "tcp", address, "--memory", "host",
                             "--nics", "4", "-S", "64k", "--pages", "1024", "--requests", "4",
                             "--repeat", "16", "--timeout", "4"}));
  // The NIC goes down once WRITEs landed on every lane (the server's warmup line says so),
  // and a second into the timed WRITEs, however slowly a loaded machine got there.
  ASSERT_TRUE(WaitForOutput(server, "client 1: warmup: ", 60s)) << server.Output();
  std::this_thread::sleep_for(1s);
  const std::string nic = mc.name() + "b2";
  Result down = RunToEnd(mc.On("B", {"ip", "link", "set", nic, "down"}), 10s);
  ASSERT_EQ(down.exit_code, 0) << down.out << down.err;
  const auto start = std::chrono::steady_clock::now();
  Result r = client.Wait(30s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("lane 2 (" + nic + "): its NIC's link is down"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("signal"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Backtrace"), std::string::npos) << r.err;
  // The next client, on a NIC that works, is served and verified.
  Result next = RunToEnd(
      mc.On("B", {StageBinary("07_full_p5"), "-p", "tcp", address, "--memory", "host", "--nics",
                  "1", "-S", "64k", "--pages", "64", "--requests", "2", "--json"}),
      60s);
  EXPECT_EQ(next.exit_code, 0) << next.out << next.err;
  EXPECT_EQ(NumberAfter(next.out, "\"verified_bytes\":"), 64LL * 65536 * 2) << next.out;
  // The server looks at a silent client once a second: the next client may be done before it
  // saw the first one's end (its connections on the other lanes closed, lane 2's unanswered).
  EXPECT_TRUE(WaitForOutput(server, "client 1 lost: ", 15s)) << server.Output();
  server.Signal(SIGTERM);
  Result served = server.Wait(15s);
  EXPECT_EQ(served.exit_code, 0) << served.out << served.err;
  EXPECT_NE(served.out.find("client 1 lost: "), std::string::npos) << served.out;
  EXPECT_NE(served.out.find("client 2 done: "), std::string::npos) << served.out;
}

// A client killed mid-transfer, then a server killed mid-transfer, across the namespaces: the
// server drops the dead client (its WRITEs fail over tcp) and serves the next; the client of
// a dead server ends in bounded time with its own message and exit 1, no crash.
TEST(Cluster, ClientAndServerKilledMidTransfer) {
  MiniCluster mc(2, 1000);
  ASSERT_TRUE(mc.ok()) << mc.log();
  TempDir dir;
  const std::string address_file = dir.path() + "/addr";
  auto server = std::make_unique<Process>(
      mc.On("A", {StageBinary("07_full_p5"), "-p", "tcp", "--memory", "host", "--nics", "2",
                  "--peer-timeout", "3", "--address-file", address_file}));
  const std::string address = WaitForLine(address_file, 20s);
  ASSERT_FALSE(address.empty()) << server->Output();
  std::vector<std::string> long_transfer = {StageBinary("07_full_p5"), "-p", "tcp", address};
  for (const char* arg : {"--memory", "host", "--nics", "2", "-S", "64k", "--pages", "1024",
                          "--requests", "4", "--repeat", "8", "--timeout", "4"})
    long_transfer.push_back(arg);
  // (1) The client dies.
  {
    Process victim(mc.On("B", long_transfer));
    ASSERT_TRUE(WaitForOutput(*server, "client 1 connected", 20s)) << server->Output();
    std::this_thread::sleep_for(1s);
    victim.Signal(SIGKILL);  // minicluster exec execs: the process is the client itself
    Result dead = victim.Wait(10s);
    EXPECT_NE(dead.exit_code, 0);
    ASSERT_TRUE(WaitForOutput(*server, "client 1 lost: ", 20s)) << server->Output();
  }
  Result next = RunToEnd(
      mc.On("B", {StageBinary("07_full_p5"), "-p", "tcp", address, "--memory", "host", "--nics",
                  "2", "-S", "64k", "--pages", "64", "--requests", "2", "--json"}),
      60s);
  EXPECT_EQ(next.exit_code, 0) << next.out << next.err << server->Output();
  EXPECT_EQ(NumberAfter(next.out, "\"verified_bytes\":"), 64LL * 65536 * 2) << next.out;
  // (2) The server dies mid-transfer: its client says so and exits 1 within its timeout.
  Process client(mc.On("B", long_transfer));
  ASSERT_TRUE(WaitForOutput(*server, "client 3 connected", 20s)) << server->Output();
  std::this_thread::sleep_for(1s);
  server->Signal(SIGKILL);
  server->Wait(10s);
  const auto start = std::chrono::steady_clock::now();
  Result orphan = client.Wait(30s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  std::printf("the client of the killed server said: %s", orphan.err.c_str());
  if (FI_MAJOR(fi_version()) >= 2 && orphan.err.find("signal 11") != std::string::npos) {
    // libfabric 2.x's ofi_rxm (2.6.0: prov/rxm/src/rxm_cq.c, rxm_handle_comp_error) switches
    // on the op_context of the error entry that tcp reports for a remote WRITE cut off by the
    // writer's death; that context is NULL, and the target crashes inside fi_cq_read. 1.17
    // reports the same loss without crashing. A provider bug, not one a program can catch:
    // 07's README says so. What still holds: the client ended, in bounded time.
    std::printf("known libfabric 2.x rxm crash on a writer's death (07 README)\n");
  } else {
    EXPECT_EQ(orphan.exit_code, 1) << orphan.out << orphan.err;
    EXPECT_NE(orphan.err.find("07_full_p5: error: "), std::string::npos) << orphan.err;
    EXPECT_EQ(orphan.err.find("signal"), std::string::npos) << orphan.err;
    EXPECT_EQ(orphan.err.find("Backtrace"), std::string::npos) << orphan.err;
  }
}

// One engine, many peers, across the namespaces: one long transfer runs while other clients
// join, finish and get killed around it. Every page of every client that ran to its end is
// verified, and the long one's rate in each second (its progress lines) never falls below its
// fair share minus 20% (half of it in a second when a client comes or goes): what server A's
// links carried in that second, over the clients the test had running then. The links'
// bytes, not the rate the long one had alone, are the whole: on a host whose cores are busy
// the processes, not the links, may set the rate, for every client alike.
struct Interval {
  double end_s, gbps;
};
std::vector<Interval> RatesEachSecond(const std::string& out) {
  std::vector<Interval> rates;
  for (size_t at = out.find("progress: "); at != std::string::npos;
       at = out.find("progress: ", at + 1)) {
    const std::string line = out.substr(at, out.find('\n', at) - at);
    const size_t last = line.find("; last ");
    if (last == std::string::npos) continue;
    rates.push_back({std::stod(line.substr(10)), DecimalAfter(line.substr(last), ": ")});
  }
  return rates;
}
// The bytes a process's network namespace has sent on some of its interfaces, sampled every
// 100 ms (/proc/PID/net/dev is that namespace's table) on the test's clock.
class LinkSampler {
 public:
  LinkSampler(pid_t pid, std::vector<std::string> nics, std::function<double()> now_s)
      : thread_([this, pid, nics, now_s] {
          while (!stop_) {
            const long long bytes = TxBytes(pid, nics);
            if (bytes >= 0) {
              std::lock_guard lock(mutex_);
              samples_.push_back({now_s(), bytes});
            }
            std::this_thread::sleep_for(100ms);
          }
        }) {}
  ~LinkSampler() {
    stop_ = true;
    thread_.join();
  }
  // Gbit/s sent in [from, to), interpolated between samples; -1 outside them.
  double Gbps(double from, double to) {
    std::lock_guard lock(mutex_);
    const double a = BytesAt(from), b = BytesAt(to);
    return a < 0 || b < 0 ? -1 : (b - a) * 8 / 1e9 / (to - from);
  }

 private:
  static long long TxBytes(pid_t pid, const std::vector<std::string>& nics) {
    std::ifstream dev("/proc/" + std::to_string(pid) + "/net/dev");
    long long sum = 0;
    size_t found = 0;
    for (std::string line; std::getline(dev, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (std::find(nics.begin(), nics.end(), name) == nics.end()) continue;
      std::istringstream fields(line.substr(colon + 1));
      long long v[9] = {};  // receive: 8 fields, then transmit bytes
      for (auto& x : v) fields >> x;
      sum += v[8];
      ++found;
    }
    return found == nics.size() ? sum : -1;
  }
  double BytesAt(double t) const {
    for (size_t i = 1; i < samples_.size(); ++i) {
      const auto& [t0, b0] = samples_[i - 1];
      const auto& [t1, b1] = samples_[i];
      if (t >= t0 && t <= t1)
        return static_cast<double>(b0) + (t - t0) / (t1 - t0) * static_cast<double>(b1 - b0);
    }
    return -1;
  }
  std::mutex mutex_;
  std::vector<std::pair<double, long long>> samples_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};
TEST(Cluster, ClientsComeAndGoAroundALongTransfer) {
  MiniCluster mc(2, 200);  // the links, not 2 busy cores, set the rate
  ASSERT_TRUE(mc.ok()) << mc.log();
  TempDir dir;
  const std::string address_file = dir.path() + "/addr";
  // Its processes, server and clients alike, come before the suite's other tests on the
  // host's 2 cores (nice -10): the seconds it judges are then what the engine and the churn
  // did, not whichever other test started beside them (CI had a churn second at 74%).
  const auto first = [&](const char* host, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"nice", "-n", "-10"});
    return mc.On(host, std::move(argv));
  };
  Process server(first("A", {StageBinary("07_full_p5"), "-p", "tcp", "--memory", "host", "--nics",
                             "2", "--peer-timeout", "3", "--address-file", address_file}));
  const std::string address = WaitForLine(address_file, 20s);
  ASSERT_FALSE(address.empty()) << server.Output();
  auto client = [&](const char* repeat, const char* seed) {
    return first("B", {StageBinary("07_full_p5"),
                       "-p",
                       "tcp",
                       address,
                       "--memory",
                       "host",
                       "--nics",
                       "2",
                       "-S",
                       "64k",
                       "--pages",
                       "512",
                       "--requests",
                       "4",
                       "--repeat",
                       repeat,
                       "--seed",
                       seed,
                       "--timeout",
                       "10",
                       "--progress-every",
                       "1",
                       "--json"});
  };
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const std::function<double()> now_s = [t0] {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  LinkSampler links(server.pid(), {mc.name() + "a0", mc.name() + "a1"}, now_s);
  // When the test had each other client running: [from, to) on its own clock.
  std::vector<std::pair<double, double>> others;
  Process long_one(client("8", "1"));  // 1 GiB: about 21 s alone at 2 x 200 Mbit/s
  ASSERT_TRUE(WaitForOutput(long_one, "progress: ", 30s)) << long_one.Errors() << server.Output();
  const double long_from = now_s();
  std::this_thread::sleep_for(4s);  // alone
  double from = now_s();
  Process joins(client("1", "2"));  // joins and finishes
  // Each client counted as in once the server says so: on a busy host a client's set-up (its
  // lanes, its 256 MiB region) can take seconds, and a victim killed before it connected is
  // no client that went.
  ASSERT_TRUE(WaitForOutput(server, "client 2 connected", 30s)) << server.Output();
  std::this_thread::sleep_for(3s);
  const double killed_from = now_s();
  double killed_at = 0;  // a kill is a client going: a moment of change of its own
  {
    Process victim(client("4", "3"));  // joins and is killed
    ASSERT_TRUE(WaitForOutput(server, "client 3 connected", 30s)) << server.Output();
    std::this_thread::sleep_for(4s);
    killed_at = now_s();
    victim.Signal(SIGKILL);
    EXPECT_NE(victim.Wait(10s).exit_code, 0);
  }
  others.push_back({killed_from, now_s() + 1});  // its share frees within a second
  Result joined = joins.Wait(60s);
  others.push_back({from, now_s()});
  EXPECT_EQ(joined.exit_code, 0) << joined.out << joined.err;
  EXPECT_EQ(NumberAfter(joined.out, "\"verified_bytes\":"), 512LL * 65536 * 4) << joined.out;
  from = now_s();
  Result late = RunToEnd(client("1", "4"), 60s);  // joins late and finishes
  others.push_back({from, now_s()});
  EXPECT_EQ(late.exit_code, 0) << late.out << late.err;
  EXPECT_EQ(NumberAfter(late.out, "\"verified_bytes\":"), 512LL * 65536 * 4) << late.out;

  Result r = long_one.Wait(120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << server.Output();
  EXPECT_EQ(NumberAfter(r.out, "\"verified_bytes\":"), 512LL * 65536 * 4) << r.out;
  EXPECT_TRUE(WaitForOutput(server, "client 3 lost: ", 20s)) << server.Output();
  // The long client's clock starts about when its first progress line's second began.
  const std::vector<Interval> rates = RatesEachSecond(r.err);  // --json: progress on stderr
  ASSERT_GE(rates.size(), 10u) << r.out;
  const double offset = long_from - rates.front().end_s;
  // Its seconds alone: its rate, and what the links carried (the whole churn may not starve).
  std::vector<double> alone, links_alone;
  for (size_t k = 1; k < rates.size(); ++k) {  // after the first line's start (below)
    const double end = rates[k].end_s + offset;
    if (end >= long_from + 4 - 0.5) continue;
    alone.push_back(rates[k].gbps);
    links_alone.push_back(links.Gbps(end - 1, end));
  }
  ASSERT_FALSE(alone.empty()) << r.out;
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double full = median(alone), links_full = median(links_alone);
  ASSERT_GT(links_full, 0) << "no link counters while it was alone";
  // The first line's interval holds the start (CONNECT, the server filling its first pages),
  // which is slower than the steady rate; the last may end the transfer.
  std::vector<std::pair<double, bool>> each_second;  // what the links carried; churn in it
  std::string seconds;  // each second's end and what the links carried, * when churn was in it
  for (size_t k = 1; k + 1 < rates.size(); ++k) {
    const double end = rates[k].end_s + offset, begin = end - 1;
    int running = 1;  // the long one, and whoever ran at any time in this second, give or take
    // A client came or went within a second of it.
    bool changing = std::abs(killed_at - begin) < 1.5 || std::abs(killed_at - end) < 1.5;
    for (const auto& [a, b] : others) {
      running += a - 1 < end && b + 1 > begin;
      changing |= std::abs(a - begin) < 1.5 || std::abs(a - end) < 1.5 ||
                  std::abs(b - begin) < 1.5 || std::abs(b - end) < 1.5;
    }
    // Steady: its fair share less 20% (on a host whose cores are busy with other work, the
    // scheduler lets one flow lag another by over 10% in a second). In a second when a client
    // comes or goes, the flows on the links settle for a moment (a newcomer's TCP connection
    // takes more for a second): not stalled, at least half its share.
    const double carried = links.Gbps(begin, end);
    ASSERT_GT(carried, 0) << "no link counters for the second ending at " << end << " s";
    const double least = carried / running * (changing ? 0.5 : 0.8);
    EXPECT_GE(rates[k].gbps, least)
        << "second ending at " << end << " s: " << running << " clients running"
        << (changing ? ", one coming or going" : "") << ", the links carried " << carried
        << " Gbps; alone it had " << full << " Gbps\n"
        << r.out;
    each_second.push_back({carried, changing});
    char second[48];
    std::snprintf(second, sizeof second, "%s%.1fs %.3f%s", k % 8 == 1 ? "\n  " : " ", end, carried,
                  changing ? "*" : "");
    seconds += second;
    // The engine as a whole: a client coming or going may slow the links for a moment, but
    // over any 3 seconds they carry at least half of what they did with the long one alone.
    if (k < 2) continue;
    const double three = links.Gbps(begin - 2, end);
    EXPECT_GE(three, links_full * 0.5) << "the 3 seconds ending at " << end << " s: links " << three
                                       << " Gbps, with one client " << links_full;
  }
  // Churn costs no dip: in a second when a client joins, leaves or is killed the links carry
  // at least 95% of their steady rate (the median second of this run, so that a loaded host
  // sets both). Set-up is off the data thread: its pages exist before any request, AV inserts
  // and the newcomer's connections take no round's time.
  // A host busy with other work (the suite's other tests) takes seconds of its own, churn or
  // not: a churn second below 95% of the median is the engine's only if it is below the least
  // second without churn too.
  std::vector<double> all;
  double least_changing = 1e9, least_quiet = 1e9;
  for (const auto& [carried, changing] : each_second) {
    all.push_back(carried);
    double& least = changing ? least_changing : least_quiet;
    least = std::min(least, carried);
  }
  const double steady = median(all);
  std::printf(
      "links: steady %.3f Gbps (the median second), least in a second of churn %.3f (%.1f%%), "
      "least without churn %.3f; each second (its end, Gbps, * churn; joins at %.1f, %.1f, %.1f "
      "s, leaves at %.1f, %.1f s, a kill at %.1f s):%s\n",
      steady, least_changing, 100 * least_changing / steady, least_quiet, others[1].first,
      others[0].first, others[2].first, others[1].second, others[2].second, killed_at,
      seconds.c_str());
  EXPECT_GE(least_changing, std::min(0.95 * steady, least_quiet))
      << "a client coming or going idled the links: " << least_changing << " of " << steady
      << " Gbps in that second";
}

// A p5 dress rehearsal: 32 NICs, and both sides reading the p5's topology (--topology
// tests/data/p5.xml) so that 07 pairs, groups, threads and places as it would there: 8 groups
// of 4 lanes under the GPUs' switches, a thread per group (one for the first rungs, with a
// source buffer per group as published), every rung of the ladder, every page verified.
// Correctness and the plan's p5 shape, not speed (2 cores carry 64 endpoints and 16 threads).
TEST(Cluster, P5DressRehearsal) {
  MiniCluster mc(32, 0);
  ASSERT_TRUE(mc.ok()) << mc.log();
  // ofi_rxm zeroes 17 MB of eager buffers (1024 of its 16 KiB FI_OFI_RXM_BUFFER_SIZE) per
  // endpoint when it is enabled and 17 MB more at its first connection, and 2.x's tcp provider
  // 17 MB more (FI_TCP_MAX_RX_SIZE): 9 rungs of 64 endpoints zeroed 20-30 GB, most of this
  // test's 84-174 s on 2 cores. With 2 KiB buffers, real settings of the same providers
  // (messages over 2 KiB then take rxm's rendezvous path), it checks the same plan and pages in
  // 30-45 s (1.17 and 2.6), as tests/meson.build does for the e2e suite.
  setenv("FI_OFI_RXM_BUFFER_SIZE", "2048", 1);
  setenv("FI_TCP_MAX_RX_SIZE", "2048", 1);
  struct Unset {
    ~Unset() {
      unsetenv("FI_OFI_RXM_BUFFER_SIZE");
      unsetenv("FI_TCP_MAX_RX_SIZE");
    }
  } unset;
  const std::string fixture = std::string(std::getenv("E2E_SOURCE_DIR")) + "/tests/data/p5.xml";
  Result server;
  // The server's --peer-timeout as the client's --timeout: its one data thread of the first
  // rungs opens 32 tcp connections on its first WRITEs, and with both cores busy (a loaded
  // 2.6 run) it went 10 s without a WRITE completing, so that it took the client for silent.
  Result client = Transfer(
      mc, "07_full_p5", {"--topology", fixture, "--exit-after", "9", "--peer-timeout", "60"},
      {"--topology", fixture, "-S", "16k", "--pages", "256", "--requests", "2", "--ladder",
       "--runs", "1", "--min-seconds", "0", "--json", "--timeout", "60"},
      &server, 480s);  // 9 sessions of 64 lanes: 15-20 s each, cores busy
  ASSERT_EQ(client.exit_code, 0) << client.out << client.err << server.out << server.err;
  EXPECT_EQ(server.exit_code, 0) << server.err;
  const std::string b = mc.name() + "b";
  // The header line as on a p5: the published table's groups, this host's NICs in them.
  EXPECT_NE(client.err.find("GPUs: 8, NICs: 32"), std::string::npos) << client.err;
  EXPECT_NE(client.err.find("cuda:0(53:00.0) NUMA0 CPU 0-11 " + b + "0 (4f:00.0) " + b +
                            "1 (50:00.0) " + b + "2 (51:00.0) " + b + "3 (52:00.0)\n"),
            std::string::npos)
      << client.err;
  EXPECT_NE(client.err.find("cuda:7(ca:00.0) NUMA1 CPU 84-95 " + b + "28 (c6:00.0)"),
            std::string::npos)
      << client.err;
  // Nine rungs, each of 32 lanes, each verified.
  size_t rungs = 0;
  for (size_t at = client.out.find("{\"record\":\"client\""); at != std::string::npos;
       at = client.out.find("{\"record\":\"client\"", at + 1)) {
    const std::string json = client.out.substr(at, client.out.find('\n', at) - at);
    EXPECT_EQ(NumberAfter(json, "\"verified_bytes\":"), 256LL * 16384 * 2) << json;
    EXPECT_EQ(NumberAfter(json, "\"lanes\":"), 32) << json;
    ++rungs;
  }
  EXPECT_EQ(rungs, 9u) << client.out;
  // The server's plan: one thread with a buffer per group, then a thread per group, each
  // planned on its group's first core and NUMA node (cuda:7's: core 84, node 1).
  EXPECT_NE(server.out.find("32 lanes, 1 thread, not pinned"), std::string::npos) << server.out;
  EXPECT_NE(server.out.find("source memory in 8 buffers"), std::string::npos) << server.out;
  EXPECT_NE(server.out.find("32 lanes, 8 threads, pinned"), std::string::npos) << server.out;
  EXPECT_NE(server.out.find("planned: cpu 0, memory on node 0"), std::string::npos) << server.out;
  EXPECT_NE(server.out.find("planned: cpu 84, memory on node 1"), std::string::npos) << server.out;
  std::printf("%s%s", client.err.c_str(), client.out.c_str());
  // The server's set-up time per rung (32 lanes opened on 2 cores), for whoever reads the log.
  for (size_t at = server.out.find(" connected: "); at != std::string::npos;
       at = server.out.find(" connected: ", at + 1)) {
    const size_t from = server.out.rfind('\n', at) + 1;
    std::printf("server: %s\n", server.out.substr(from, server.out.find('\n', at) - from).c_str());
  }

  // One process per GPU, as many p5 jobs run: CUDA_VISIBLE_DEVICES=3 on both sides (the client
  // picks that one again by --gpus 0, its index among those it sees): GPU 3's 4 NICs, one
  // thread, a 400 Gbps header, the other 28 NICs left to the other GPUs' processes.
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  Result one_server;
  Result one = Transfer(mc, "07_full_p5", {"--topology", fixture},
                        {"--topology", fixture, "--gpus", "0", "-S", "16k", "--pages", "64",
                         "--requests", "2", "--json", "--timeout", "60"},
                        &one_server);
  unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err << one_server.out << one_server.err;
  for (const auto& [header, h] :
       {std::pair{one.err, b}, std::pair{one_server.out, mc.name() + "a"}}) {
    EXPECT_NE(header.find("GPUs: 1, NICs: 4, "), std::string::npos) << header;
    EXPECT_NE(header.find("cuda:0(86:00.0) NUMA0 CPU 0-47 " + h + "12 (82:00.0) " + h +
                          "13 (83:00.0) " + h + "14 (84:00.0) " + h + "15 (85:00.0)\n"),
              std::string::npos)
        << header;
    EXPECT_NE(header.find("28 other NICs under GPUs this process does not use"), std::string::npos)
        << header;
  }
  EXPECT_EQ(NumberAfter(one.out, "\"lanes\":"), 4) << one.out;
  EXPECT_EQ(NumberAfter(one.out, "\"verified_bytes\":"), 64LL * 16384 * 2) << one.out;
  EXPECT_NE(one_server.out.find("4 lanes, 1 thread"), std::string::npos) << one_server.out;
}

TEST(Cluster, NoNamespaceLeftBehind) {
  std::string name;
  {
    MiniCluster mc(2, 100);
    ASSERT_TRUE(mc.ok()) << mc.log();
    name = mc.name();
    EXPECT_TRUE(std::filesystem::exists("/run/netns/" + name + "-a"));
  }
  EXPECT_FALSE(std::filesystem::exists("/run/netns/" + name + "-a"));
  EXPECT_FALSE(std::filesystem::exists("/run/netns/" + name + "-b"));
}

}  // namespace

int main(int argc, char** argv) {
  if (geteuid() != 0) {
    std::printf("cluster suite skipped: needs root (network namespaces, veth, tc)\n");
    return 77;
  }
  if (RunToEnd({"/bin/sh", "-c", "command -v ip && command -v tc"}, 10s).exit_code != 0) {
    std::printf("cluster suite skipped: needs iproute2 (ip, tc)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
