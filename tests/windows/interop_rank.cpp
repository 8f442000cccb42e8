// One rank of the Linux <-> Windows interop test (tests/windows/ring_interop.sh starts one
// per rank, some built for Linux, some for Windows and run under Wine):
//   interop_rank STORE_URL RANK WORLD [TIMEOUT_MS]
// Every rank names the same directory in its own system's spelling (file:///tmp/x on Linux,
// file:///Z:/tmp/x under Wine). It checks the file store first — binary values written on one
// system read back byte for byte on the other, add() counts across systems — then runs
// asio-ring collectives over every dtype, op and several sizes (including a bf16 wire) and
// checks each result element by element against what it computes on its own.
// Prints one line "interop rank R (OS): peers OS,OS,...; N collectives, M wrong elements".
// Exit: 0 all right, 1 a wrong value or an error.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/comm/reference_values.h"

namespace {

using namespace partrain::comm;

#ifdef _WIN32
constexpr const char* kSystem = "windows";
#else
constexpr const char* kSystem = "linux";
#endif

// Small integers, exact in every dtype (bf16 included) and in their sums over a few ranks,
// so every result can be compared exactly.
double element(int rank, std::size_t i, int salt) {
  return static_cast<double>(
      static_cast<int>(
          (i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(salt)) % 29) -
      14);
}

// What allreduce must leave in element i: the reduction over ranks, with avg divided the way
// the dtype divides (integers truncate; f16/bf16 divide in f32, then round to their type).
double expected_allreduce(int world, std::size_t i, int salt, DType dtype, ReduceOp op) {
  std::vector<double> values;
  for (int r = 0; r < world; ++r) values.push_back(element(r, i, salt));
  if (op != ReduceOp::avg) return reduce_reference(values, op, dtype);
  const double sum = reduce_reference(values, ReduceOp::sum, dtype);
  switch (dtype) {
    case DType::i32:
    case DType::i64:
      return static_cast<double>(static_cast<std::int64_t>(sum) / world);
    case DType::f64:
      return sum / world;
    case DType::f32:
      return static_cast<float>(sum) / static_cast<float>(world);
    case DType::f16:
      return half_to_float(float_to_half(static_cast<float>(sum) / static_cast<float>(world)));
    case DType::bf16:
      return bf16_to_float(float_to_bf16(static_cast<float>(sum) / static_cast<float>(world)));
  }
  return 0;
}

struct Tally {
  int collectives = 0;
  std::size_t wrong = 0;
  std::string first_wrong;

