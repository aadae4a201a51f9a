"""Samples every thread of a process (state, kernel wait channel, syscall) every few ms until it
exits; then, for each WINDOW line of the log (workers, unix start, unix end), prints where each
group of threads was."""
import collections, os, sys, time

log, out = sys.argv[1], sys.argv[2]
pid = None
while pid is None:
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                exe = os.readlink(f'/proc/{p}/exe')
            except OSError:
                continue
            if os.path.basename(exe).startswith('tar-'):
                pid = int(p)
    time.sleep(0.01)
rows = []
while os.path.exists(f'/proc/{pid}'):
    t = time.time()
    try:
        tids = os.listdir(f'/proc/{pid}/task')
    except OSError:
        break
    for tid in tids:
        d = f'/proc/{pid}/task/{tid}'
        try:
            comm = open(d + '/comm').read().strip()
            stat = open(d + '/stat').read()
            state = stat[stat.rindex(')') + 2]
            wchan = open(d + '/wchan').read().strip()
            sc = open(d + '/syscall').read().split()[0]
        except OSError:
            continue
        rows.append((t, int(tid), comm, state, wchan, sc))
    time.sleep(0.004)
names = {'202': 'futex', '232': 'epoll_wait', '281': 'epoll_pwait', '40': 'sendfile', '0': 'read',
         '45': 'recvfrom', '44': 'sendto', '1': 'write', '7': 'poll', '20': 'writev', '17': 'pread'}
windows = []
for line in open(log):
    if line.startswith('WINDOW '):
        _, w, a, b = line.split()
        windows.append((w, float(a), float(b)))
with open(out, 'w') as f:
    for k, (w, a, b) in enumerate(windows):
        kind = 'local files' if k % 2 == 0 else 'over HTTP'
        groups = collections.defaultdict(collections.Counter)
        stamps = set()
        for (t, tid, comm, state, wchan, sc) in rows:
            if not (a <= t <= b):
                continue
            stamps.add(t)
            g = ('main' if tid == pid else 'workers' if comm.startswith('loader-w')
                 else 'runtime' if comm.startswith('pinnable-remote')
                 else comm if comm.startswith('loader') else 'server+other')
            what = 'running' if state == 'R' else f'{names.get(sc, "sys" + sc)}:{wchan}'
            groups[g][what] += 1
        f.write(f'\n## window {k}: {kind}, {w} workers, {b - a:.2f} s, {len(stamps)} samples of every thread\n')
        for g, c in sorted(groups.items()):
            n = sum(c.values())
            f.write(f'{g} ({n / max(len(stamps), 1):.1f} threads): ' + ', '.join(
                f'{v / n:.0%} {k2}' for k2, v in c.most_common(6)) + '\n')
print(open(out).read())
