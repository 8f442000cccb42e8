#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [SECONDS]
#
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in build-fuzz/, makes a seed
# corpus (the configs in configs/, small valid IDX, CIFAR-100 and image files, valid ring and
# store conversations), then runs each target for SECONDS (default 60). A crash, leak, timeout or
# out-of-memory input is saved in tests/regression/<target>/ (replayed by ctest -L regression
# in the normal build) and makes the script exit 1.
#
# Environment: JOBS (build parallelism, default 1), PARTRAIN_FUZZ_BUILD (build folder),
# TARGETS (default "config idx cifar image ring store layout").
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARTRAIN_FUZZ_BUILD:-$root/build-fuzz}
targets=${TARGETS:-config idx cifar image ring store layout}
jobs=${JOBS:-1}
cc=${CC:-clang}
cxx=${CXX:-clang++}

flags="-g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined"
flags+=" -fno-sanitize-recover=all"
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$flags" \
  -DPARTRAIN_FUZZ=ON -DPARTRAIN_BUILD_TESTS=OFF -DPARTRAIN_WITH_TORCH=OFF \
  -DPARTRAIN_WITH_GLOO=OFF -DPARTRAIN_WITH_NCCL=OFF >/dev/null
# shellcheck disable=SC2046,SC2086 # one --target word per fuzz target
cmake --build "$build" -j "$jobs" --target $(printf 'fuzz_%s ' $targets)

