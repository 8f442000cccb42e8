#!/usr/bin/env python3
"""Reads the runs a bench/ddp script left in OUT and prints Markdown tables.

  summarize.py vs OUT        partrain vs the Python DDP peer (vs_python_ddp.sh)
  summarize.py overlap OUT   comm wait per step vs allreduce alone (overlap.sh)
  summarize.py scaling OUT   2 ranks vs 1 rank at the same global batch (scaling.sh)
  summarize.py curve OUT     test accuracy per epoch (fashion_mnist.sh)

A run is OUT/<contender>__<setup>__r<N>: partrain runs leave a folder with report.json, peer
runs a .log with its per-epoch table and peak RSS lines. Standard library only.
"""
import glob
import json
import os
import re
import statistics
import sys


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec='.0f'):
    return '–' if x is None else format(x, spec)


def load_partrain(path):
    with open(os.path.join(path, 'report.json')) as f:
        r = json.load(f)
    epochs = r['epochs']
    later = [e['train_images_per_s'] for e in epochs if e['epoch'] >= 2] or \
            [e['train_images_per_s'] for e in epochs]
    steps = epochs[-1]['steps']
    return dict(
        img_s=median(later),
        epoch_img_s=[e['train_images_per_s'] for e in epochs],
        acc=[e['test_accuracy'] for e in epochs],
        rss=[k['peak_rss_mb'] for k in r['ranks']],
        children_rss=0.0,
        steps=steps,
        world=r['env']['world_size'],
        train_seconds=sum(e['train_seconds'] for e in epochs),
        compute=[k['compute_seconds'] for k in r['ranks']],
        wait=[k['comm_wait_seconds'] for k in r['ranks']],
        busy=[k.get('comm_busy_seconds', 0.0) for k in r['ranks']],
        config=r['config'])


PEER_EPOCH = re.compile(r'^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)')
PEER_RSS = re.compile(r'# peak_rss rank(\d+): self=([\d.]+) MiB\s+children\(max, DataLoader workers\)=([\d.]+)')
PEER_PROFILE = re.compile(r'(\w+)=([\d.]+)')


def load_peer(path):
    epochs, rss, children, profile = [], {}, {}, {}
    with open(path) as f:
        for line in f:
            line = re.sub(r'^\[default\d+\]:', '', line.rstrip('\n'))
            m = PEER_EPOCH.match(line)
            if m:
                epochs.append(dict(epoch=int(m[1]), img_s=float(m[5]), acc=float(m[7]),
                                   train_s=float(m[2])))
                continue
            m = PEER_RSS.search(line)
            if m:
                rss[int(m[1])] = float(m[2])
                children[int(m[1])] = float(m[3])
                continue
            if line.startswith('# step breakdown'):
                profile = {k: float(v) for k, v in PEER_PROFILE.findall(line.split(':', 1)[1])}
    if not epochs:
        raise ValueError(f'{path}: no epoch lines')
    later = [e['img_s'] for e in epochs if e['epoch'] >= 2] or [e['img_s'] for e in epochs]
    return dict(img_s=median(later), epoch_img_s=[e['img_s'] for e in epochs],
                acc=[e['acc'] for e in epochs], rss=[rss[k] for k in sorted(rss)],
                children_rss=max(children.values()) if children else 0.0, profile=profile)


def load_runs(out):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, '*__*__r*'))):
        name = os.path.basename(path)
        if name.endswith('.log'):
            name = name[:-4]
            if os.path.isdir(os.path.join(out, name)):
                continue  # partrain's console log; the report is in the folder
            run = load_peer(path)
        elif os.path.isdir(path):
            if not os.path.exists(os.path.join(path, 'report.json')):
                continue
            run = load_partrain(path)
        else:
            continue
        contender, setup, rep = name.split('__')
        run['cpu_s'] = None
        timing = os.path.join(out, name + '.time')
        if os.path.exists(timing):
            with open(timing) as f:
                fields = f.read().split()
            if len(fields) >= 3:  # wall, user, system seconds (a killed run leaves a note)
                run['cpu_s'] = float(fields[1]) + float(fields[2])
        runs.setdefault((contender, setup), []).append(run)
    return runs


