// What every program's main does around its lesson: turn exceptions into one line and an
// exit code (after destructors ran), and turn SIGINT/SIGTERM into a stop request.
#pragma once

#include <functional>

namespace common {

// Runs `body`; an exception is printed as "NAME: error: MESSAGE" and mapped to its exit
// code (UsageError 2, HardwareAbsent 77, anything else 1).
int RunProgram(const char* name, const std::function<int()>& body);

// After this, SIGINT and SIGTERM only set a flag that StopRequested() returns, so loops
// end cleanly and every handle is closed.
void InstallStopHandlers();
bool StopRequested();

}  // namespace common
