"""Load a model split across two CPU devices in a fresh process: the load's wall time and the process's peak RSS.
python split_probe.py ARTIFACT (the engine library as TVMSCHED_ENGINE_LIB names it)."""
import resource
import sys
import time

from tvmsched.runtime import Runtime

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with Runtime("cpu", devices=("cpu:0", "cpu:1")) as rt:
    start = time.perf_counter()
    model = rt.load(sys.argv[1], split=True, warmup=False)
    seconds = time.perf_counter() - start
    placement = rt.stats()[model.name]["placement"]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{placement} load {seconds * 1e3:.0f} ms, peak RSS {peak / 1024:.0f} MiB (+{(peak - before) / 1024:.0f} MiB in the load)")
