// defines: write_pickle_temp(), write_pickle_atomically() and load_pickle() — a dict of tensors
// in the format of Python's torch.save (a zip archive: data.pkl and one record per tensor's
// storage), written straight from the tensors' memory into the file, so that no copy of a
// checkpoint's bytes is ever held whole in memory; and the bytes of one read back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace c10 {
struct IValue;
}

namespace partrain {

// Writes `value` to a new temp name beside `path` and syncs it; returns the temp name (for
// commit_file, common/atomic_file.h) and the bytes written. `truncate_half`: tests only
// (PARTRAIN_TEST_SAVE_FAULT), the file is cut to half its length, as a crash mid-write leaves
// it. Throws UsageError naming `path` when it cannot be written (the temp file is removed).
std::pair<std::string, std::uint64_t> write_pickle_temp(const std::string& path,
                                                        const c10::IValue& value,
                                                        bool truncate_half = false);

// write_pickle_temp(), then commit_file() over `path`; returns the bytes written.
std::uint64_t write_pickle_atomically(const std::string& path, const c10::IValue& value);

// The value of such a file's bytes. Throws UsageError naming `path` when they are not one, or
// when a tensor in it reaches past its storage (data::tensor_past_storage()).
c10::IValue load_pickle(const std::vector<char>& bytes, const std::string& path);
// The value of such a file, read record by record: each tensor's bytes go from the file into
// its own memory, so the file is never held whole beside them. Refuses what load_pickle does.
c10::IValue load_pickle_file(const std::string& path);
// Runs `read` over values unpickled from checkpoint `path`. LibTorch's error where one holds
// another type than partrain writes (toTensor() of a string, say), or a dict that lacks a key,
// becomes a UsageError naming `path` and the first line of LibTorch's message; running out of
// device memory stays what it is.
void reading_checkpoint(const std::string& path, const std::function<void()>& read);
// Throws a UsageError naming `path` unless `loaded`, checkpoint `path` unpickled, is a dict in
// partrain's checkpoint format that holds its model as a dict, its meta as text, and an
// optimizer entry: or, where not `exporting`, the momentum entry that checkpoints of the first
// version hold in its place (resume upgrades it; export has no optimizer entry to write).
void check_checkpoint(const c10::IValue& loaded, const std::string& path, bool exporting);
// FNV-1a over a file's bytes, read a MiB at a time; throws UsageError when it cannot be read.
std::uint64_t file_hash(const std::string& path);

// A whole file's bytes; throws UsageError naming `path` when it cannot be read or is larger
// than `max_bytes`.
std::vector<char> read_file_bytes(const std::string& path, std::uint64_t max_bytes);

}  // namespace partrain
