import sys, time, statistics
sys.path.insert(0, "/work/main")
from tvmsched.runtime import Runtime, Executor
from tvmsched.runtime.executor import to_engine
path, gap_us = sys.argv[1], float(sys.argv[2])
rt = Runtime("cpu")
m = rt.load(path, name="m")
x = to_engine(Executor(path).random_inputs(0))
eng = rt._engine
walls, cpus = [], []
for i in range(600):
    if gap_us: time.sleep(gap_us / 1e6)
    c0 = time.thread_time_ns(); w0 = time.perf_counter_ns()
    r = eng.submit("m", x, -1, -1.0)
    w1 = time.perf_counter_ns(); c1 = time.thread_time_ns()
    r.wait(60.0, 0.0)
    if i >= 100: walls.append((w1 - w0) / 1e3); cpus.append((c1 - c0) / 1e3)
print(f"{path.split('/')[-1]} gap {gap_us:.0f} us: engine submit wall p50 {statistics.median(walls):.1f} cpu p50 {statistics.median(cpus):.1f} us")
rt.shutdown()
