"""Build-here / measure-there tuning for devices this machine lacks (the GPU machine has no TVM compiler).

1. `build_kit` (here): per layer, schedules from MetaSchedule's design space, all built into one library per
   layer; kit.json lists them. Round 1 (no measured record of the layer's workload in the database): random
   samples (replay-trace search). Later rounds: MetaSchedule's evolutionary search seeded from the database's
   measured records (its first population takes the top records; an XGB cost model trained on all the model's
   measured records ranks the mutants), so each round concentrates near the best measured so far; schedules
   equal to a measured record are left out.
2. `tvmsched.tune.kit_run.measure_kit` (there): times every sample at each unit count.
3. `import_results` (here): every measured (sample, unit count) becomes a tuning record of the
   database, scoped by that unit count (all units: 0 on GPUs). Nothing unmeasured is stored.
K rounds of N samples: repeat 1-3 K times with the same database. Then `tvmsched compile --db` runs the best
records, or `tvmsched compile --qos-ms` plans the candidates from those records without a device.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import uuid
from pathlib import Path

from tvmsched.lower import kernels
from tvmsched.tune import search as tuning
from tvmsched.tune.candidates import GRID_LIMIT_UNIT_KIND
from tvmsched.errors import TvmschedError
from tvmsched.lower.layers import arg_specs
from tvmsched.lower.targets import describe
from tvmsched.tune.kit_run import KIT_FILE, KIT_VERSION, read_kit

log = logging.getLogger(__name__)



def build_kit(model, out_dir: str | Path, *, target: str = "cuda", samples: int = 32, input_shapes=None,
              name: str = "model", grid_limit_units: list[int] | None = None, progress: bool = True,
              database=None, token: str | None = None, seeded: bool = False, measured_ratio: float = 0.2,
              precision: str = "fp32") -> dict:
    """Sample and build `samples` schedules of every layer of `model` into `out_dir`; returns kit.json.

    grid_limit_units: CUDA without green contexts: also build each sample grid-limited to each of
    these SM counts (passes.grid_limit); they are measured on the whole device.
    seeded: draw the samples of layers with measured records (this target, all units) in `database` (a URL or
    TuningDatabase; None: the default one) by the seeded evolutionary search (see the module docstring); the
    other layers, and all of them without `seeded`, get random samples (round 1). measured_ratio: the share of
    the search's first population taken from the database (tuning.SeededSearch). precision: the layers as
    `compile_model(precision=...)` lowers them (fp16: their own workloads, so their own records).
    """
    from tqdm import tqdm

    from tvmsched.pipeline import lower_model, open_tuning_database
    from tvmsched.tuning_db.ms_adapter import target_dict

    if samples < 1:
        raise TvmschedError("--samples must be at least 1")
    from tvmsched.extras import require

    require("tune", "tvmsched tune kit (MetaSchedule's sampling)")
    graph, funcs, tvm_target = lower_model(model, target, input_shapes, precision=precision)
    info = describe(tvm_target)
    if grid_limit_units and not info.gpu:
        raise TvmschedError("grid limiting restricts GPU kernels: it needs --target cuda")
    specs = arg_specs(graph)
    search = None
    if seeded:
        search = tuning.SeededSearch(tvm_target, open_tuning_database(database, tvm_target, token=token),
                                     measured_ratio=measured_ratio)
        for workload in tuning.group_workloads(funcs):  # the cost model learns each workload's records once
            search.learn(workload.func)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    bar = tqdm(funcs.items(), desc="sampling and building", unit="layer", disable=not progress, file=sys.stderr)
    for index, (func_name, func) in enumerate(bar):
        bar.set_postfix_str(func_name[:40])
        seed = None
        if search is not None and search.records(func):
            seed = search.sample(func, samples, seed=index)
            schedules = seed.schedules
        else:
            schedules = tuning.sample_schedules(func, tvm_target, samples, seed=index)
        built = _build(func_name, schedules, tvm_target, out, grid_limit_units or [])
        if not built:
            log.warning("layer %s: no valid sampled schedule; it keeps the default schedule", func_name)
            continue
        entries.append(_kit_entry(func_name, func, built, specs[func_name], seed))
    device = info.device
    kit = {
        "version": KIT_VERSION, "id": uuid.uuid4().hex, "model": name, "device": device,
        "mechanism": "grid_limit" if grid_limit_units else info.mechanism,
        "grid_limit_units": sorted(set(grid_limit_units or [])), "target": target_dict(tvm_target), "funcs": entries,
        "round": kit_round(entries, samples), "samples_per_layer": samples,
        "device_code": kernels.cuda_device_code() if info.gpu else "native", "precision": precision,
    }
    (out / KIT_FILE).write_text(json.dumps(kit))
    return kit


def _kit_entry(func_name: str, func, built, args, seed) -> dict:
    """kit.json's entry of one layer: its library, its samples' traces, its workload (the database's key)."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    mod = tuning.task_module(func)
    return {
        "func": func_name,
        "library": built[0],
        "args": [[list(shape), dtype] for shape, dtype in args],
        "workload": tvm.ir.save_json(mod),
        "args_info": [tuning.plain_json(a.as_json()) for a in ArgInfo.from_prim_func(mod["main"])],
        "search": "replay" if seed is None else "evolutionary",
        "seeded": None if seed is None else {
            "records": seed.records, "best_us": seed.best_us, "population_seeds": seed.population_seeds,
        },
        "samples": [{"symbol": sym, "trace": tuning.plain_json(sch.trace.as_json()), "grid_limited": variants}
                    for sym, sch, variants in built[1]],
    }


def kit_round(entries: list[dict], samples: int) -> int:
    """The round a kit is: 1 when no layer was seeded from measured records, else one more than the rounds of
    `samples` measurements per layer that the most measured workload's records make up (layers sharing a
    workload add their samples to the same records). With the same --samples every round, this counts the
    rounds imported; records from other tuning (compile --tune-*) count too."""
    per_workload: dict[str, list[int]] = {}
    for entry in entries:
        if entry.get("seeded"):
            per_workload.setdefault(entry["workload"], []).append(entry["seeded"]["records"])
    rounds = [math.ceil(max(counts) / (samples * len(counts))) for counts in per_workload.values()]
    return 1 + max(rounds, default=0)


def _build(func_name: str, schedules: list, target, out: Path, grid_units: list[int]):
    """(library file, [(symbol, schedule, {k: grid-limited symbol})]) of the samples that compile; None if none does."""
    from tvmsched.passes.grid_limit import grid_limit

    samples = []
    for i, sch in enumerate(schedules):
        symbol, variants = f"{func_name}__s{i}", {}
        kernels_ = {symbol: sch.mod["main"]}
        for k in grid_units:
            limited, extent = grid_limit(sch.mod["main"], k)
            variants[str(k)] = symbol if extent is None else f"{symbol}__g{k}"  # None: already fits on k SMs
            kernels_[variants[str(k)]] = limited
        samples.append((symbol, sch, variants, kernels_))
    try:
        data = kernels.build_library({s: f for *_, ks in samples for s, f in ks.items()}, target)
    except TvmschedError:  # one bad sample fails the whole build: keep those that build alone
        samples = [sample for sample in samples if _builds(sample[3], target)]
        if not samples:
            return None
        data = kernels.build_library({s: f for *_, ks in samples for s, f in ks.items()}, target)
    library = f"{func_name}.so"
    (out / library).write_bytes(data)
    return library, [(symbol, sch, variants) for symbol, sch, variants, _ in samples]


def _builds(kernels_: dict, target) -> bool:
    try:
        kernels.build_library(kernels_, target)
        return True
    except TvmschedError:
        return False


def import_results(kit_dir: str | Path, results: dict, database=None, token: str | None = None) -> int:
    """Store every measured (sample, unit count) of a kit as a tuning record; returns how many."""
    from tvm.s_tir.meta_schedule.database import Workload

    from tvmsched.tuning_db import TuningDatabase, open_database
    from tvmsched.tuning_db.ms_adapter import record_from_json

    kit = read_kit(kit_dir)
    if not isinstance(results, dict) or results.get("kit") != kit["id"]:
        raise TvmschedError(f"the results are not measurements of the kit in {kit_dir} (kit id mismatch)")
    full, unit_kind, times = results.get("full_units"), results.get("unit_kind"), results.get("times_us")
    if not isinstance(full, int) or unit_kind not in ("gpu_sm", "cpu_thread") or not isinstance(times, dict):
        raise TvmschedError("the results lack full_units, unit_kind or times_us")
    if results.get("mechanism") == "grid_limit":
        unit_kind = GRID_LIMIT_UNIT_KIND  # restricted by the kernel's grid, not by a green context
    base = open_database(database, target=kit["target"], token=token)
    scopes: dict[int, TuningDatabase] = {}
    stored = 0
    for entry in kit["funcs"]:
        workload = Workload(_load_mod(entry["workload"]))
        for sample in entry["samples"]:
            for units, us in (times.get(entry["func"], {}).get(sample["symbol"]) or {}).items():
                if not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
                    continue  # failed or missing: nothing is stored
                scope = record_units(int(units), full, unit_kind)
                kind = "gpu_sm" if scope == 0 else unit_kind
                if scope not in scopes:
                    scopes[scope] = TuningDatabase(base.store, units=scope, unit_kind=kind, target=kit["target"])
                record = record_from_json([sample["trace"], [us * 1e-6], kit["target"], entry["args_info"]], workload)
                scopes[scope].commit_tuning_record(record)
                stored += 1
    return stored


def round_summary(kit_dir: str | Path, results: dict) -> dict:
    """What a measured round found: per layer the fastest sample at all units and, for the layers the round's
    search was seeded for, the database's best when the kit was built (both in us)."""
    kit = read_kit(kit_dir)
    full, times = str(results.get("full_units")), results.get("times_us") or {}
    layers = {}
    for entry in kit["funcs"]:
        measured = [t.get(full) for t in (times.get(entry["func"]) or {}).values() if isinstance(t, dict)]
        measured = [us for us in measured if isinstance(us, (int, float)) and math.isfinite(us) and us > 0]
        before = (entry.get("seeded") or {}).get("best_us")
        layers[entry["func"]] = {"round_best_us": min(measured, default=None), "database_best_us": before}
    seeded = {f: v for f, v in layers.items() if v["database_best_us"] is not None and v["round_best_us"] is not None}
    return {
        "round": kit.get("round", 1), "layers": layers, "seeded_layers": len(seeded),
        "faster": sum(v["round_best_us"] < v["database_best_us"] for v in seeded.values()),
        "database_best_sum_us": sum(v["database_best_us"] for v in seeded.values()),
        "best_sum_us": sum(min(v["round_best_us"], v["database_best_us"]) for v in seeded.values()),
    }


def record_units(units: int, full: int, unit_kind: str) -> int:
    """The units a record is stamped with: on GPUs all SMs are 0 (what MetaSchedule tuning stamps)."""
    return 0 if unit_kind.startswith("gpu_sm") and units >= full else units


def _load_mod(text: str):
    import tvm

    return tvm.ir.load_json(text)
