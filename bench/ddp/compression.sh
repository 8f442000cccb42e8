#!/usr/bin/env bash
# What gradient compression does to accuracy: configs/fashion_mnist.yaml (Fashion-MNIST, 2
# ranks x 128, DigitalNet width 16, 3 epochs, the training recipe) trained once per contender
# in one run: the f32 wire, the bf16 wire, and PowerSGD at ranks 1, 2 and 4 (compressing from
# comm.powersgd_start_step, default 10, on). Then a table of each run's final test accuracy,
# its difference to the f32 wire, training images/s and the bytes sent per step that
# report.json's compression record gives. The link speed is not the question here (the ranks
# share one host); bench/multinode/link.sh measures the speed over slow links.
#
# Usage: bench/ddp/compression.sh   Env: CONTENDERS (default "f32 bf16 powersgd1 powersgd2
#        powersgd4"), EPOCHS (default 3), OUT (default /tmp/bench-ddp/compression), see common.sh
source "$(dirname "$0")/common.sh"
CONTENDERS=${CONTENDERS:-f32 bf16 powersgd1 powersgd2 powersgd4}
read -ra contenders <<< "$CONTENDERS"
EPOCHS=${EPOCHS:-3}
prepare compression
echo "benchmark: compression accuracy, configs/fashion_mnist.yaml, epochs=$EPOCHS" >> "$OUT/machine.txt"
for contender in "${contenders[@]}"; do
  case $contender in
    f32 | bf16) sets=(--set comm.wire_dtype="$contender") ;;
    powersgd[0-9]*)
      sets=(--set comm.compression=powersgd --set comm.powersgd_rank="${contender#powersgd}") ;;
    *) echo "unknown contender $contender (f32, bf16 or powersgdR)" >&2; exit 2 ;;
  esac
  rm -rf "${OUT:?}/$contender"
  echo "== $contender" >&2
  "$EXE" run "$ROOT/configs/fashion_mnist.yaml" "${sets[@]}" --set train.epochs="$EPOCHS" \
    --output "$OUT/$contender" > "$OUT/$contender.log" 2>&1 ||
    { tail -20 "$OUT/$contender.log" >&2; exit 1; }
  tail -1 "$OUT/$contender.log" >&2
done
finish
"$PY" - "$OUT" "${contenders[@]}" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, contenders = sys.argv[1], sys.argv[2:]
reports = {c: json.load(open(f"{out}/{c}/report.json")) for c in contenders}
base = reports.get("f32")
print("| contender | final test accuracy | vs f32 wire, points | train images/s | gradient MB sent per step (f32) |")
print("|---|--:|--:|--:|--:|")
for c, rep in reports.items():
    acc = 100 * rep["final"]["test_accuracy"]
    diff = f"{acc - 100 * base['final']['test_accuracy']:+.2f}" if base else "-"
    comp = rep.get("compression") or {}
    sent = "-" if not comp else (f"{comp['bytes_per_step'] / 1e6:.3f} of "
                                 f"{comp['uncompressed_bytes_per_step'] / 1e6:.3f}")
    print(f"| {c} | {acc:.2f} % | {diff} | {rep['images_per_s']:.0f} | {sent} |")
PY
