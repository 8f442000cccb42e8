#include "trainer/loop/pickle_file.h"

#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/hash.h"
#include "trainer/data/unpickled.h"
#include "trainer/loop/checkpoint_format.h"

namespace partrain {

// torch::pickle_save() builds the archive in a vector and returns it: the checkpoint whole in
// memory, once more for every copy of the vector. The same archive is written here record by
// record through PyTorchStreamWriter's writer function, each tensor's storage straight from its
// memory (a CUDA tensor through a host copy of itself alone).
std::pair<std::string, std::uint64_t> write_pickle_temp(const std::string& path,
                                                        const c10::IValue& value,
                                                        bool truncate_half) {
  std::vector<char> pickled;  // the structure only; the tensors are records of their own
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); });
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  const std::string temp = temp_path_for(path);
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  PARTRAIN_CHECK(file != nullptr, UsageError, "checkpoint ", path, ": cannot write ", temp, " (",
                 std::strerror(errno), ")");
  std::uint64_t written = 0;
  int write_error = 0;
  std::string failure;
  try {
    // After a failed write (a full disk) the rest is dropped but reported as written: told of
    // a short write, LibTorch's writer throws at its next record and again from its destructor,
    // which ends the process (std::terminate) instead of reporting the error below.
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) -> size_t {
      if (write_error != 0 || size == 0) return size;
      if (std::fwrite(data, 1, size, file) != size) {
        write_error = errno != 0 ? errno : EIO;
        return size;
      }
      written += size;
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                       writer);
    writer.writeEndOfFile();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const bool closed = std::fclose(file) == 0;
  if (!failure.empty() || write_error != 0 || !closed) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw UsageError("checkpoint " + path + ": cannot write (" +
                     (write_error != 0  ? std::string(std::strerror(write_error))
                      : failure.empty() ? std::string("close failed")
                                        : failure) +
                     ")");
  }
  if (truncate_half) std::filesystem::resize_file(temp, written / 2);
  sync_file(temp);
  return {temp, written};
}

std::uint64_t write_pickle_atomically(const std::string& path, const c10::IValue& value) {
  const auto [temp, bytes] = write_pickle_temp(path, value);
  commit_file(temp, path);
  return bytes;
}

namespace {

// `loaded` as it came from checkpoint `path`, once none of its tensors reaches past its storage
// (a file changed by hand: the zip's checksums catch damage, not a rewritten data.pkl).
c10::IValue checked(c10::IValue loaded, const std::string& path) {
  const std::string outside = data::tensor_past_storage(loaded);
  PARTRAIN_CHECK(outside.empty(), UsageError, "checkpoint ", path, " cannot be loaded: ", outside,
                 " reaches past the data the file holds for it (changed after partrain wrote it)");
  return loaded;
}

}  // namespace

c10::IValue load_pickle(const std::vector<char>& bytes, const std::string& path) {
  c10::IValue loaded;
  try {
    loaded = torch::jit::pickle_load(bytes);
  } catch (const c10::Error&) {
    throw UsageError("checkpoint " + path +
                     " cannot be read (truncated or not a partrain checkpoint)");
  }
  return checked(std::move(loaded), path);
}

c10::IValue load_pickle_file(const std::string& path) {
  c10::IValue loaded;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    // No type resolver, object loader or device: {} is an empty c10::optional in LibTorch
    // 1.13 and an empty std::optional from 2.x on.
    loaded = torch::jit::readArchiveAndTensors("data", "", "", {}, {}, {}, reader);
  } catch (const c10::Error&) {
    throw UsageError("checkpoint " + path +
                     " cannot be read (truncated or not a partrain checkpoint)");
  }
  return checked(std::move(loaded), path);
}

void reading_checkpoint(const std::string& path, const std::function<void()>& read) {
  try {
    read();
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the device's memory, not the file
  } catch (const c10::Error& e) {
    throw UsageError("checkpoint " + path +
                     " cannot be loaded: " + data::first_line(e.what_without_backtrace()));
  } catch (const std::out_of_range& e) {  // c10::Dict::at() of a key the value lacks
    throw UsageError("checkpoint " + path + " cannot be loaded: an entry lacks a key (" + e.what() +
                     ")");
  }
}

void check_checkpoint(const c10::IValue& loaded, const std::string& path, bool exporting) {
  PARTRAIN_CHECK(loaded.isGenericDict(), UsageError, "checkpoint ", path,
                 " is not a partrain checkpoint");
  const auto dict = loaded.toGenericDict();
  PARTRAIN_CHECK(
      dict.contains("format") && dict.at("format").isString() &&
          dict.at("format").toStringRef() == kCheckpointFormat && dict.contains("model") &&
          dict.contains("meta") &&
          (dict.contains("optimizer") || (!exporting && dict.contains("momentum"))),
      UsageError, "checkpoint ", path, " is not a ", kCheckpointFormat, " checkpoint",
      exporting ? " (checkpoints of the first version hold no optimizer entry to export)" : "");
  const bool meta_text = dict.at("meta").isString();
  PARTRAIN_CHECK(dict.at("model").isGenericDict() && meta_text, UsageError, "checkpoint ", path,
                 ": its ", meta_text ? "model" : "meta", " entry holds ",
                 (meta_text ? dict.at("model") : dict.at("meta")).tagKind(),
                 " where partrain writes ", meta_text ? "a dict of tensors" : "text");
}

std::uint64_t file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in.good(), UsageError, "checkpoint ", path, ": cannot read");
  return fnv1a_64_of(in);
}

std::vector<char> read_file_bytes(const std::string& path, std::uint64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, "checkpoint ", path, ": cannot read (", ec.message(), ")");
  PARTRAIN_CHECK(size <= max_bytes, UsageError, "checkpoint ", path, ": ", size,
                 " bytes is larger than any checkpoint partrain writes");
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes(size);
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  PARTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(size), UsageError, "checkpoint ", path,
                 ": short read");
  return bytes;
}

}  // namespace partrain
