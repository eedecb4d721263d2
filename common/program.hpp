// What every program's main does around its lesson: turn exceptions into one line and an
// exit code (after destructors ran), and turn SIGINT/SIGTERM into a stop request.
#pragma once

#include <functional>
#include <string>

namespace common {

// Runs `body`; an exception is printed as "NAME: error: MESSAGE" and mapped to its exit
// code (UsageError 2, HardwareAbsent 77, anything else 1).
int RunProgram(const char* name, const std::function<int()>& body);
// The NAME RunProgram was given ("program" before): the lines said for it carry it.
const char* ProgramName();

// -v: diagnostics are printed (dropped messages, unanswered CONNECTs, stalled threads); a
// normal run prints nothing that reads like a failure where nothing failed.
void SetVerbose(bool verbose);
// A diagnostic line, printf-style: printed with -v only.
void Diagnostic(const char* format, ...) __attribute__((format(printf, 1, 2)));

// After this, SIGINT and SIGTERM only set a flag that StopRequested() returns, so loops
// end cleanly and every handle is closed; if the program is still running
// kStopGraceSeconds later (stuck inside a provider call), it exits with one line and code 1.
inline constexpr double kStopGraceSeconds = 5;
void InstallStopHandlers(const char* program);
bool StopRequested();

// A client whose server or NIC is lost ends here, at once: "NAME: error: WHY" and exit 1,
// without closing its endpoints. Closing an endpoint with operations still in flight is not
// safe with every provider (libfabric 1.17's tcp;ofi_rxm crashed in fi_close), and the
// process is ending anyway. Its shm regions, which the kernel does not free, are removed.
[[noreturn]] void Abandon(const char* program, const std::string& why);

}  // namespace common
