"""Load a model larger than the Runtime's memory budget (streamed) in a fresh process: the load's wall time and the
process's peak RSS. python probe.py ARTIFACT BUDGET_BYTES (the engine library as TVMSCHED_ENGINE_LIB names it)."""
import resource
import sys
import time

from tvmsched.runtime import Runtime

path, budget = sys.argv[1], int(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with Runtime("cpu", memory_budget=budget) as rt:
    start = time.perf_counter()
    model = rt.load(path, warmup=False)
    seconds = time.perf_counter() - start
    placement = rt.stats()[model.name]["placement"]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{placement} load {seconds * 1e3:.0f} ms, peak RSS {peak / 1024:.0f} MiB (+{(peak - before) / 1024:.0f} MiB in the load)")
