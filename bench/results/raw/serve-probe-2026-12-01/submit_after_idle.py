"""The engine's submit timed after a sleep of GAP_US between requests (a client's think time): python
submit_after_idle.py ARTIFACT GAP_US (bench/results/serving.md, 2026-12-01)."""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from tvmsched.runtime import Runtime, Executor
from tvmsched.runtime.executor import to_engine
path, gap_us = sys.argv[1], float(sys.argv[2])
rt = Runtime("cpu")
m = rt.load(path, name="m")
x = to_engine(Executor(path).random_inputs(0))
eng = rt._engine
walls, cpus = [], []
for i in range(600):
    if gap_us:
        time.sleep(gap_us / 1e6)
    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
    r = eng.submit("m", x, -1, -1.0)
    w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    r.wait(60.0, 0.0)
    if i >= 100:  # (the first 100: warm-up)
        walls.append((w1 - w0) / 1e3)
        cpus.append((c1 - c0) / 1e3)
print(f"{Path(path).name} gap {gap_us:.0f} us: engine submit wall p50 {statistics.median(walls):.1f} "
      f"cpu p50 {statistics.median(cpus):.1f} us")
rt.shutdown()
