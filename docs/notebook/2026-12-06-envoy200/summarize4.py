import re,glob,statistics,sys
rows={}
for f in sorted(glob.glob('bench4-*.txt')):
    side,rnd=re.match(r'bench4-(\w+)-(\d)\.txt',f).groups()
    for line in open(f):
        if not line.startswith('BenchmarkEPPInEnvoy'): continue
        size=line.split()[0].split('/')[1].replace('-2','')
        toks=line.split()
        m={toks[i+1]:float(toks[i]) for i in range(4,len(toks)-1,2)}
        rows.setdefault((size,side),[]).append((int(rnd),m))
for size in ['1KB','32KB','200KB']:
    for side in ['before','after1','after2']:
        r=rows[(size,side)]
        def col(k): return [m[k] for _,m in r]
        print(f"{size:6} {side:6} epp/noop {' '.join('%.3f'%x for x in col('epp/noop'))}  best {min(col('epp/noop')):.3f} median {statistics.median(col('epp/noop')):.3f} worst {max(col('epp/noop')):.3f}")
        print(f"{'':13} epp/buffer {' '.join('%.3f'%x for x in col('epp/buffer'))}  median {statistics.median(col('epp/buffer')):.3f}")
        print(f"{'':13} buffer/noop {' '.join('%.3f'%x for x in col('buffer/noop'))}  median {statistics.median(col('buffer/noop')):.3f}")
        print(f"{'':13} epp/buffer-cl median {statistics.median(col('epp/buffer-cl')):.3f} range {min(col('epp/buffer-cl')):.3f}-{max(col('epp/buffer-cl')):.3f}")
        print(f"{'':13} route-p50-us {' '.join('%.0f'%x for x in col('route-p50-us'))} median {statistics.median(col('route-p50-us')):.0f}; route-us median {statistics.median(col('route-us')):.0f}")
        print(f"{'':13} epp-us median {statistics.median(col('epp-us')):.0f} noop-us {statistics.median(col('noop-us')):.0f} buffer-us {statistics.median(col('buffer-us')):.0f} buffer-cl-us {statistics.median(col('buffer-cl-us')):.0f} static-us {statistics.median(col('static-us')):.0f}")
