#include "completion.hpp"

namespace common {

CompletionError ReadCompletionError(fid_cq* cq) {
  fi_cq_err_entry entry{};
  CompletionError error;
  const ssize_t rc = fi_cq_readerr(cq, &entry, 0);
  if (rc < 0) {
    error.err = static_cast<int>(-rc);
    error.text = std::string("fi_cq_readerr: ") + fi_strerror(error.err);
    return error;
  }
  char detail[256] = "";
  const char* text = fi_cq_strerror(cq, entry.prov_errno, entry.err_data, detail, sizeof(detail));
  error.op_context = entry.op_context;
  error.flags = entry.flags;
  error.err = entry.err;
  error.text = fi_strerror(entry.err);
  if (text != nullptr && *text != '\0') error.text += std::string(" (") + text + ")";
  return error;
}

}  // namespace common
