"""The process MetaSchedule's builder and runner pools start: TVM's own worker loop (`tvm.exec.popen_worker`), entered
through tvmsched so that TVM loads with torch hidden (tvmsched/__init__.py). Where torch is installed a worker then
starts in ~1.5 s instead of ~5.4 s, and tuning starts pools for its builds and runs again and again.
`tvmsched.tune.search.workers_started_by_tvmsched` points TVM's pools here."""

import tvmsched  # noqa: F401 - first: TVM below loads with torch hidden

from tvm.exec import popen_worker

if __name__ == "__main__":
    popen_worker.main()  # reads the pipe descriptors from sys.argv[1:3], as under `python -m tvm.exec.popen_worker`
