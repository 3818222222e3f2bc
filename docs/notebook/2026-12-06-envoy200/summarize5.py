# Fifth pass: python3 summarize5.py > summary5.txt, from this directory.
# Sessions a to d (bench5{a,b,c,d}-SIDE-ROUND.txt; see run5.sh).
import re,glob,statistics
sessions={'a':['before','after1','after2'],'b':['before','after2','after3'],'c':['before','after2','after3','after4'],'d':['before','after4']}
for sess,sides in sessions.items():
    rows={}
    files=sorted(glob.glob(f'bench5{sess}-*.txt'))
    heads=[l for f in files for l in open(f) if l.startswith('#')]
    stamps=sorted(h.split(' uptime')[0][2:] for h in heads)
    print(f"== session {sess}: {stamps[0]} to {stamps[-1]}; load averages (1 min) {min(float(h.split('load average: ')[1].split(',')[0]) for h in heads):.1f}-{max(float(h.split('load average: ')[1].split(',')[0]) for h in heads):.1f}")
    for f in files:
        side,rnd=re.match(rf'bench5{sess}-(\w+)-(\d)\.txt',f).groups()
        for line in open(f):
            if not line.startswith('BenchmarkEPPInEnvoy'): continue
            size=line.split()[0].split('/')[1].replace('-2','')
            toks=line.split()
            m={toks[i+1]:float(toks[i]) for i in range(4,len(toks)-1,2)}
            rows.setdefault((size,side),[]).append((int(rnd),m))
    for size in ['1KB','32KB','200KB']:
        for side in sides:
            r=rows[(size,side)]
            def col(k): return [m[k] for _,m in r]
            print(f"{size:6} {side:6} epp/noop {' '.join('%.3f'%x for x in col('epp/noop'))}  best {min(col('epp/noop')):.3f} median {statistics.median(col('epp/noop')):.3f} worst {max(col('epp/noop')):.3f}")
            print(f"{'':13} epp/buffer median {statistics.median(col('epp/buffer')):.3f}; buffer/noop median {statistics.median(col('buffer/noop')):.3f} range {min(col('buffer/noop')):.3f}-{max(col('buffer/noop')):.3f}")
            print(f"{'':13} route-p50-us {' '.join('%.0f'%x for x in col('route-p50-us'))} median {statistics.median(col('route-p50-us')):.0f}; route-us median {statistics.median(col('route-us')):.0f}")
            print(f"{'':13} epp-us median {statistics.median(col('epp-us')):.0f} noop-us {statistics.median(col('noop-us')):.0f} buffer-us {statistics.median(col('buffer-us')):.0f} buffer-cl-us {statistics.median(col('buffer-cl-us')):.0f} static-us {statistics.median(col('static-us')):.0f}")