  void check(bool good, const std::string& what) {
    if (good) return;
    if (wrong++ == 0) first_wrong = what;
  }
};

std::vector<std::uint8_t> text_bytes(const std::string& text) { return {text.begin(), text.end()}; }

// Store checks across systems: every byte value (a text-mode file would turn \n into \r\n or
// stop at \x1a), and add() from every rank.
std::string check_store(Store& store, int rank, int world, Tally& tally) {
  std::vector<std::uint8_t> all_bytes(256);
  for (int b = 0; b < 256; ++b) all_bytes[b] = static_cast<std::uint8_t>(b);
  const std::string crlf = "\r\n\x1a\n";
  all_bytes.insert(all_bytes.end(), crlf.begin(), crlf.end());
  all_bytes.push_back(static_cast<std::uint8_t>(rank));

  store.set("system/" + std::to_string(rank), text_bytes(kSystem));
  store.set("bytes/" + std::to_string(rank), all_bytes);
  store.add("arrived", rank + 1);
  store.set("added/" + std::to_string(rank), {1});

  std::string peers;
  for (int r = 0; r < world; ++r) {
    store.wait({"added/" + std::to_string(r)}, store.timeout());
    const auto system = store.get("system/" + std::to_string(r));
    if (r > 0) peers += ',';
    peers.append(system.begin(), system.end());
    auto want = all_bytes;
    want.back() = static_cast<std::uint8_t>(r);
    tally.check(store.get("bytes/" + std::to_string(r)) == want,
                "store: bytes written by rank " + std::to_string(r) + " came back changed");
  }
  const auto arrived = store.get("arrived");
  tally.check(
      std::string(arrived.begin(), arrived.end()) == std::to_string(world * (world + 1) / 2),
      "store: add() from every rank gave " + std::string(arrived.begin(), arrived.end()));
  return peers;
}

void check_allreduce(Communicator& comm, DType dtype, ReduceOp op, std::size_t count, int salt,
                     Tally& tally) {
  const int rank = comm.rank(), world = comm.size();
  std::vector<std::uint8_t> data(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i)
    store_value(data.data(), dtype, i, element(rank, i, salt));
  comm.allreduce(Buffer{data.data(), count, dtype}, op);
  ++tally.collectives;
  for (std::size_t i = 0; i < count; ++i) {
    const double want = expected_allreduce(world, i, salt, dtype, op);
    const double got = load_value(data.data(), dtype, i);
    tally.check(got == want, "allreduce " + std::string(dtype_name(dtype)) + " " +
                                 std::string(reduce_op_name(op)) + " count " +
                                 std::to_string(count) + " [" + comm.name() + "]: element " +
                                 std::to_string(i) + " is " + std::to_string(got) + ", want " +
                                 std::to_string(want));
  }
}

void check_broadcast_allgather(Communicator& comm, Tally& tally) {
  const int rank = comm.rank(), world = comm.size();
  const std::size_t count = 40000;
  for (int root = 0; root < world; ++root) {
    std::vector<std::uint8_t> data(count * 8);
    for (std::size_t i = 0; i < count; ++i)
      store_value(data.data(), DType::i64, i, element(rank, i, root));
    comm.broadcast(Buffer{data.data(), count, DType::i64}, root);
    ++tally.collectives;
    for (std::size_t i = 0; i < count; ++i) {
      tally.check(load_value(data.data(), DType::i64, i) == element(root, i, root),
                  "broadcast from " + std::to_string(root) + ": element " + std::to_string(i));
    }
  }
  std::vector<std::uint8_t> in(count * 4), out(count * 4 * world);
  for (std::size_t i = 0; i < count; ++i)
    store_value(in.data(), DType::f32, i, element(rank, i, 5));
  comm.allgather(Buffer{in.data(), count, DType::f32},
                 Buffer{out.data(), count * world, DType::f32});
  ++tally.collectives;
  for (int r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      tally.check(load_value(out.data(), DType::f32, r * count + i) == element(r, i, 5),
                  "allgather: rank " + std::to_string(r) + "'s element " + std::to_string(i));
    }
  }
  comm.barrier();
  ++tally.collectives;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: interop_rank STORE_URL RANK WORLD [TIMEOUT_MS]\n";
    return 2;
  }
  const int rank = std::stoi(argv[2]);
  const int world = std::stoi(argv[3]);
  const std::chrono::milliseconds timeout(argc == 5 ? std::stoi(argv[4]) : 60000);
  try {
    StoreOptions store_options;
    store_options.token = "interop";
    store_options.timeout = timeout;
    auto store = open_store(argv[1], store_options);
    Tally tally;
    const std::string peers = check_store(*store, rank, world, tally);

    CommOptions options;
    options.backend = "asio-ring";
    options.token = "interop";
    options.timeout = timeout;
    auto comm = make_communicator(options, *store, rank, world);
    int salt = 0;
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
        // 1 and 2 leave some ranks' segments empty; 65537 spans pipeline chunks (f32 and
        // wider) with a ragged end.
        for (std::size_t count :
             {std::size_t{1}, std::size_t{2}, std::size_t{1000}, std::size_t{65537}}) {
          check_allreduce(*comm, dtype, op, count, ++salt, tally);
        }
      }
      // Many chunks per segment, once per dtype.
      check_allreduce(*comm, dtype, ReduceOp::sum, 300001, ++salt, tally);
    }
    check_broadcast_allgather(*comm, tally);

    // f32 data over a bf16 wire: the values are exact in bf16, so the result is too.
    options.wire_dtype = DType::bf16;
    auto narrow = make_communicator(options, *store, rank, world);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      check_allreduce(*narrow, DType::f32, op, 100003, ++salt, tally);
    }

    std::cout << "interop rank " << rank << " (" << kSystem << "): peers " << peers << "; "
              << tally.collectives << " collectives, " << tally.wrong << " wrong elements"
              << std::endl;
    if (tally.wrong > 0) {
      std::cerr << "interop rank " << rank << ": first wrong: " << tally.first_wrong << "\n";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "interop rank " << rank << " (" << kSystem << "): " << e.what() << "\n";
    return 1;
  }
}
