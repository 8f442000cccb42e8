#include "trainer/observe/event_file.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/byte_codec.h"
#include "common/errors.h"
#include "common/host_name.h"
#include "tfevents.pb.h"  // generated from tfevents.proto in the build folder

namespace partrain {
namespace {

// Written out before flush() once this much is buffered, so that a long epoch's steps do not
// pile up in memory.
constexpr std::size_t kMaxBuffered = std::size_t{1} << 20;

// What TensorBoard's writers put in the first record; readers check the "brain.Event:" prefix.
constexpr const char* kFileVersion = "brain.Event:2";

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void append_event(std::string& out, const tfevents::Event& event) {
  std::string data;
  event.SerializeToString(&data);
  out += frame_event_record(data);
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view bytes) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  const std::uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame_event_record(std::string_view data) {
  std::string record(8 + 4 + data.size() + 4, '\0');
  char* p = record.data();
  put_le<std::uint64_t>(p, data.size());
  put_le<std::uint32_t>(p + 8, masked_crc32c(std::string_view(p, 8)));
  std::memcpy(p + 12, data.data(), data.size());
  put_le<std::uint32_t>(p + 12 + data.size(), masked_crc32c(data));
  return record;
}

EventFile::EventFile(const std::string& dir)
    : EventFile(AtPath{}, dir + "/events.out.tfevents." +
                              std::to_string(static_cast<long long>(unix_seconds_now())) + "." +
                              this_host_name() + "." + std::to_string(::getpid())) {}

EventFile EventFile::at_path(const std::string& path) { return EventFile(AtPath{}, path); }

EventFile::EventFile(AtPath, const std::string& path) : path_(path) {
  file_ = std::fopen(path_.c_str(), "wb");
  PARTRAIN_CHECK(file_ != nullptr, UsageError, "cannot create ", path_, ": ", std::strerror(errno));
  tfevents::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_file_version(kFileVersion);
  append_event(buffer_, event);
}

EventFile::EventFile(EventFile&& other) noexcept
    : path_(std::move(other.path_)),
      file_(std::exchange(other.file_, nullptr)),
      buffer_(std::move(other.buffer_)) {}

EventFile::~EventFile() {
  flush();
  if (file_ != nullptr) std::fclose(file_);
}

void EventFile::add(std::int64_t step, const std::vector<TaggedScalar>& values, double wall_time) {
  if (file_ == nullptr) return;
  tfevents::Event event;
  event.set_wall_time(wall_time < 0 ? unix_seconds_now() : wall_time);
  event.set_step(step);
  tfevents::Summary* summary = event.mutable_summary();
  for (const TaggedScalar& v : values) {
    tfevents::Summary::Value* value = summary->add_value();
    value->set_tag(v.tag);
    value->set_simple_value(static_cast<float>(v.value));
  }
  append_event(buffer_, event);
  if (buffer_.size() >= kMaxBuffered) flush();
}

void EventFile::flush() {
  if (file_ == nullptr) return;
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    give_up(std::strerror(errno));
    return;
  }
  buffer_.clear();
  if (std::fflush(file_) != 0) give_up(std::strerror(errno));
}

void EventFile::give_up(const char* what) {
  std::fprintf(stderr,
               "partrain: writing %s failed (%s); TensorBoard events stop here, training goes "
               "on\n",
               path_.c_str(), what);
  std::fclose(file_);
  file_ = nullptr;
  buffer_.clear();
}

}  // namespace partrain
