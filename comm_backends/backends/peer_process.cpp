#include "comm_backends/backends/peer_process.h"

#include <charconv>
#include <mutex>
#include <type_traits>
#include <vector>

#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "common/byte_codec.h"
#include "common/process_state.h"

namespace partrain::comm {

namespace {

template <typename T>
std::optional<T> number(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

ProcessMark read_this_process() {
  ProcessMark mark;
  mark.pid = current_process_id();
  mark.user = current_user_id();
  mark.started = process_start_ticks(mark.pid);  // each of these empty where not known
  mark.kernel = kernel_identity();
  mark.pid_space = pid_namespace();
  return mark;
}

}  // namespace

ProcessMark this_process() {
  // Read once a process: the ranks of `bench rendezvous` are threads of a few processes, and a
  // forked child has a mark of its own (a new pid, a new start time).
  static std::mutex mutex;
  static std::optional<ProcessMark> kept;
  std::lock_guard<std::mutex> lock(mutex);
  if (!kept || kept->pid != current_process_id()) kept = read_this_process();
  return *kept;
}

std::string encode_process_mark(const ProcessMark& mark) {
  return "pid=" + std::to_string(mark.pid) + " started=" + std::to_string(mark.started) +
         " kernel=" + mark.kernel + " pidns=" + std::to_string(mark.pid_space) +
         " uid=" + std::to_string(mark.user);
}

std::optional<ProcessMark> decode_process_mark(std::string_view text) {
  ProcessMark mark;
  int seen = 0;  // one bit a field
  // Reads `value` into `field` as a number; false where it is none.
  const auto read = [](std::string_view value, auto& field) {
    const auto parsed = number<std::remove_reference_t<decltype(field)>>(value);
    if (parsed) field = *parsed;
    return parsed.has_value();
  };
  while (!text.empty()) {
    const auto space = text.find(' ');
    const std::string_view item = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    const auto equals = item.find('=');
    if (equals == std::string_view::npos) return std::nullopt;
    const std::string_view key = item.substr(0, equals);
    const std::string_view value = item.substr(equals + 1);
    bool ok = true;
    if (key == "pid") {
      ok = read(value, mark.pid);
      seen |= 1;
    } else if (key == "started") {
      ok = read(value, mark.started);
      seen |= 2;
    } else if (key == "kernel") {
      mark.kernel = std::string(value);
      seen |= 4;
    } else if (key == "pidns") {
      ok = read(value, mark.pid_space);
      seen |= 8;
    } else if (key == "uid") {
      ok = read(value, mark.user);
      seen |= 16;
    }  // a field of a later build: skipped
    if (!ok) return std::nullopt;
  }
  if (seen != 31) return std::nullopt;
  return mark;
}

std::string process_key(int rank) { return "ranks/process/" + std::to_string(rank); }

void publish_process_on_join(StoreOptions& options, int rank) {
  const std::string text = encode_process_mark(this_process());
  options.join_key = process_key(rank);
  options.join_value.assign(text.begin(), text.end());
}

std::optional<std::string> look_at_process(const ProcessMark& mark,
                                           std::chrono::milliseconds window) {
  const ProcessMark mine = this_process();
  if (mark.kernel.empty() || mark.kernel != mine.kernel || mark.pid_space == 0 ||
      mark.pid_space != mine.pid_space || mark.pid <= 0 || mark.started == 0) {
    return std::nullopt;
  }
  // Another user's processes may be hidden from this one (/proc mounted with hidepid): one that
  // cannot be seen at all is not known to have ended.
  if (mark.user != mine.user && process_start_ticks(mark.pid) == 0) return std::nullopt;
  const auto state = watch_process(mark.pid, mark.started, window);
  if (!state) return std::nullopt;
  return describe_process_state(*state, mark.pid);
}

std::optional<std::string> look_at_rank_process(Store& store, int rank,
                                                std::chrono::milliseconds bound) {
  try {
    const auto published = try_get(store, process_key(rank), bound);
    if (!published) return std::nullopt;
    const auto mark = decode_process_mark(bytes_as_text(*published));
    if (!mark) return std::nullopt;
    const auto seen = look_at_process(*mark);
    if (!seen) return std::nullopt;
    return "rank " + std::to_string(rank) + " (pid " + std::to_string(mark->pid) +
           ", this machine) " + *seen;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace partrain::comm
