#!/usr/bin/env python3
"""Checks a run's TensorBoard event file against its metrics.jsonl, reading the file without
partrain's code: the record framing and its CRC32C here, each Event through `protoc
--decode_raw` (field numbers of TensorBoard's event.proto and summary.proto).

    check_tfevents.py OUTPUT_DIR [--every-step]

--every-step: the file must hold train/loss and train/lr at every optimizer step 1..N.
Prints one line of counts; exits 1 naming the first difference.
"""
import glob
import json
import math
import os
import re
import struct
import subprocess
import sys

PARTS = ["data_wait", "forward", "backward", "comm_exposed", "optimizer", "evaluation",
         "checkpoint", "other"]


def fail(why):
    print("check_tfevents: " + why)
    sys.exit(1)


def crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def masked_crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            fail(f"{path}: a record header cut short at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if header_crc != masked_crc32c(header):
            fail(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            fail(f"{path}: a record cut short at byte {pos}")
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if body_crc != masked_crc32c(body):
            fail(f"{path}: bad data CRC at byte {pos}")
        yield body
        pos += 16 + length


def parse_raw(text):
    """protoc --decode_raw's text as a nested list of (field, value) pairs."""
    stack = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line == "}":
            done = stack.pop()
            stack[-1][-1] = (stack[-1][-1][0], done)
            continue
        m = re.fullmatch(r"(\d+) \{", line)
        if m:
            stack[-1].append((int(m.group(1)), None))
            stack.append([])
            continue
        m = re.fullmatch(r"(\d+): (.*)", line)
        if not m:
            fail(f"unexpected protoc output: {line!r}")
        stack[-1].append((int(m.group(1)), m.group(2)))
    return stack[0]


def decode_event(body):
    protoc = os.environ.get("PROTOC", "protoc")
    out = subprocess.run([protoc, "--decode_raw"], input=body, capture_output=True, check=True)
    fields = parse_raw(out.stdout.decode())
    event = {"step": 0, "values": {}}
    for number, value in fields:
        if number == 1:  # wall_time, double (fixed64, printed as hex bits)
            event["wall_time"] = struct.unpack("<d", struct.pack("<Q", int(value, 16)))[0]
        elif number == 2:  # step, int64 (varint)
            event["step"] = int(value)
        elif number == 3:  # file_version
            event["file_version"] = json.loads(value)
        elif number == 5:  # summary: repeated Value value = 1
            for vnum, v in value:
                if vnum != 1 or not isinstance(v, list):
                    fail(f"unexpected summary field {vnum}")
                tag = simple = None
                for f, x in v:
                    if f == 1:
                        tag = json.loads(x)
                    elif f == 2:  # simple_value, float (fixed32, printed as hex bits)
                        simple = struct.unpack("<f", struct.pack("<I", int(x, 16)))[0]
                if tag is None or simple is None:
                    fail(f"a summary value without tag or simple_value: {v}")
                event["values"][tag] = simple
        else:
            fail(f"unexpected Event field {number}")
    return event


def close(a, b, rel=1e-6, abs_tol=1e-7):
    if isinstance(b, float) and math.isnan(b):
        return math.isnan(a)
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def main():
    out_dir = sys.argv[1]
    every_step = "--every-step" in sys.argv[2:]
    files = glob.glob(os.path.join(out_dir, "events.out.tfevents.*"))
    if len(files) != 1:
        fail(f"expected one event file in {out_dir}, found {files}")
    name = os.path.basename(files[0]).split(".")
    if len(name) < 6 or not name[3].isdigit() or not name[-1].isdigit():
        fail(f"file name {os.path.basename(files[0])} is not events.out.tfevents.SECS.HOST.PID")
    events = [decode_event(b) for b in records(files[0])]
    if not events or not events[0].get("file_version", "").startswith("brain.Event:"):
        fail("the first record does not name the file version")

    by_tag = {}
    for e in events[1:]:
        if e["wall_time"] < 1.6e9:
            fail(f"wall_time {e['wall_time']} is not seconds since 1970")
        for tag, v in e["values"].items():
            by_tag.setdefault(tag, {})
            if e["step"] in by_tag[tag]:
                fail(f"{tag} written twice at step {e['step']}")
            by_tag[tag][e["step"]] = v

    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    steps = [j for j in lines if j.get("type") == "step"]
    epochs = [j for j in lines if j.get("type") == "epoch"]
    if not steps or not epochs:
        fail("metrics.jsonl has no step or epoch lines")
    for j in steps:
        for tag, key in (("train/loss", "loss"), ("train/lr", "lr")):
            got = by_tag.get(tag, {}).get(j["step"])
            if got is None or not close(got, j[key]):
                fail(f"{tag} at step {j['step']}: {got}, metrics.jsonl: {j[key]}")
    last_step = epochs[-1]["steps"]
    if every_step and sorted(by_tag["train/loss"]) != list(range(1, last_step + 1)):
        fail(f"train/loss steps {sorted(by_tag['train/loss'])} are not 1..{last_step}")
    if sorted(by_tag["train/loss"]) != sorted(by_tag["train/lr"]):
        fail("train/loss and train/lr have different steps")
    for j in epochs:
        s = j["steps"]
        for tag, key in (("test/loss", "test_loss"), ("test/accuracy", "test_accuracy"),
                         ("test/accuracy_top5", "test_accuracy_top5"),
                         ("train/images_per_s", "train_images_per_s")):
            got = by_tag.get(tag, {}).get(s)
            want = float("nan") if j[key] is None else j[key]
            if got is None or not close(got, want):
                fail(f"{tag} at step {s} (epoch {j['epoch']}): {got}, metrics.jsonl: {want}")
        b = j["breakdown"][0]
        total = sum(b[p] for p in PARTS)
        shares = 0.0
        for p in PARTS:
            got = by_tag.get("breakdown/" + p, {}).get(s)
            if got is None or not close(got, b[p] / total, rel=1e-5, abs_tol=1e-6):
                fail(f"breakdown/{p} at step {s}: {got}, metrics.jsonl: {b[p] / total}")
            shares += got
        if not close(shares, 1.0, rel=1e-4):
            fail(f"the breakdown shares at step {s} add up to {shares}")
    if len(by_tag["test/loss"]) != len(epochs):
        fail(f"{len(by_tag['test/loss'])} test/loss values for {len(epochs)} epochs")
    print(f"check_tfevents: {len(events)} records, {len(by_tag['train/loss'])} steps, "
          f"{len(epochs)} epochs, {len(by_tag)} tags match metrics.jsonl")


if __name__ == "__main__":
    main()