# ---- seed corpus ----------------------------------------------------------------------------
seeds=$build/seeds
rm -rf "$seeds"
mkdir -p "$seeds"
for t in config idx cifar image ring store layout; do mkdir -p "$seeds/$t"; done
cp "$root"/configs/*.yaml "$seeds/config/"
python3 - "$seeds" <<'PY'
import gzip, struct, sys
seeds = sys.argv[1]
def put(target, name, data):
    with open(f"{seeds}/{target}/{name}", "wb") as f:
        f.write(data)

# IDX: u16 split (little-endian) | u8 limit | images file | labels file
images = struct.pack(">IIII", 2051, 3, 4, 5) + bytes(range(60))
labels = struct.pack(">II", 2049, 3) + bytes([0, 9, 4])
for limit in (0, 2):
    put("idx", f"plain-limit{limit}", struct.pack("<HB", len(images), limit) + images + labels)
gz_images, gz_labels = gzip.compress(images, mtime=0), gzip.compress(labels, mtime=0)
put("idx", "gzip", struct.pack("<HB", len(gz_images), 0) + gz_images + gz_labels)

# CIFAR-100: records of coarse label, fine label, 3072 pixels
put("cifar", "two-records",
    b"".join(bytes([fine // 5, fine]) + bytes([fine]) * 3072 for fine in (7, 99)))

# Ring: selector byte (world 3, expected rank 0) | handshake | token | frame header
token = b"run-token"
hello = b"PTRING01" + struct.pack("<IIII", 1, 0, 3, len(token)) + token
frame = b"PTCF" + bytes([1, 0, 0, 0]) + struct.pack("<iQQ", 0, 1, 1000) + bytes(4)
put("ring", "handshake-and-frame", bytes([1]) + hello + frame)
put("ring", "address", bytes([1]) + b"127.0.0.1:29500")
put("ring", "address-v6", bytes([1]) + b"[::1]:80")

# Store: hello | token | set k=v | get k | add n 5 | add n -2 | get absent
def request(command, key, value=b""):
    return struct.pack("<BII", command, len(key), len(value)) + key + value
store = b"PTSTORE1" + struct.pack("<II", 4, len(token)) + token
store += request(1, b"k", b"value") + request(2, b"k") + request(3, b"n", struct.pack("<q", 5))
store += request(3, b"n", struct.pack("<q", -2)) + request(2, b"absent")
put("store", "conversation", store)
# A notice: hello | a line with a newline and a tab in it
line = b"node 1 (h) could not start its ranks:\n\tcannot open config file"
put("store", "notice", b"PTSTNOTE" + struct.pack("<II", 4, len(line)) + line)
# A join: hello | token, the process key and its mark | get that key
key, mark = b"ranks/process/1", b"pid=42 started=7 kernel=b pidns=1 uid=0"
join = struct.pack("<I", len(token)) + token + struct.pack("<I", len(key)) + key + mark
put("store", "join", b"PTSTJOIN" + struct.pack("<II", 4, len(join)) + join + request(2, key))

# Layout: u8 world - 1 | "PTL2" | hosts (length, identity) | per host CPUs (u32), room (u64)
# | runs (host, count): hosts a and b, ranks 0-1 on a, 2 on b, 3 on a
def text(t):
    return struct.pack("<I", len(t)) + t
layout = b"PTL2" + struct.pack("<I", 2) + text(b"a boot 1") + text(b"b boot 1")
layout += struct.pack("<IQ", 2, 1 << 26) + struct.pack("<IQ", 0, (1 << 64) - 1)
layout += struct.pack("<I", 3) + struct.pack("<II", 0, 2) + struct.pack("<II", 1, 1)
layout += struct.pack("<II", 0, 1)
put("layout", "two-hosts", bytes([3]) + layout)
# Images: u8 image_size (0: kept) | a 3x2 image as PNG, BMP, PPM, PGM, TIFF (uncompressed RGB)
# and lossless WebP (as PIL 9.4 writes it).
import zlib
rgb = bytes(range(18))
def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
png = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0))
png += png_chunk(b"IDAT", zlib.compress(b"\0" + rgb[:9] + b"\0" + rgb[9:])) + png_chunk(b"IEND", b"")
rows = b"".join(rgb[9 * y:9 * y + 9] + b"\0\0\0" for y in (1, 0))  # bottom-up, 4-byte rows
bmp = b"BM" + struct.pack("<IHHI", 54 + len(rows), 0, 0, 54)
bmp += struct.pack("<IiiHHIIiiII", 40, 3, 2, 1, 24, 0, len(rows), 0, 0, 0, 0) + rows
def tiff_entry(tag, kind, count, value):
    return struct.pack("<HHI", tag, kind, count) + (struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value))
entries = [(256, 3, 1, 3), (257, 3, 1, 2), (258, 3, 3, 8 + 2 + 9 * 12 + 4), (259, 3, 1, 1), (262, 3, 1, 2),
           (273, 4, 1, 8 + 2 + 9 * 12 + 4 + 6), (277, 3, 1, 3), (278, 3, 1, 2), (279, 4, 1, 18)]
tiff = b"II*\0" + struct.pack("<IH", 8, len(entries)) + b"".join(tiff_entry(*e) for e in entries)
tiff += struct.pack("<I", 0) + struct.pack("<HHH", 8, 8, 8) + rgb
webp = bytes.fromhex("5249464638000000574542505650384c2b0000002f024000002f40906db3edfed4975008"
                     "20000a1a850002a0a099ff94ee1d6ada3660439d7f3935a2ff31bd00")
for name, body in (("png", png), ("bmp", bmp), ("ppm", b"P6 3 2 255\n" + rgb), ("pgm", b"P5\n3 2\n255\n" + rgb[:6]),
                   ("tiff", tiff), ("webp", webp)):
    put("image", name, bytes([0]) + body)
    put("image", name + "-sized", bytes([5]) + body)

# A leader's failure in place of the layout: the mark, a count of 0, why.
put("layout", "failure", bytes([3]) + b"PTL2" + struct.pack("<I", 0) + text(b"rank 3 is gone"))
PY

# ---- run ------------------------------------------------------------------------------------
export TMPDIR=$build/tmp  # the targets' scratch files
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
failed=()
for t in $targets; do
  corpus=$build/corpus/$t
  artifacts=$root/tests/regression/$t
  mkdir -p "$corpus" "$artifacts"
  extra=()
  [[ -f $root/fuzz/$t.dict ]] && extra+=(-dict="$root/fuzz/$t.dict")
  # An image within the pixel limit needs at most 256 MB at once (2^26 pixels as RGBA): a larger
  # allocation is a header that got past the checks, even where the decoding then fails.
  [[ $t == image ]] && extra+=(-malloc_limit_mb=512)
  echo "== fuzz_$t for ${seconds}s"
  log=$build/fuzz_$t.log
  if "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=8192 -print_final_stats=1 -artifact_prefix="$artifacts/" "${extra[@]}" \
      "$corpus" "$seeds/$t" >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$log" | tr '\n' ' '
    echo
  else
    echo "fuzz_$t FOUND A PROBLEM (log: $log):"
    grep -E "ERROR|SUMMARY|Test unit written|uncaught|terminate" "$log" | head -8
    failed+=("$t")
  fi
done

if ((${#failed[@]})); then
  echo "fuzz.sh: problems in: ${failed[*]}; inputs kept in tests/regression/<target>/" >&2
  exit 1
fi
echo "fuzz.sh: no problems found in ${seconds}s per target"
