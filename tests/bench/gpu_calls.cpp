// What libfabric's shm provider (2.x) asks of CUDA for each WRITE of GPU memory, timed from
// 1, 2, 4 ... threads at once, each thread with buffers of its own on one GPU, as 07's data
// threads and receivers are. Read from the provider's source (prov/shm/src, src/hmem_cuda.c):
//   sender, per WRITE (smr_format_ipc): cuMemGetAddressRange (the allocation's base), then
//     cudaIpcGetMemHandle on it, to name the memory to the peer;
//   receiver, per WRITE (smr_progress_ipc -> cuda_copy_to_dev): cudaMemcpy(dst, src, page,
//     cudaMemcpyDefault), device to device, on the legacy default stream, which every thread
//     of a process shares;
//   and, for comparison, the same copy as cudaMemcpyAsync on a stream of the thread's own
//     (what the provider does not do).
// Each case runs --seconds per thread count; prints calls per second over all threads, and for
// the copies Gbps, with every copy finished (the device synchronized) before the clock stops.
//   gpu_calls [-S 64k] [--threads 1,2,4,8] [--seconds 0.5] [--json]   (exit 77 without a GPU)
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "error.hpp"
#include "options.hpp"
#include "program.hpp"
#include "report.hpp"

#ifdef HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

using namespace common;

namespace {

#ifdef HAVE_CUDA
void Check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) throw Error(std::string(call) + ": " + cudaGetErrorString(rc));
}

using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
GetAddressRange LookUpGetAddressRange() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  Check(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found),
        "cudaGetDriverEntryPointByVersion");
#else
  Check(cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &found),
        "cudaGetDriverEntryPoint");
#endif
  if (found != cudaDriverEntryPointSuccess) throw Error("this driver has no cuMemGetAddressRange");
  return reinterpret_cast<GetAddressRange>(fn);
}

// One thread's buffers: a source and a destination of `pages` pages, cudaMalloc'd.
struct ThreadBuffers {
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t stream = nullptr;
};

// Runs `call(thread, i)` in `threads` threads for `seconds`; returns calls per second in all.
// The clock stops after cudaDeviceSynchronize, so queued copies are counted only once done.
double Rate(size_t threads, double seconds, const std::function<void(size_t, uint64_t)>& call) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<size_t> ready{0};
  std::vector<uint64_t> counts(threads * 8);  // a cache line apart
  std::vector<std::thread> pool;
  std::string failure;
  std::atomic<bool> failed{false};
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      cudaSetDevice(0);  // the thread's context current before its first call
      ++ready;
      while (!go) std::this_thread::yield();
      uint64_t n = 0;
      try {
        while (!stop) call(t, n++);
      } catch (const std::exception& e) {
        if (!failed.exchange(true)) failure = e.what();
      }
      counts[t * 8] = n;
    });
  while (ready < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed) throw Error(failure);
  uint64_t total = 0;
  for (size_t t = 0; t < threads; ++t) total += counts[t * 8];
  return static_cast<double>(total) / elapsed;
}

int Run(uint64_t page, const std::vector<size_t>& thread_counts, double seconds, bool json) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw HardwareAbsent("no CUDA device on this machine");
  Check(cudaSetDevice(0), "cudaSetDevice");
  const GetAddressRange get_range = LookUpGetAddressRange();
  constexpr uint64_t kPages = 256;  // per thread: 16 MiB of 64 KiB pages, beyond the L2
  size_t most = 0;
  for (size_t t : thread_counts) most = std::max(most, t);
  std::vector<ThreadBuffers> buffers(most);
  for (auto& b : buffers) {
    Check(cudaMalloc(&b.src, kPages * page), "cudaMalloc");
    Check(cudaMalloc(&b.dst, kPages * page), "cudaMalloc");
    Check(cudaMemset(b.src, 1, kPages * page), "cudaMemset");
    Check(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  auto at = [&](void* base, uint64_t i) { return static_cast<char*>(base) + (i % kPages) * page; };
  struct Case {
    const char* name;
    bool copies;
    std::function<void(size_t, uint64_t)> call;
  };
  const std::vector<Case> cases = {
      {"sender: cuMemGetAddressRange + cudaIpcGetMemHandle", false,
       [&](size_t t, uint64_t i) {
         CUdeviceptr base = 0;
         size_t size = 0;
         if (get_range(&base, &size, reinterpret_cast<CUdeviceptr>(at(buffers[t].src, i))) !=
             CUDA_SUCCESS)
           throw Error("cuMemGetAddressRange failed");
         cudaIpcMemHandle_t handle;
         Check(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle");
       }},
      {"receiver: cudaMemcpy on the legacy default stream", true,
       [&](size_t t, uint64_t i) {
         Check(cudaMemcpy(at(buffers[t].dst, i), at(buffers[t].src, i), page, cudaMemcpyDefault),
               "cudaMemcpy");
       }},
      {"for comparison: cudaMemcpyAsync on the thread's own stream", true,
       [&](size_t t, uint64_t i) {
         Check(cudaMemcpyAsync(at(buffers[t].dst, i), at(buffers[t].src, i), page,
                               cudaMemcpyDefault, buffers[t].stream),
               "cudaMemcpyAsync");
         if (i % 64 == 63) Check(cudaStreamSynchronize(buffers[t].stream), "cudaStreamSynchronize");
       }},
  };
  for (const auto& c : cases) {
    double one = 0;
    for (size_t t : thread_counts) {
      const double rate = Rate(t, seconds, c.call);
      if (t == thread_counts.front()) one = rate / static_cast<double>(t);
      const double gbps = c.copies ? rate * static_cast<double>(page) * 8 / 1e9 : 0;
      if (json)
        std::printf(
            "{\"case\":\"%s\",\"threads\":%zu,\"page_bytes\":%llu,\"calls_per_s\":%.0f,"
            "\"gbps\":%.3f}\n",
            c.name, t, static_cast<unsigned long long>(page), rate, gbps);
      else
        std::printf("%-60s %2zu threads: %10.0f calls/s (%.2fx one thread)%s\n", c.name, t, rate,
                    one > 0 ? rate / one : 0,
                    c.copies ? (", " + std::to_string(gbps).substr(0, 8) + " Gbps").c_str() : "");
      std::fflush(stdout);
    }
  }
  for (auto& b : buffers) {
    cudaStreamDestroy(b.stream);
    cudaFree(b.src);
    cudaFree(b.dst);
  }
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  uint64_t page = 64 * 1024;
  std::vector<size_t> counts = {1, 2, 4, 8};
  double seconds = 0.5;
  bool json = false;
  CLI::App app{
      "What libfabric's shm provider asks of CUDA for each WRITE of GPU memory, timed "
      "from several threads at once",
      "gpu_calls"};
  app.add_option_function<std::string>(
      "-S,--page-size", [&](const std::string& s) { page = ParseSize(s, "--page-size"); },
      "Bytes per copy (default 64k)");
  app.add_option("--threads", counts, "Thread counts, comma-separated (default 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "Seconds per case and thread count (default 0.5)")
      ->check(CLI::Range(0.01, 60.0));
  app.add_flag("--json", json, "JSON lines");
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  return RunProgram("gpu_calls", [&]() -> int {
#ifdef HAVE_CUDA
    return Run(page, counts, seconds, json);
#else
    (void)page;
    (void)seconds;
    (void)json;
    throw HardwareAbsent("built without CUDA (meson setup -Dcuda=enabled)");
#endif
  });
}