def header(out):
    try:
        with open(os.path.join(out, 'machine.txt')) as f:
            return ''.join('    ' + line for line in f)
    except OSError:
        return ''


def summarize_vs(out):
    runs = load_runs(out)
    print(header(out))
    print('| setup | contender | runs | train img/s (median) | per-run img/s | peak RSS per rank, MiB '
          '| DataLoader worker RSS, MiB | img/s vs partrain | partrain RSS / this RSS '
          '| CPU s per run (all processes) |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for setup in sorted({s for _, s in runs}):
        base = runs.get(('partrain', setup))
        base_img = median([r['img_s'] for r in base]) if base else None
        base_rss = median([max(r['rss']) for r in base]) if base else None
        for contender in sorted({c for c, s in runs if s == setup}, key=lambda c: (c != 'partrain', c)):
            rs = runs[(contender, setup)]
            img = median([r['img_s'] for r in rs])
            rss = median([max(r['rss']) for r in rs])
            child = median([r['children_rss'] for r in rs])
            ratio = '' if contender == 'partrain' or not base_img else f'{base_img / img:.2f}x'
            mem = '' if contender == 'partrain' or not base_rss else f'{base_rss / rss:.2f}'
            print(f'| {setup} | {contender} | {len(rs)} | {fmt(img)} | '
                  f'{", ".join(fmt(r["img_s"]) for r in rs)} | {fmt(rss)} | '
                  f'{fmt(child) if contender != "partrain" else "(threads, in RSS)"} | {ratio} | {mem} | '
                  f'{fmt(median([r["cpu_s"] for r in rs]), ".1f")} |')
    print()
    print('img/s vs partrain = partrain img/s / contender img/s (>1: partrain faster); '
          'RSS is the max over ranks of each run, then the median over runs; CPU s = user + '
          'system seconds of the whole run (launcher, ranks, loader workers, start-up, evaluation).')


def summarize_overlap(out):
    runs = load_runs(out)
    print(header(out))
    bench = {}
    for path in glob.glob(os.path.join(out, 'allreduce_*.json')):
        with open(path) as f:
            b = json.load(f)
        for res in b['results']:
            bench.setdefault(res['backend'], []).append(res['median_us'] / 1000.0)
    print('Allreduce alone (`partrain bench allreduce`, world 2, same bytes), median of runs, ms: '
          + ', '.join(f'{k} {median(v):.2f} ({", ".join(f"{x:.2f}" for x in v)})'
                      for k, v in sorted(bench.items())))
    print()
    print('| backend | bucket_mb | runs | comm wait per step, ms (per rank) '
          '| comm busy per step, ms (per rank) | allreduce alone, ms | wait / alone | busy / alone '
          '| compute per step, ms | train img/s |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    profiles, steps = [], 0
    for (contender, setup), rs in sorted(runs.items()):
        if 'config' not in rs[0]:
            profiles += [r['profile'] for r in rs if r['profile']]
            continue
        backend = rs[0]['config']['comm']['backend']
        bucket_mb = rs[0]['config']['comm']['bucket_mb']
        steps = rs[0]['steps']
        wait = [median([r['wait'][k] / r['steps'] * 1e3 for r in rs]) for k in range(len(rs[0]['wait']))]
        busy = [median([r['busy'][k] / r['steps'] * 1e3 for r in rs]) for k in range(len(rs[0]['busy']))]
        comp = median([median(r['compute']) / r['steps'] * 1e3 for r in rs])
        alone = median(bench.get(backend, [])) if bench.get(backend) else None
        wmean, bmean = statistics.mean(wait), statistics.mean(busy)
        print(f'| {backend} | {bucket_mb:g} | {len(rs)} | '
              f'{" / ".join(f"{w:.2f}" for w in wait)} | {" / ".join(f"{b:.2f}" for b in busy)} | '
              f'{fmt(alone, ".2f")} | {fmt(wmean / alone if alone else None, ".2f")} | '
              f'{fmt(bmean / alone if alone else None, ".2f")} | {comp:.1f} | '
              f'{fmt(median([r["img_s"] for r in rs]))} |')
    print()
    print('Per step = the run\'s seconds / its optimizer steps (%d); wait is measured from the end '
          'of backward to the averaged gradients in .grad, so it includes waiting for the slower '
          'rank to finish its backward.' % steps)
    if profiles:
        print()
        print('Python DDP peer, --profile-steps (ms per step, max over ranks), median of %d runs:'
              % len(profiles))
        keys = [k for k in profiles[0] if k != 'bytes']
        med = {k: median([p.get(k) for p in profiles]) for k in keys}
        print('  ' + ', '.join(f'{k} {v:.2f}' for k, v in med.items()))
        if 'bwd_sync' in med and 'bwd_nosync' in med:
            print(f'  allreduce cost added to backward (bwd_sync - bwd_nosync): '
                  f'{med["bwd_sync"] - med["bwd_nosync"]:.2f} ms; bare allreduce '
                  f'{med.get("allreduce_flat", float("nan")):.2f} ms')


def summarize_scaling(out):
    runs = load_runs(out)
    print(header(out))
    print('| contender | setup | runs | train img/s (median) | per-run img/s | compute per step '
          '(per rank) | comm wait per step | other (loader, logging) per step | CPU s per run |')
    print('|---|---|---|---|---|---|---|---|---|')
    img = {}
    for (contender, setup), rs in sorted(runs.items()):
        img[(contender, setup)] = median([r['img_s'] for r in rs])
        if 'compute' in rs[0]:
            steps = rs[0]['steps']
            comp = [median([r['compute'][k] / r['steps'] for r in rs]) for k in range(len(rs[0]['compute']))]
            wait = [median([r['wait'][k] / r['steps'] for r in rs]) for k in range(len(rs[0]['wait']))]
            total = median([r['train_seconds'] / r['steps'] for r in rs])
            other = total - statistics.mean(comp) - statistics.mean(wait)
            extra = (f'{" / ".join(f"{c * 1e3:.1f} ms" for c in comp)} | '
                     f'{" / ".join(f"{w * 1e3:.1f} ms" for w in wait)} | {other * 1e3:.1f} ms')
        else:
            extra = '– | – | –'
        extra += f' | {fmt(median([r["cpu_s"] for r in rs]), ".1f")}'
        print(f'| {contender} | {setup} | {len(rs)} | {fmt(img[(contender, setup)])} | '
              f'{", ".join(fmt(r["img_s"]) for r in rs)} | {extra} |')
    print()
    for contender in sorted({c for c, _ in img}):
        one, two = img.get((contender, '1x256')), img.get((contender, '2x128'))
        if one and two:
            print(f'- {contender}: efficiency = {two:.0f} / (2 x {one:.0f}) = {two / (2 * one):.2f}, '
                  f'speed-up {two / one:.2f}x')


def summarize_curve(out):
    runs = load_runs(out)
    print(header(out))
    print('| contender | epoch | test accuracy | train img/s |')
    print('|---|---|---|---|')
    for (contender, setup), rs in sorted(runs.items()):
        for r in rs:
            for i, (acc, img) in enumerate(zip(r['acc'], r['epoch_img_s'])):
                print(f'| {contender} | {i + 1} | {acc * 100:.2f} % | {img:.0f} |')


def main():
    modes = {'vs': summarize_vs, 'overlap': summarize_overlap, 'scaling': summarize_scaling,
             'curve': summarize_curve}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    modes[sys.argv[1]](sys.argv[2])


if __name__ == '__main__':
    main()
