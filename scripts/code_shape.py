#!/usr/bin/env python3
"""Tallies function and file lengths of the tracked C++ sources.

usage: scripts/code_shape.py [--top N] [FOLDER...]
       (default folders, from the checkout's root: cli comm_backends common trainer)

Prints the number of functions, their total and mean length, how many fall in each length
band and the longest ones with FILE:LINE and signature; then the same for files. Use it to
see whether a change made the code's shape better or worse: run it before and after.

The function finder is a heuristic that fits clang-format's Google style: a function defined
at namespace scope opens on a line that starts at column 0 and ends in '{', with a '(' in it
or in the four lines above, and closes at the next '}' in column 0. Member functions defined
inside a class body and lambdas are not counted on their own (they count in their enclosing
function or not at all). Standard library only.
"""
import argparse
import os
import re
import subprocess
import sys

DEFAULT_FOLDERS = ["cli", "comm_backends", "common", "trainer"]
FUNCTION_BANDS = [(1, 20), (21, 40), (41, 60), (61, 100), (101, None)]
FILE_BANDS = [(1, 100), (101, 200), (201, 400), (401, 600), (601, None)]
NOT_A_FUNCTION = re.compile(r"(namespace|struct|class|enum|union|extern)\b")


def tracked_sources(folders):
    """The tracked .cpp and .h files under FOLDERS, paths relative to the checkout's root."""
    listing = subprocess.run(["git", "ls-files", "--", *folders], capture_output=True, text=True,
                             check=True).stdout.split()
    return [f for f in listing if f.endswith((".cpp", ".h"))]


def opens_function(lines, i):
    line = lines[i]
    if not line or line[0].isspace() or not line.rstrip().endswith("{"):
        return False
    if line.startswith(("#", "//")) or NOT_A_FUNCTION.match(line):
        return False
    if "=" in line.split("(")[0]:  # `auto x = T{` and other initialisers
        return False
    return "(" in "".join(lines[max(0, i - 4):i + 1])


def signature_start(lines, i):
    """Walks back from the line holding '{' over the signature's continuation lines."""
    j = i
    while j > 0:
        above = lines[j - 1]
        if not above.strip() or above.rstrip().endswith((";", "}", "{", "*/")):
            break
        if above.startswith(("//", "#", "template")):
            break
        j -= 1
    return j


def functions_of(path, lines):
    """(length in lines, 'path:line', signature) of each function defined in LINES."""
    found = []
    start = None
    for i, line in enumerate(lines):
        if start is None and opens_function(lines, i):
            j = signature_start(lines, i)
            signature = re.sub(r"\s+", " ", " ".join(s.strip() for s in lines[j:i + 1]))
            start = (j, signature[:90])
        elif start is not None and line.startswith("}"):
            found.append((i - start[0] + 1, f"{path}:{start[0] + 1}", start[1]))
            start = None
    return found


def tally(lengths, bands):
    parts = []
    for lo, hi in bands:
        n = sum(1 for x in lengths if x >= lo and (hi is None or x <= hi))
        parts.append(f"{lo}-{hi if hi else '':<4}: {n}")
    return ", ".join(parts)


def summary_line(kind, lengths):
    if not lengths:
        return f"{kind}: 0"
    return (f"{kind}: {len(lengths)}, total lines {sum(lengths)}, "
            f"mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}")


def main():
    parser = argparse.ArgumentParser(
        description="Function- and file-length tallies of the tracked C++ sources.")
    parser.add_argument("folders", nargs="*", metavar="FOLDER",
                        help=f"folders to read (default: {' '.join(DEFAULT_FOLDERS)})")
    parser.add_argument("--top", type=int, default=15,
                        help="how many of the longest functions to list (default 15)")
    args = parser.parse_args()

    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True)
    if root.returncode != 0:
        sys.exit("code_shape.py: run it inside a git checkout of partrain")
    top = root.stdout.strip()
    # Folders given on the command line are relative to where it was typed.
    folders = [os.path.relpath(os.path.abspath(f), top) for f in args.folders]
    os.chdir(top)

    files = tracked_sources(folders or DEFAULT_FOLDERS)
    if not files:
        sys.exit(f"code_shape.py: no tracked .cpp or .h files under {' '.join(args.folders)}")
    functions, sizes = [], []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        sizes.append((len(lines), path))
        functions.extend(functions_of(path, lines))

    functions.sort(reverse=True)
    lengths = [n for n, _, _ in functions]
    print(summary_line("functions", lengths))
    print("  by length:", tally(lengths, FUNCTION_BANDS))
    print("  longest:")
    for n, where, signature in functions[:args.top]:
        print(f"    {n:4d} {where}  {signature}")

    sizes.sort(reverse=True)
    file_lengths = [n for n, _ in sizes]
    print(summary_line("files", file_lengths))
    print("  by length:", tally(file_lengths, FILE_BANDS))
    print("  longest:")
    for n, path in sizes[:10]:
        print(f"    {n:4d} {path}")


if __name__ == "__main__":
    main()
