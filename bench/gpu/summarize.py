"""The table scripts/gpu-check.sh prints last: partrain versus PyTorch's Python loop on the
same GPU (median epoch of epochs >= 2), device memory per rank beside the reference's, and
the roofline floor of an epoch."""
import json
import statistics
import sys
from pathlib import Path

runs = Path(sys.argv[1])


def median_epoch(seconds):
    later = seconds[1:] or seconds
    return statistics.median(later)


print("| batch | partrain s/epoch | PyTorch loop s/epoch | partrain / PyTorch speed | roofline floor s | partrain peak alloc / reserved MiB | PyTorch peak alloc / reserved MiB |")
print("|--:|--:|--:|--:|--:|--|--|")
for batch in (500, 1000):
    ours = runs / f"partrain-b{batch}" / "report.json"
    peer = runs / f"torch-b{batch}.json"
    if not ours.exists() or not peer.exists():
        print(f"| {batch} | missing | | | | | |")
        continue
    r = json.loads(ours.read_text())
    t = json.loads(peer.read_text())
    ours_s = median_epoch([e["train_seconds"] for e in r["epochs"]])
    peer_s = median_epoch([e["seconds"] for e in t["epochs"]])
    rk = r["ranks"][0]
    print(f"| {batch} | {ours_s:.2f} | {peer_s:.2f} | {peer_s / ours_s:.2f}x | {t['roofline_epoch_seconds']:.3f} | "
          f"{rk['cuda_peak_allocated_mb']:.0f} / {rk['cuda_peak_reserved_mb']:.0f} | "
          f"{t['peak_allocated_mb']:.0f} / {t['peak_reserved_mb']:.0f} |")
two = runs / "partrain-2rank" / "report.json"
if two.exists():
    r = json.loads(two.read_text())
    mem = [f"{x['cuda_peak_reserved_mb']:.0f}" for x in r["ranks"]]
    print(f"\n2 ranks x 500 on one GPU ({r['env']['backend']}): {median_epoch([e['train_seconds'] for e in r['epochs']]):.2f} s/epoch, "
          f"reserved MiB per rank {', '.join(mem)} (reference, nvidia-smi, 2 GPUs: 6939, 5006)")
