"""tvmsched: a TVM-based compiler, tuning toolchain and runtime for sharing one device among DNN tenants."""

import os

__version__ = "0.1.0"

# TVM's CPU thread pool starts with one thread unless this is set before TVM loads.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
