"""What one scan helper holds after scanning and counting shards, and where: a forked helper (`Helpers(1)`, from
this small process as the CLI forks its own) runs `shardwork.work_shard` on the input's shards [a, b), and at each
phase reports its PSS by mapping (glibc's [heap], other anonymous memory, files), pymalloc's arenas, glibc's
mallinfo2, Arrow's pool, the modules imported and the objects the collector tracks.

    python -P bench/helper_memory.py <input shards folder> <scratch work folder> <a> <b> [<new results file>]
"""
import ctypes
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pack_assets.core.settings import Settings  # noqa: E402
from pack_assets.runner import procs, shardwork  # noqa: E402

MB = 1 << 20


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def smaps():
    cat = {"heap": 0, "anon": 0, "file": 0, "anon_regions_ge_32mb": 0}
    cur = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and not parts[0].endswith(":"):
            name = parts[5] if len(parts) > 5 else ""
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            cur = "heap" if name == "[heap]" else ("anon" if name == "" or name.startswith("[anon") else "file")
            if cur == "anon" and hi - lo >= 32 * MB:
                cat["anon_regions_ge_32mb"] += 1
        elif parts[0] == "Pss:":
            cat[cur] += int(parts[1]) * 1024
    return {k: (v // MB if k != "anon_regions_ge_32mb" else v) for k, v in cat.items()}


def pymalloc():
    fd, p = tempfile.mkstemp()
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    text = Path(p).read_text()
    os.unlink(p)
    out = {}
    for line in text.splitlines():
        for key in ("# arenas allocated current", "# bytes in allocated blocks", "# bytes in available blocks",
                    "Total"):
            if line.startswith(key) and key not in out:
                v = int(line.split("=")[-1].replace(",", "").strip())
                out[key] = v if key.startswith("# arenas") else v // MB
    return out


def diag(label):
    import pyarrow as pa
    mi = ctypes.CDLL(None).mallinfo2
    mi.restype = MallInfo2
    m = mi()
    st = {ln.split(":")[0]: int(ln.split()[1]) // 1024 for ln in Path("/proc/self/status").read_text().splitlines()
          if ln.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile"))}
    return {"label": label, "pid": os.getpid(), "status_mb": st, "pss_mb": smaps(), "pymalloc_mb": pymalloc(),
            "glibc_mb": {"main_arena": m.arena // MB, "mmapped": m.hblkhd // MB, "in_use": m.uordblks // MB,
                         "free": m.fordblks // MB},
            "arrow_mb": pa.total_allocated_bytes() // MB, "arrow_backend": pa.default_memory_pool().backend_name,
            "modules": len(sys.modules), "gc_objects": len(gc.get_objects())}


def after(label, fn, *a):
    fn(*a)
    return diag(label)


def trim_and_collect(label):
    from pack_assets.core.handback import hand_back
    gc.collect()
    hand_back()
    return diag(label)


def tokenizer_size(label, flat):
    from pack_assets.core.counting.counters import counter_for
    s = Settings.from_flat(flat)
    counter_for(s.model_profile())
    return diag(label)


if __name__ == "__main__":
    inp, work, a, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    s = Settings(input_dir=inp, work_dir=work, output_dir=work + "_out")
    from pack_assets.core.preflight import listing
    shards = listing(s)[a:b]
    flat = s.flat()
    out = []
    with procs.Helpers(1) as h:
        out.append(h.pool.submit(diag, "fresh helper").result())
        out.append(h.pool.submit(tokenizer_size, "tokenizer built", flat).result())
        t = time.time()
        for k in shards:
            n = h.pool.submit(shardwork.work_shard, flat, k, True).result()
        out.append(h.pool.submit(diag, f"after {len(shards)} shards, last {n} samples ({time.time()-t:.0f}s)").result())
        out.append(h.pool.submit(trim_and_collect, "gc.collect + hand_back").result())
        from pack_assets.core import drawing
        out.append(h.pool.submit(after, "matplotlib warm", drawing._warm).result())
    if len(sys.argv) > 5:
        from common import ResultsFile

        print(ResultsFile(sys.argv[5], "helper_memory").write(out))
    else:
        print(json.dumps(out, indent=1))
