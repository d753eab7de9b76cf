"""Write data/results/<gpu>/notebook_times.json again from device-call logs' "ok ... (N s)" lines:
    python3 tools/notebook_times.py LOG ...
Each notebook's run reads, changes and writes that file, so runs at once on several GPUs can drop each
other's entries (tools/gpu_book_parallel.sh, tools/gpu_book_twins.sh); one writer afterwards puts them all back."""
import re
import sys

from nf4lab.__main__ import record_time

text = "".join(open(p).read() for p in sys.argv[1:])
times = {m.group(1): float(m.group(2)) for m in re.finditer(r"^ok\s+\S*/(\S+)\.ipynb \((\d+) s\)", text, re.M)}
for name, secs in times.items():
    record_time(name, secs)
print(f"notebook_times: {len(times)} notebooks of this call")
