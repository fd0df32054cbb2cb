"""CollNet/SHARP: the second, in-network NCCL communicator a job uses while it holds the switch.

Findings (NCCL master 2.30.7 @5067397; nccl-rdma-sharp-plugins @2f5ac02; PyTorch 2.13.0 headers and
`torch/csrc/distributed/c10d/init.cpp`):

- NCCL enables CollNet per communicator with `ncclConfig_t.collnetEnable` (0/1, default 0), since 2.27.3
  (`src/nccl.h.in`, `docs/userguide/source/api/types.rst`, `parseCommConfig` in `src/init.cc`).
  `NCCL_COLLNET_ENABLE` (since 2.6) *overrides* the field when set (`envConfigOverride`, `src/init.cc`) and
  is read again at every communicator init, before 2.27 and again from 2.27.5; 2.27.3 and 2.27.4 cached it
  once per process through `NCCL_PARAM` (NVIDIA/nccl#1741, fixed in 2.27.5: "Restore the ability to change
  NCCL_COLLNET_ENABLE during execution"). `NCCL_PARAM` values are cached after their first read
  (`src/include/param.h`); `ncclGetEnv` is a plain `getenv` behind the env plugin (`src/misc/param.cc`).
- CollNet needs an external net plugin that exports `ncclCollNetPlugin_v*`: `libnccl-net.so`, or what
  `NCCL_NET_PLUGIN` names (`<name>`, then `libnccl-net-<name>.so`; "none" loads none) (`src/plugin/net.cc`,
  `src/plugin/plugin_open.cc`). nccl-rdma-sharp-plugins builds `libnccl-net.so` with `sharp_plugin.c`
  when configured with SHARP (`src/Makefile.am`).
- NCCL turns CollNet off for the communicator, without failing, when there is no CollNet plugin, when the
  group spans fewer than `NCCL_COLLNET_NODE_THRESHOLD` nodes (default 2), or when SHARP setup fails on
  any rank ("Cannot initialize CollNet, using point-to-point network instead": `src/transport.cc`,
  `ncclCollNetSetup` in `src/transport/coll_net.cc`, whose result `src/init.cc` does not check). The
  communicator then runs ring/tree. `NCCL_ALGO=CollNetDirect/CollNetChain` only narrows the tuner's
  choice, and CollNetDirect also needs NVSwitch (`src/graph/tuning.cc`).
- The SHARP plugin sets these unless they are already set: `SHARP_COLL_ENABLE_SAT=1`,
  `SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD=0`, `SHARP_COLL_LOCK_ON_COMM_INIT=1`
  (`ncclSharpInit`). So the streaming-aggregation (SAT) lock is taken at communicator init and held
  until `closeColl` destroys the SHARP communicator. If the lock cannot be had, `sharp_coll_comm_init`
  fails and NCCL falls back as above. So one job holds a tree at a time. To hand the switch over, the
  holder destroys its group (`dist.destroy_process_group(pg)`).
- PyTorch: `ProcessGroupNCCL.Options().config` is the `ncclConfig_t` given to
  `ncclCommInitRankConfig`/`ncclCommSplit`. Python sees `blocking, cga_cluster_size, min_ctas, max_ctas,
  net_name`, plus `split_share, traffic_class, collnet_enable, cta_policy, nvls_ctas` when the build's
  NCCL has them (`collnet_enable` needs NCCL_HAS_COLLNET, NCCL >= 2.27: `c10d/NCCLUtils.hpp`).

What `collnet_group` does: it sets `config.collnet_enable = 1` when torch exposes it, and it also sets
`NCCL_COLLNET_ENABLE=1` in the environment only while the communicator is created. The environment
wins over the config, so an inherited `NCCL_COLLNET_ENABLE=0` (Megatron style, or `/etc/nccl.conf`)
must not be in force then. The communicator is created at once, through `device_id` and a barrier,
not lazily at the first collective. Then the environment goes back to what it was, so the job's other
communicators stay ring/tree.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from tvmsched.errors import TvmschedError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

ENV = "NCCL_COLLNET_ENABLE"
_COLLNET_SYMBOL = b"ncclCollNetPlugin_v"
_LIB_DIRS = ("/usr/local/lib", "/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
_create_lock = threading.Lock()


def _plugin_candidates() -> list[str]:
    """The library names NCCL tries for its net plugin, in its order (empty: external plugins off)."""
    env = os.environ.get("NCCL_NET_PLUGIN")
    if env is None:
        return ["libnccl-net.so"]
    if env.strip().lower() == "none":
        return []
    names = []
    for name in filter(None, (n.strip() for n in env.split(","))):
        names.append(name)
        if "/" not in name and not (name.startswith("lib") and name.endswith(".so")):
            names.append(f"libnccl-net-{name}.so")
    return names


def _find_plugin() -> tuple[str | None, str]:
    """(path of a net plugin with CollNet, or None; why not / where it is)."""
    names = _plugin_candidates()
    if not names:
        return None, "NCCL_NET_PLUGIN=none: NCCL loads no external net plugin, and CollNet needs the SHARP one"
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    sharp_dir = os.environ.get("HPCX_NCCL_RDMA_SHARP_PLUGIN_DIR")
    dirs += [os.path.join(sharp_dir, "lib")] if sharp_dir else []
    dirs += _LIB_DIRS
    without = []
    for name in names:
        paths = [p for p in ([name] if "/" in name else [os.path.join(d, name) for d in dirs]) if os.path.isfile(p)]
        for path in paths:
            with open(path, "rb") as f:
                if _COLLNET_SYMBOL in f.read():
                    return path, path
            without.append(path)
        stem = name[3:-3] if name.startswith("lib") and name.endswith(".so") and "/" not in name else None
        if not paths and stem and ctypes.util.find_library(stem):
            return name, f"{name} (in the ldconfig cache, not inspected)"
    if without:
        return None, f"{without[0]} exports no CollNet (nccl-rdma-sharp-plugins built without SHARP?)"
    return None, (f"no NCCL net plugin ({', '.join(names)}) on LD_LIBRARY_PATH or in the system library "
                  "folders; CollNet needs the libnccl-net.so of nccl-rdma-sharp-plugins")


def _nccl_version() -> tuple[int, ...] | None:
    try:
        import torch.cuda.nccl

        version = torch.cuda.nccl.version()
        return tuple(version) if isinstance(version, tuple) else None
    except Exception:
        return None


def collnet_available() -> tuple[bool, str]:
    """Whether this process can create a CollNet/SHARP communicator, and why not (never raises)."""
    try:
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return False, f"torch {torch.__version__} has no torch.distributed"
        if not dist.is_nccl_available():
            return False, f"torch {torch.__version__} has no NCCL backend (CollNet needs NCCL and a CUDA device)"
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible (CollNet needs NCCL on a GPU)"
        version = _nccl_version()
        env = os.environ.get(ENV)
        if version and (2, 27, 3) <= version < (2, 27, 5) and env not in (None, "1"):
            return False, f"NCCL {'.'.join(map(str, version))} caches {ENV}={env} per process (NVIDIA/nccl#1741)"
        if os.environ.get("NCCL_SHARP_DISABLE") == "1":
            return False, "NCCL_SHARP_DISABLE=1: the SHARP plugin refuses every CollNet communicator"
        path, where = _find_plugin()
        if path is None:
            return False, where
        shown = ".".join(map(str, version)) if version else "unknown"
        return True, (f"SHARP plugin {where}, NCCL {shown}; NCCL still falls back to ring/tree when the group "
                      "spans < NCCL_COLLNET_NODE_THRESHOLD (2) nodes or the SHARP lock is held by another job")
    except Exception as err:  # a check must not take the job down
        return False, f"cannot check CollNet support: {type(err).__name__}: {err}"


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """`name=value` in this process's environment (C getenv included) for the block, then as before."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def collnet_group(ranks: list[int] | None = None, *, timeout: timedelta | None = None) -> ProcessGroup:
    """A new NCCL process group with CollNet/SHARP on, created now (collective: every rank calls it).

    Non-members get `GroupMember.NON_GROUP_MEMBER`, as from `dist.new_group`. Destroy the group
    (`dist.destroy_process_group(pg)`) to release the SHARP lock for another job.
    """
    ok, reason = collnet_available()
    if not ok:
        raise TvmschedError(f"no in-network (CollNet/SHARP) communicator: {reason}")
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise TvmschedError("no in-network (CollNet/SHARP) communicator: call dist.init_process_group first")
    options = dist.ProcessGroupNCCL.Options()
    if hasattr(options, "config") and hasattr(type(options.config), "collnet_enable"):
        options.config.collnet_enable = 1
    device = dist.group.WORLD.bound_device_id or torch.device("cuda", torch.cuda.current_device())
    with _create_lock, _env(ENV, "1"):
        pg = dist.new_group(ranks, timeout=timeout, backend="nccl", pg_options=options,
                            group_desc="tvmsched_collnet", device_id=device)
        if pg != dist.GroupMember.NON_GROUP_MEMBER:
            index = torch.cuda.current_device() if device.index is None else device.index
            dist.barrier(group=pg, device_ids=[index])  # the communicator exists before the env reverts
    return pg
