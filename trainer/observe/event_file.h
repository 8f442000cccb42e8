// defines: EventFile — a TensorBoard event file (events.out.tfevents.<secs>.<host>.<pid>) of
// scalar summaries, and its record framing (frame_event_record, masked_crc32c). LibTorch-free;
// the Event and Summary messages come from tfevents.proto, kept out of this header.
//
// A record is
//   uint64 length | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data
// all little-endian, where data is one serialised Event. The first Event names the file's
// version; every other one holds the scalars of one step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace partrain {

// CRC32C (Castagnoli) of `bytes`, rotated right by 15 and offset by 0xa282ead8: the checksum
// TensorBoard's record reader expects (the mask keeps a CRC of data that holds CRCs apart from
// them).
std::uint32_t masked_crc32c(std::string_view bytes);

// The framed record of one serialised Event.
std::string frame_event_record(std::string_view data);

struct TaggedScalar {
  std::string tag;
  double value = 0;  // written as a float, TensorBoard's simple_value
};

// Appends records to an in-memory buffer and writes them out at flush(). A write that fails
// (disk full, the folder gone) must not end a training run: the file then stops growing, one
// warning names it on stderr, and every later call is a no-op. ok() says which it is.
class EventFile {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<host>.<pid> and buffers its version
  // record. Throws UsageError when the file cannot be created.
  explicit EventFile(const std::string& dir);
  // Writes to `path` as given (tests point it at /dev/full).
  static EventFile at_path(const std::string& path);
  EventFile(EventFile&& other) noexcept;
  EventFile& operator=(EventFile&&) = delete;
  EventFile(const EventFile&) = delete;
  ~EventFile();  // flushes

  // One Event at optimizer step `step` holding every scalar of `values`; wall_time is seconds
  // since the Unix epoch (now when negative).
  void add(std::int64_t step, const std::vector<TaggedScalar>& values, double wall_time = -1);
  // Writes what is buffered and flushes the C library's buffer to the file.
  void flush();

  bool ok() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

 private:
  struct AtPath {};
  EventFile(AtPath, const std::string& path);
  void give_up(const char* what);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
};

}  // namespace partrain
