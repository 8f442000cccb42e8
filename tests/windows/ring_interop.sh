#!/usr/bin/env bash
# Starts one interop_rank per system named, in ring order, over 127.0.0.1, all meeting in one
# file store: Linux ranks name it /tmp/..., Windows ranks (under Wine, where Z: is /) name it
# Z:/tmp/... or Z:\tmp\... . Every rank must exit 0 having seen every other rank's system.
#   ring_interop.sh LINUX_RANK_EXE WINDOWS_RANK_EXE SYSTEM [SYSTEM...]   (SYSTEM: linux|windows)
set -uo pipefail
linux_exe=$1
windows_exe=$2
shift 2
systems=("$@")
world=${#systems[@]}
wine=${WINE:-wine}
timeout_ms=60000

dir=$(mktemp -d /tmp/partrain-interop.XXXXXX)
trap 'rm -rf "$dir"' EXIT
store_dir=$dir/store

pids=()
for rank in "${!systems[@]}"; do
  case ${systems[$rank]} in
    linux)
      url="file://$store_dir"
      timeout 150 "$linux_exe" "$url" "$rank" "$world" "$timeout_ms" \
        >"$dir/out.$rank" 2>&1 &
      ;;
    windows)
      # Alternate the two Windows spellings of the same directory.
      if (( rank % 2 == 0 )); then url="file:///Z:$store_dir"; else url="file://Z:${store_dir//\//\\}"; fi
      timeout 150 "$wine" "$windows_exe" "$url" "$rank" "$world" "$timeout_ms" \
        >"$dir/out.$rank" 2>&1 &
      ;;
    *) echo "ring_interop: unknown system '${systems[$rank]}'" >&2; exit 2 ;;
  esac
  echo "rank $rank (${systems[$rank]}): $url"
  pids+=($!)
done

failed=0
expected_peers=$(IFS=,; echo "${systems[*]}")
for rank in "${!pids[@]}"; do
  wait "${pids[$rank]}"
  code=$?
  # Wine's own chatter (fixme:, the wine32 notice) is not the rank's.
  grep -v -e '^[0-9a-f]*:fixme:' -e 'wine32' -e 'multiarch' -e 'dpkg --add-arch' \
    -e 'apt-get install wine32' "$dir/out.$rank" | sed "s/^/  [rank $rank] /"
  if [ "$code" -ne 0 ]; then
    echo "ring_interop: rank $rank (${systems[$rank]}) exited $code" >&2
    failed=1
  elif ! grep -q "interop rank $rank (${systems[$rank]}): peers $expected_peers; .*, 0 wrong elements" \
      "$dir/out.$rank"; then
    echo "ring_interop: rank $rank (${systems[$rank]}) did not report every peer and 0 wrong" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] && echo "ring_interop: ${systems[*]}: all ranks agree"
exit "$failed"
