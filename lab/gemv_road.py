"""The designs the lab timed against the tensor-core GEMV (notebook 09's appendix), bf16, M = 1: each design's time
beside the kernel ("TC") of the same run where provenance.compare finds both, else why not. Each row's TC is the kernel
shipped on that row's date, not today's (lab/README.md says what changed since). FFMA: no tensor cores, a byte's two
weights by one pair lookup, then two float32 FMAs; the cp.async ring copies weights ahead into shared memory.

    python -m lab.gemv_road
"""
import nf4lab  # noqa: F401  (first: may switch numba to its simulator)
from nf4lab.measure import bench, gemv_bench, provenance, results

ROAD = [("FFMA design (pair lookup + 2 FFMA a byte)", "09_fused_gemv", "auto"), ("2 chains of mmas", "09_gemv_chains", "TC C2"),
        ("cp.async ring of 2 stages for weights", "09_gemv_ring", "TC R2"), ("3 blocks per SM", "09_gemv_b3", "TC B3 D1"),
        ("x from L1/L2, no slot", "09_gemv_tc", "TC x-global"), ("statistics loaded in pairs", "09_gemv_stats2", "TC stats2"),
        ("weights into L2, 2 steps ahead", "09_gemv_l2prefetch", "TC PF2"), ("stream-K: tiles split over blocks", "09_gemv_streamk", "TC stream-K"),
        ("only the last round of tiles split", "09_gemv_splitlast", "TC split-last"), ("one 16-warp block per SM", "09_gemv_w16", "TC W16 B1 D1"),
        ("step loop unrolled by two (ping-pong)", "09_gemv_lean", "TC pp")]


def main():
    print(f"{'design':<44}{'run':>22}{'4096x14336':>26}{'8192x28672':>26}")
    SH = ((4096, 14336), (8192, 28672))
    for label, stem, v in ROAD:
        runs, cells, whys = [bench.Run.load(stem)] + [bench.Run.load(stem, g) for g in results.gpus()], "", {}
        f = next((f for f in runs if f and any(gemv_bench.find_record(f, gemv_bench.kernel_name(v), s, "bf16") for s in SH)), None)
        for shape in SH:
            r, ref = (f and gemv_bench.find_record(f, gemv_bench.kernel_name(x), shape, "bf16") for x in (v, "TC"))
            ratio, why = provenance.compare(f.meta, ref, f.meta, r) if r and ref else (None, "no TC record in this run: not compared")
            t = "-" if not r else f"{r['ms'] * 1e3:.1f} / {ref['ms'] * 1e3:.1f} us: {ratio:.2f}x" if ratio else "not compared"
            cells, whys = cells + f"{t:>26}", {**whys, **({why: 1} if r and not ratio else {})}
        print(f"{label:<44}{f.meta['gpu'].split()[1] + ' ' + f.meta['date'][:16] if f else '-':>22}{cells}" + "".join(f"\n      ({w})" for w in whys))


if __name__ == "__main__":
    main()
