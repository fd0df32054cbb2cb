"""The `tvmsched` command line: thin commands over the library; user errors exit 2 with one line."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click
import numpy as np

from tvmsched.errors import TvmschedError, one_line, printable


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")
def cli(verbose: bool) -> None:
    """tvmsched: compile ONNX models with TVM and run them layer by layer."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@cli.group()
def models() -> None:
    """The bundled model zoo."""


@models.command("list")
def models_list() -> None:
    """List the bundled models and the real architectures."""
    from tvmsched.models import REAL_MODELS, list_models
    from tvmsched.models.real import cache_dir

    for spec in list_models():
        click.echo(f"{spec.name:16s} {spec.description}")
    click.echo(f"\nreal architectures (exported or filled on first build, cached in {cache_dir()}):")
    for real in REAL_MODELS.values():
        click.echo(f"{real.name:16s} {real.description}")


@models.command("build")
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Output .onnx file (default NAME.onnx).")
@click.option("--seed", default=0, show_default=True, help="Seed of the weights.")
def models_build(name: str, output: str | None, seed: int) -> None:
    """Write the bundled model NAME as an ONNX file."""
    from tvmsched.models import UnknownModelError, save

    from tvmsched.models import REAL_MODELS

    output = output or f"{name}.onnx"
    try:
        save(name, output, seed=seed)
    except UnknownModelError as err:
        raise TvmschedError(err.args[0]) from None
    click.echo(f"wrote {output}")
    if name in REAL_MODELS and REAL_MODELS[name].dynamic:
        click.echo(f"its axes {', '.join(REAL_MODELS[name].dynamic)} are dynamic: tvmsched compile {output} "
                   f"{REAL_MODELS[name].input_shape_options()}")


@cli.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Artifact file (default MODEL.tvms).")
@click.option("--target", default="llvm", show_default=True,
              help="llvm (this machine's CPU), llvm:LEVEL (portable, x86-64-v2, x86-64-v3, x86-64-v4 or an LLVM CPU "
                   "name such as skylake-avx512), cuda, a TVM target tag or a JSON target.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D1,D2,...", help="Fix a dynamic input shape.")
@click.option("--tune-trials", default=0, show_default=True,
              help="MetaSchedule trials per distinct layer workload (0: default schedules); with --tune-minutes, each one's cap.")
@click.option("--tune-minutes", type=float, metavar="M",
              help="Tune the model within M minutes: split across its distinct workloads by their share of the latency.")
@click.option("--db", "db_url", help="Tuning database: sqlite:///F, postgresql+psycopg://..., or http://host:port. "
              "Alone (no --tune-*): compile with its records for this target, where they measure faster; no search.")
@click.option("--db-token-file", type=click.Path(dir_okay=False), help="Bearer token for writes to a database service.")
@click.option("--qos-ms", type=float, help="Model latency target: build restricted-unit candidates per layer.")
@click.option("--units", "units_csv", metavar="K1,K2,...", help="Unit counts for candidates (default: 1..all).")
@click.option("--rpc", metavar="HOST:PORT:KEY", help="Measure tuning trials on devices of a TVM RPC tracker.")
@click.option("--preempt-checks/--no-preempt-checks", default=True, show_default=True,
              help="Instrument kernels with preempt-flag checks (needed for preemption).")
@click.option("--loop-checks", type=click.IntRange(min=0), default=0, metavar="K",
              help="CUDA: idempotent kernels also check the preempt flag K times through their blocks' outermost loop "
              "(evenly spaced), so a running kernel stops within about 1/K of its time (one barrier per check; "
              "docs/preemption.md). 0: at block starts only.")
@click.option("--progress-counters", is_flag=True,
              help="Kernels count their completed blocks (GPU thread blocks, CPU parallel iterations) for the runtime.")
@click.option("--index-checks/--no-index-checks", default=True, show_default=True,
              help="Bounds-check indices read from run-time data (off only to measure the checks: unsafe).")
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False), metavar="KEYFILE",
              help="Sign the artifact with this Ed25519 private key (tvmsched keys generate).")
@click.option("--batch-sizes", "batch_csv", metavar="B",
              help="Compile for B rows, or several sizes (1,2,4,8) in one artifact with the weights stored once: the "
                   "batch dimension is found and checked row by row against onnxruntime (docs/batching.md).")
@click.option("--precision", default="fp32", show_default=True, metavar="P",
              help="fp32, or fp16: fp16 compute with fp32 accumulation (tensor cores on CUDA), the model's inputs and "
                   "outputs kept as it declares them (docs/precision.md).")
def compile_cmd(
    model: str, output: str | None, target: str, input_shapes: tuple[str, ...], tune_trials: int,
    tune_minutes: float | None, db_url: str | None, db_token_file: str | None, qos_ms: float | None,
    units_csv: str | None, rpc: str | None, preempt_checks: bool, loop_checks: int, progress_counters: bool, index_checks: bool,
    sign_key: str | None, batch_csv: str | None, precision: str,
) -> None:
    """Compile an ONNX MODEL into a per-layer artifact (tuned with --tune-trials and/or --tune-minutes)."""
    from tvmsched.frontend.loader import parse_input_shapes
    from tvmsched.lower.targets import is_cuda_spec

    if is_cuda_spec(target):  # before anything imports TVM (tvmsched.pipeline does)
        from tvmsched.lower.cuda_toolchain import prepare_cuda_build

        prepare_cuda_build()
    from tvmsched.pipeline import check_tuning_budget

    check_tuning_budget(tune_trials, tune_minutes, qos_ms)  # before any long work
    from tvmsched.lower.precision import check_precision

    check_precision(precision)
    shapes = parse_input_shapes(input_shapes)
    batch_size = _parse_batch_sizes(batch_csv)
    signing_key = None
    if sign_key:  # read before compiling: a bad key fails fast
        from tvmsched.artifact.signing import key_id, load_private_key

        signing_key = load_private_key(sign_key)
    output = output or str(Path(model).with_suffix(".tvms"))
    _check_folder(output)
    from tvmsched.pipeline import compile_file

    tuning = tune_trials > 0 or tune_minutes is not None or db_url is not None  # a search, or the records of --db
    database = _open_database(db_url, db_token_file, target) if tuning or qos_ms else None
    artifact = compile_file(
        model, target=target, input_shapes=shapes, tune_trials=tune_trials, tune_minutes=tune_minutes,
        database=database, progress=tuning,
        qos_ms=qos_ms, units=_parse_units(units_csv), rpc=rpc, preempt_checks=preempt_checks, loop_checks=loop_checks,
        progress_counters=progress_counters, index_checks=index_checks, batch_size=batch_size, precision=precision,
    )
    artifact.save(output, signing_key)
    manifest = artifact.manifest
    if manifest.tuning:
        _print_tuning_summary(manifest.tuning)
    signed = f", signed by key {key_id(signing_key.public_key())}" if signing_key else ""
    click.echo(
        f"wrote {output}: {len(manifest.layers)} layers, {manifest.device} ({manifest.device_code}), "
        f"{os.path.getsize(output) / 1e6:.2f} MB{signed}"
    )


_MAX_BATCH_SIZES = 16  # sizes in one artifact (each compiles the model once more)


def _parse_batch_sizes(text: str | None) -> list[int] | None:
    """--batch-sizes: distinct positive sizes (None when not given)."""
    if text is None:
        return None
    sizes = text.split(",")
    if not all(size.strip().isdigit() and 0 < int(size) <= 1 << 20 for size in sizes):
        raise TvmschedError(f"--batch-sizes {text!r} is not a comma-separated list of row counts from 1 to 1048576")
    if len(set(map(int, sizes))) != len(sizes):
        raise TvmschedError(f"--batch-sizes {text}: a size is given twice")
    if len(sizes) > _MAX_BATCH_SIZES:
        raise TvmschedError(f"--batch-sizes {text}: at most {_MAX_BATCH_SIZES} sizes in one artifact")
    return sorted(int(size) for size in sizes)


def _check_folder(path: str) -> None:
    """A file can be written at `path` (its folder exists): checked before long work, not after."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise TvmschedError(f"cannot write {path}: folder {folder} does not exist")


@cli.group()
def keys() -> None:
    """Ed25519 keys that sign artifacts (compile --sign) and that loaders trust (--trust)."""


@keys.command("generate")
@click.argument("name")
def keys_generate(name: str) -> None:
    """Write a new key pair: NAME.key (private, mode 0600) and NAME.pub (public, to hand to loaders)."""
    from tvmsched.artifact.signing import generate_keys, key_id

    private_path, public_path, key = generate_keys(name)
    click.echo(f"wrote {private_path} (private: keep it secret) and {public_path} (key {key_id(key.public_key())})")


@keys.command("verify")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--trust", "trusted", multiple=True, required=True, type=click.Path(dir_okay=False), metavar="KEY.pub",
              help="A trusted public key (repeatable).")
def keys_verify(artifact: str, trusted: tuple[str, ...]) -> None:
    """Check that ARTIFACT is intact and signed by a trusted key, without loading its code."""
    from tvmsched.runtime import native

    signer = native.verify_artifact(artifact, list(trusted))["signer"]
    click.echo(f"{artifact}: signed by trusted key {signer}")


@cli.group()
def tune() -> None:
    """Build-here / measure-there tuning for a device this machine lacks (e.g. a GPU)."""


@tune.command("kit")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), required=True, help="Kit folder.")
@click.option("--target", default="cuda", show_default=True, help="llvm, cuda, a TVM target tag or a JSON target.")
@click.option("--samples", default=32, show_default=True, help="MetaSchedule schedules sampled per layer.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D1,D2,...", help="Fix a dynamic input shape.")
@click.option("--grid-limit", "grid_csv", metavar="K1,K2,...",
              help="GPUs without green contexts: also build each kernel grid-limited to these SM counts.")
@click.option("--db", "db_url", help="Database whose measured records seed later rounds (default: the local SQLite file).")
@click.option("--db-token-file", type=click.Path(dir_okay=False), help="Bearer token for a database service.")
@click.option("--fresh", is_flag=True, help="Random samples for every layer, ignoring the database's records (a new round 1).")
@click.option("--precision", default="fp32", show_default=True, metavar="P",
              help="fp32 or fp16: the layers as `tvmsched compile --precision P` builds them (records keyed by their dtypes).")
def tune_kit(model: str, out_dir: str, target: str, samples: int, input_shapes: tuple[str, ...], grid_csv: str | None,
             db_url: str | None, db_token_file: str | None, fresh: bool, precision: str) -> None:
    """Sample and build schedules of every layer of MODEL into a measurement kit.

    Layers whose workload has measured records in the database (imported from earlier rounds) are sampled by
    MetaSchedule's evolutionary search seeded from those records; the others at random (round 1).
    """
    from tvmsched.frontend.loader import load_onnx, parse_input_shapes
    from tvmsched.lower.targets import is_cuda_spec

    shapes = parse_input_shapes(input_shapes)
    token = _read_token(db_token_file)
    if is_cuda_spec(target):
        from tvmsched.lower.cuda_toolchain import prepare_cuda_build

        prepare_cuda_build()
    from tvmsched.tune.kit_build import build_kit

    kit = build_kit(load_onnx(model), out_dir, target=target, samples=samples, input_shapes=shapes, name=Path(model).stem,
                    grid_limit_units=_parse_units(grid_csv), database=db_url, token=token, seeded=not fresh,
                    precision=precision)
    count = sum(len(entry["samples"]) for entry in kit["funcs"])
    seeded = [entry["seeded"] for entry in kit["funcs"] if entry.get("seeded")]
    how = (f"{len(seeded)} of {len(kit['funcs'])} layers searched from {sum(s['records'] for s in seeded)} measured records"
           if seeded else "random samples")
    click.echo(f"wrote {out_dir}: round {kit['round']} ({how}), {len(kit['funcs'])} layers, {count} kernels for {kit['device']}"
               + (f" at {kit['precision']}" if kit["precision"] != "fp32" else ""))


@tune.command("measure")
@click.argument("kit_dir", type=click.Path(file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Results JSON file.")
@click.option("--units", "units_csv", metavar="K1,K2,...|all",
              help="Unit counts (default: GPU partition multiples; CPU 1..all); 'all': only all units (a tuning round).")
@click.option("--repeat", default=5, show_default=True, help="Timed batches per kernel and unit count (median).")
def tune_measure(kit_dir: str, output: str, units_csv: str | None, repeat: int) -> None:
    """Time every kernel of a kit at each unit count on this machine's device (needs only the TVM runtime)."""
    from tvmsched.tune.kit_run import measure_kit, write_results

    results = measure_kit(kit_dir, "all" if units_csv == "all" else _parse_units(units_csv), repeat=repeat)
    write_results(results, output)
    click.echo(f"wrote {output}: {results['device_name']}, units {results['units']}")


@tune.command("import")
@click.argument("kit_dir", type=click.Path(file_okay=False))
@click.argument("results_path", type=click.Path(dir_okay=False))
@click.option("--db", "db_url", help="Database URL (default: the local SQLite file).")
@click.option("--db-token-file", type=click.Path(dir_okay=False), help="Bearer token for a database service.")
def tune_import(kit_dir: str, results_path: str, db_url: str | None, db_token_file: str | None) -> None:
    """Store a kit's measurements as tuning records, scoped by unit count."""
    from tvmsched.tune.kit_build import import_results, round_summary
    from tvmsched.tuning_db.json_limits import loads as bounded_loads

    try:
        results = bounded_loads(Path(results_path).read_text())
    except (OSError, ValueError) as err:  # ValueError: not JSON, or nested too deeply to parse
        raise TvmschedError(f"cannot read results {results_path}: {one_line(err)}") from None
    stored = import_results(kit_dir, results, db_url, token=_read_token(db_token_file))
    summary = round_summary(kit_dir, results)
    found = ""
    if summary["seeded_layers"]:
        found = (f"; {summary['faster']} of {summary['seeded_layers']} seeded layers measured faster than the database's best "
                 f"(sum of the layers' best {summary['database_best_sum_us']:.4g} -> {summary['best_sum_us']:.4g} us)")
    click.echo(f"round {summary['round']}: stored {stored} measured records{found}")


@cli.command("profile-coloc")
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", type=click.Path(dir_okay=False), help="Also write the rows as JSON.")
@click.option("--db", "db_url", help="Tuning database that stores the profile (default: the local SQLite file).")
@click.option("--device", default="cpu", type=click.Choice(["cpu", "cuda"]))
@click.option("--seconds", default=0.3, show_default=True, help="Measuring time per pair and mode.")
@click.option("--store/--no-store", default=True, show_default=True,
              help="Store the profile in the database; --no-store with --out writes the JSON only (Runtime and "
              "bench/colocation.py read it as --colocation FILE.json; no database package needed).")
def profile_coloc(artifacts: tuple[str, ...], out: str | None, db_url: str | None, device: str, seconds: float,
                  store: bool) -> None:
    """Measure the interference of candidate layers of every pair of ARTIFACTS co-running; store it in the database."""
    from tvmsched.runtime.colocation import device_name, profile, save

    if len(artifacts) < 2:
        raise TvmschedError("profile-coloc needs at least two artifacts")
    if not store and not out:
        raise TvmschedError("--no-store needs --out FILE.json: the profile would go nowhere")
    database = None
    if store:
        from tvmsched.tuning_db import open_store

        database = open_store(db_url)
        if not hasattr(database, "save_colocation"):
            raise TvmschedError("colocation profiles are stored in SQL databases (sqlite:/// or postgresql://), not over HTTP")
    rows = profile(list(artifacts), device, seconds)
    if database is not None:
        database.save_colocation(device_name(device), rows)
    if out:
        save(rows, out)
    worst = max(rows, key=lambda r: r["overhead_per_unit_time"])
    where = f"in {database.url}" if database is not None else f"to {out}"
    click.echo(f"stored {len(rows)} pairs {where}; largest overhead {worst['overhead_per_unit_time']:.2f} ({worst['first']} beside {worst['second']})")


@cli.command("run")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False), help=".npz keyed by ONNX input name.")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), help="Write outputs to this .npz.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Default: the artifact's device.")
@click.option("--repeat", default=0, show_default=True, help="Time N runs and print p50/p99 latency.")
@click.option("--check", "check_model", type=click.Path(dir_okay=False),
              help="Compare outputs with onnxruntime on this ONNX model; with --repeat (CPU) also time onnxruntime on "
              "the same inputs and threads and print both latencies side by side.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: outputs, latency summary, check.")
@click.option("--trust", "trusted", multiple=True, type=click.Path(dir_okay=False), metavar="KEY.pub",
              help="Run only an artifact signed by this public key (repeatable), checked before any of its code is "
              "loaded. Without --trust nothing is verified beyond checksums, which anyone can recompute: an unsigned "
              "artifact is code that runs with your rights as it loads (README, Trust model). "
              "TVMSCHED_REQUIRE_SIGNATURE=1 in the environment makes --trust mandatory.")
@click.option("--memory-budget", metavar="BYTES", help="Device memory for the model (e.g. 64MiB): a larger model streams "
              "its weights from the host tiers (docs/tiering.md).")
@click.option("--topology", default="auto", show_default=True, metavar="auto|FILE.json",
              help="With --memory-budget: the tiers (plan-memory's topology).")
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False), help="With --memory-budget: a plan-memory --json plan; "
              "this run takes GPU --gpu's shares of the tiers.")
@click.option("--gpu", default=0, show_default=True, help="The plan's GPU this run is.")
def run_cmd(artifact: str, inputs_path: str | None, output_path: str | None, device: str | None, repeat: int,
            check_model: str | None, as_json: bool, trusted: tuple[str, ...], memory_budget: str | None, topology: str,
            plan_path: str | None, gpu: int) -> None:
    """Run a compiled ARTIFACT once (random inputs unless --inputs).

    An artifact is native code: loading it runs its kernels.so, library constructors included, with your
    rights. Run only artifacts you built, or pass --trust with the public key of whoever built them."""
    from tvmsched.runtime import load

    if output_path:
        _check_folder(output_path)
    if memory_budget is not None:
        executor = _BudgetRun(artifact, device, trusted, memory_budget, topology, plan_path, gpu)
    else:
        executor = load(artifact, device, trusted_keys=trusted)
    inputs = _read_npz(inputs_path) if inputs_path else executor.random_inputs()
    outputs = executor.run(inputs)
    summary: dict = {"artifact": artifact, "model": executor.manifest.model_name, "device": executor.device,
                     "outputs": {name: {"shape": list(v.shape), "dtype": str(v.dtype), "mean": float(v.mean()),
                                        "max": float(v.max())} for name, v in outputs.items()}}
    echo = (lambda text: None) if as_json else click.echo
    for name, out in summary["outputs"].items():
        echo(f"output {name}: shape {tuple(out['shape'])} {out['dtype']} mean {out['mean']:.6g} max {out['max']:.6g}")
    if output_path:
        with open(output_path, "wb") as out:  # exactly this name (np.savez would append .npz)
            np.savez(out, **outputs)
        echo(f"wrote {output_path}")
    from tvmsched.cli import compare

    session = None  # one onnxruntime session checks the outputs and, with --repeat, is timed
    if check_model:
        threads = compare.runtime_threads("cpu")
        session = compare.onnxruntime_session(_reference_model(check_model, executor.manifest), threads)
        summary["check"] = _check_against_onnxruntime(check_model, inputs, outputs, echo=echo, session=session,
                                                      precision=executor.manifest.precision)
    if repeat > 0:
        side_by_side = check_model and executor.device == "cpu"  # onnxruntime runs on CPU: same device, same threads
        if side_by_side:
            comparison = compare.compare_with_onnxruntime(executor, session, inputs, repeat, threads, name=check_model)
            summary.update(comparison["tvmsched"])
            summary["compare"] = {k: v for k, v in comparison.items() if k != "tvmsched"}
        else:
            summary.update(compare.latency_summary(executor.time_runs(inputs, repeat)))
        echo(f"latency over {repeat} runs: p50 {summary['p50_ms']:.3f} ms, p99 {summary['p99_ms']:.3f} ms")
        if side_by_side:
            for line in compare.format_table(comparison):
                echo(line)
    if memory_budget is not None:
        summary["tiering"] = executor.tiering()
        executor.close()
    if as_json:
        click.echo(json.dumps(summary))


class _BudgetRun:
    """`run --memory-budget`: the model in a Runtime with that budget (streamed from the tiers if larger)."""

    def __init__(self, artifact: str, device: str | None, trusted, budget: str, topology: str, plan: str | None, gpu: int):
        from tvmsched.artifact.format import Manifest
        from tvmsched.runtime import native
        from tvmsched.runtime import Runtime
        from tvmsched.runtime.tiering import TierSettings, parse_bytes

        nbytes = parse_bytes(budget)
        if nbytes <= 0:
            raise TvmschedError(f"the memory budget must be positive, not {budget}")
        self.device = device or Manifest.verified(artifact, trusted).device
        in_use = int(native.device_memory(self.device)["in_use"])
        self.rt = Runtime(self.device, trusted_keys=trusted, memory_budget=in_use + nbytes,
                          tiering=TierSettings(topology=topology, plan=plan, gpu=gpu))
        try:
            self.model = self.rt.load(artifact)
        except BaseException:
            self.rt.shutdown()
            raise
        self.manifest = self.model.task.executor.manifest
        self.random_inputs = self.model.task.executor.random_inputs

    def run(self, inputs: dict) -> dict:
        return self.rt.submit(self.model, inputs).result()

    def time_runs(self, inputs: dict, repeat: int) -> list[float]:
        import time

        self.run(inputs)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            self.run(inputs)
            times.append(time.perf_counter() - start)
        return times

    def tiering(self) -> dict | None:
        return self.rt.tiering(self.model) if self.model.tiered else None

    def close(self) -> None:
        self.rt.shutdown()


@cli.group()
def bench() -> None:
    """Measure the runtime's mechanisms on your artifacts."""


@bench.command("switch")
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(1, 1000), help="Switches measured per model (medians).")
@click.option("--qos-ms", type=click.FloatRange(min=0, min_open=True), help="QoS target (default: each model's own, else 2x resident).")
@click.option("--max-groups", default=8, show_default=True, type=click.IntRange(1, 1024), help="Sub-tasks per model at most.")
@click.option("--no-stop-and-start", is_flag=True, help="Skip the fresh-process baseline.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_switch(artifacts: tuple[str, ...], device: str, repeat: int, qos_ms: float | None, max_groups: int,
                 no_stop_and_start: bool, as_json: bool) -> None:
    """Switch overheads of two or more ARTIFACTS: first-request latency after a switch against the
    resident floor, stop-and-start, load-then-run without pipelining, all resident, and the copy floor."""
    from tvmsched.cli.bench_switch import format_switching, measure_switching
    from tvmsched.runtime.switching import SwitchSettings

    for path in artifacts:
        if not Path(path).is_file():
            raise TvmschedError(f"no artifact at {path}")
    progress = (lambda text: None) if as_json else (lambda text: click.echo(text, err=True))
    result = measure_switching(list(artifacts), device, repeat, qos_ms, SwitchSettings(max_groups=max_groups),
                               not no_stop_and_start, progress)
    click.echo(json.dumps(result) if as_json else format_switching(result))


@cli.command("serve")
@click.option("--model", "models_", multiple=True, metavar="NAME=PATH[:QOS_MS[:PRIORITY]]",
              help="A model to serve (repeatable); PRIORITY realtime or best_effort.")
@click.option("--model-repository", type=click.Path(), help="A folder of model folders (each: one .tvms, an optional "
              "config.json), all loaded at start; the repository API loads and unloads them (docs in README, Serving).")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--devices", metavar="LIST", help="Serve on several devices, e.g. cuda:0,cuda:1, or all (every GPU; "
              "cpu:0,cpu:1: shares of the cores standing for GPUs): each model whole on one, or a replica on each "
              "device its config's instance_group gpus name (docs/multi-device.md).")
@click.option("--memory-budget", metavar="BYTES", help="Device memory the models may use (e.g. 8GiB; each device's): "
              "more are switched in on demand, larger ones stream their weights.")
@click.option("--colocation", metavar="URL", help="Tuning database holding this device's colocation profile.")
@click.option("--policy", default="colocation", show_default=True,
              type=click.Choice(["colocation", "fastest", "partition", "fcfs"]),
              help="Which candidates each request runs with, and when (docs/runtime.md; the C++ server's --policy).")
@click.option("--trust", "trusted", multiple=True, type=click.Path(dir_okay=False), metavar="KEY.pub",
              help="Load only artifacts signed by this Ed25519 public key (repeatable).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="HTTP port.")
@click.option("--grpc-port", default=8001, show_default=True, type=click.IntRange(0, 65535), help="gRPC port (0: no gRPC).")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(1, 1 << 20),
              help="Requests queued or running per model before more are answered 503.")
@click.option("--max-body-bytes", default=16 << 20, show_default=True, type=click.IntRange(1), help="Larger requests get 413.")
@click.option("--warmup/--no-warmup", default=True, show_default=True, help="Run every candidate kernel once at load.")
def serve_cmd(models_: tuple[str, ...], model_repository: str | None, device: str, devices: str | None,
              memory_budget: str | None,
              colocation: str | None, policy: str, trusted: tuple[str, ...], host: str, port: int, grpc_port: int,
              max_queue: int, max_body_bytes: int, warmup: bool) -> None:
    """Serve models over the Open Inference Protocol (KServe v2): HTTP/REST and gRPC, Triton's clients work."""
    import dataclasses

    from tvmsched.serve.repository import parse_model
    from tvmsched.serve.server import ServerSettings, build_service, check_ports, serve

    specs = [dataclasses.replace(parse_model(spec), warmup=warmup) for spec in models_]
    budget = None
    if memory_budget is not None:
        from tvmsched.runtime.tiering import parse_bytes

        budget = parse_bytes(memory_budget)
    settings = ServerSettings(host, port, grpc_port, max_queue, max_body_bytes)
    if port == grpc_port:
        raise TvmschedError(f"--port and --grpc-port are both {port}")
    check_ports(settings)
    listed = tuple(d.strip() for d in devices.split(",")) if devices else ()
    if listed == ("all",):  # every GPU this process sees
        from tvmsched.runtime import native

        try:
            listed = tuple(f"cuda:{i}" for i in range(int(native.func("device_count")("cuda"))))
        except TvmschedError as err:
            raise TvmschedError(f"--devices all: {err}") from None
        if not listed:
            raise TvmschedError("--devices all: the CUDA driver sees no GPU")
    service = build_service(specs, model_repository, device=device, memory_budget=budget, colocation=colocation,
                            trusted_keys=trusted, max_queue=max_queue, policy=policy, devices=listed)
    click.echo(f"serving {', '.join(service.models) or 'no model'} on http://{host}:{port}"
               + (f" and grpc {host}:{grpc_port}" if grpc_port else ""), err=True)
    serve(service, settings)


@cli.command("serve-ray")
@click.option("--model-repository", required=True, type=click.Path(), help="The repository every replica serves "
              "from (Triton's layout or tvmsched's; each replica loads the models Ray gives it).")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(1, 1024))
@click.option("--max-models-per-replica", default=2, show_default=True, type=click.IntRange(1, 1024),
              help="Ray Serve's max_num_models_per_replica: the models a replica holds at once (least recently used "
              "evicted).")
@click.option("--devices", metavar="LIST", help="Each replica's devices (e.g. cuda:0; default: the node's CPU).")
@click.option("--num-gpus", default=0.0, show_default=True, type=click.FloatRange(0), help="Ray GPUs per replica.")
@click.option("--num-cpus", default=1.0, show_default=True, type=click.FloatRange(0), help="Ray CPUs per replica.")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(1, 1 << 20),
              help="Each replica's queue cap (Ray's max_ongoing_requests).")
@click.option("--policy", default="colocation", show_default=True,
              type=click.Choice(["colocation", "fastest", "partition", "fcfs"]))
@click.option("--address", help="A Ray cluster to join (default: a local Ray instance).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Ray Serve's HTTP port.")
@click.option("--grpc-port", type=click.IntRange(1, 65535), help="Also serve the Open Inference Protocol over gRPC "
              "through Ray Serve's gRPC proxy on this port (default: no gRPC).")
def serve_ray_cmd(model_repository: str, replicas: int, max_models_per_replica: int, devices: str | None,
                  num_gpus: float, num_cpus: float, max_queue: int, policy: str, address: str | None, host: str,
                  port: int, grpc_port: int | None) -> None:
    """Serve a model repository on Ray Serve: replicas of one tvmsched Runtime each, Ray choosing the models each
    holds, the Open Inference Protocol's REST routes (and, with --grpc-port, its gRPC service) for tritonclient
    (docs/scale-out.md)."""
    from tvmsched.serve.ray_app import RaySettings, run
    from tvmsched.serve.repository import Repository

    Repository(model_repository)  # (a missing folder: one line before Ray starts)
    settings = RaySettings(model_repository, replicas=replicas, max_models_per_replica=max_models_per_replica,
                           devices=tuple(d.strip() for d in devices.split(",")) if devices else (),
                           num_gpus=num_gpus, num_cpus=num_cpus, max_queue=max_queue, policy=policy)
    grpc = f" and grpc://{host}:{grpc_port}" if grpc_port else ""
    click.echo(f"serving {model_repository} on Ray Serve at http://{host}:{port}{grpc}", err=True)
    run(settings, address=address, host=host, port=port, grpc_port=grpc_port)


@cli.command("inspect")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--trust", "trusted", multiple=True, type=click.Path(dir_okay=False), metavar="KEY.pub",
              help="Also require a signature by this public key (repeatable).")
def inspect_cmd(artifact: str, as_json: bool, trusted: tuple[str, ...]) -> None:
    """Show an artifact's layers, kernels, shapes, FLOPs and bytes (checked as a load checks it; its code is
    never loaded, so inspecting an untrusted artifact runs none of it)."""
    from tvmsched.artifact.format import Manifest
    from tvmsched.cli.inspect_artifact import describe

    manifest = Manifest.verified(artifact, trusted)
    click.echo(json.dumps(manifest.to_json(), indent=1) if as_json else describe(manifest))


@cli.command("plan-memory")
@click.option("--topology", "topology_spec", default="auto", show_default=True, metavar="auto|FILE.json",
              help="The GPUs and memory tiers: discovered, or a JSON file (docs/tiering.md).")
@click.option("--task", "artifacts", multiple=True, type=click.Path(dir_okay=False), metavar="ARTIFACT.tvms",
              help="A task: a compiled artifact (repeatable).")
@click.option("--task-bytes", "sized", multiple=True, metavar="NAME=BYTES", help="A task given by its memory need, e.g. llm=40GiB (repeatable).")
@click.option("--disk-dir", type=click.Path(file_okay=False), help="The disk tier's folder for --topology auto (default: the temp folder).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
def plan_memory_cmd(topology_spec: str, artifacts: tuple[str, ...], sized: tuple[str, ...], disk_dir: str | None, as_json: bool) -> None:
    """Plan where the tasks' memory beyond each GPU's own goes: DRAM, then CXL, then disk (docs/tiering.md)."""
    from tvmsched.runtime.tiering import TierTask, Topology, format_plan, parse_bytes, plan_memory

    if not artifacts and not sized:
        raise TvmschedError("plan-memory needs at least one --task or --task-bytes")
    topology = Topology.discover(disk_dir) if topology_spec == "auto" else Topology.load(topology_spec)
    parts = len(topology.gpus)
    tasks = []
    for path in artifacts:
        if not Path(path).is_file():
            raise TvmschedError(f"no artifact at {path}")
        tasks.append(TierTask.from_artifact(path, parts))
    for spec in sized:
        name, sep, size = spec.partition("=")
        if not sep or not name:
            raise TvmschedError(f"--task-bytes {spec!r} is not NAME=BYTES")
        tasks.append(TierTask.from_bytes(name, parse_bytes(size), parts))
    plan = plan_memory(topology, tasks)
    click.echo(json.dumps(plan.to_json()) if as_json else format_plan(plan))


@cli.group()
def collectives() -> None:
    """Time-sharing a switch's in-network aggregation among training jobs (mechanism E)."""


_POLICY = click.Choice(["tdm", "exclusive", "spatial", "mina", "none"])


@collectives.command("controller")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=7470, show_default=True, type=click.IntRange(0, 65535))
@click.option("--policy", type=_POLICY, default="tdm", show_default=True, help="Who gets the switch.")
@click.option("--round-timeout", default=0.5, show_default=True, type=click.FloatRange(0.001, 60), help="Seconds a consensus round waits for replies.")
@click.option("--lease", default=3.0, show_default=True, type=click.FloatRange(0.01, 3600), help="Seconds of AllReduces an agreed state covers.")
def collectives_controller(host: str, port: int, policy: str, round_timeout: float, lease: float) -> None:
    """Run the shared controller: cluster state and the consensus protocol, until interrupted."""
    from tvmsched.runtime.collectives.controller import Controller

    ctl = Controller(host, port, policy, round_timeout_s=round_timeout, lease_s=lease)
    ctl.serve(on_ready=lambda p: click.echo(f"controller listening on {host}:{p} (policy {policy})"))


@collectives.command("switch")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=7471, show_default=True, type=click.IntRange(0, 65535))
@click.option("--mode", type=click.Choice(["tdm", "spatial"]), default="tdm", show_default=True,
              help="tdm: one job aggregates at a time; spatial: jobs share the bandwidth.")
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True), help="Emulated link rate (default: as fast as the machine).")
@click.option("--slots", default=1, show_default=True, type=click.IntRange(1, 1024), help="Jobs aggregating at once (spatial mode).")
@click.option("--op-timeout", default=2.0, show_default=True, type=click.FloatRange(0.001, 3600), help="Seconds an operation waits for its job's ranks.")
def collectives_switch(host: str, port: int, mode: str, link_gbps: float | None, slots: int, op_timeout: float) -> None:
    """Run the aggregation service that plays an in-network-aggregation switch, until interrupted."""
    from tvmsched.runtime.collectives.switch import serve

    try:
        serve(host, port, mode=mode, link_gbps=link_gbps, op_timeout_s=op_timeout, slots=slots,
              on_ready=lambda p: click.echo(f"switch listening on {host}:{p} (mode {mode})"))
    except OSError as err:
        raise TvmschedError(f"switch cannot listen on {host}:{port}: {err.strerror or err}") from None


@collectives.command("simulate")
@click.option("--trace", required=True, type=click.IntRange(1, 10), help="Host-count trace (1-10, as MINA numbers them).")
@click.option("--policy", type=click.Choice(["tdm", "exclusive", "spatial", "mina", "greedy", "none"]), default="tdm", show_default=True)
@click.option("--jobs", default=1000, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True), help="Link rate (default: the setting's).")
@click.option("--setting", type=click.Choice(["mina", "comm-heavy"]), default="mina", show_default=True,
              help="mina: MINA's published setting; comm-heavy: slower links, larger models, wider jobs.")
@click.option("--placement", type=click.Choice(["first-fit", "locality"]), default="locality", show_default=True)
@click.option("--tree", type=click.Choice(["first-fit", "least-load"]), default="least-load", show_default=True)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def collectives_simulate(trace: int, policy: str, jobs: int, link_gbps: float | None, setting: str, placement: str,
                         tree: str, seed: int, as_json: bool) -> None:
    """Simulate a fat-tree cluster of training jobs sharing switches' in-network aggregation."""
    from tqdm import tqdm

    from tvmsched.runtime.collectives.simulator import simulate

    with tqdm(total=jobs, unit="job", desc=f"{policy} trace {trace}", disable=None, leave=False, file=sys.stderr) as bar:
        res = simulate(trace, policy, jobs=jobs, link_gbps=link_gbps, seed=seed, placement=placement, tree=tree,
                       setting=setting, progress=lambda done, total: bar.update(done - bar.n))
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"policy {policy}, trace {trace}, {jobs} jobs, {res['link_gbps']:g} Gb/s links ({setting} setting; "
               f"placement {placement}, trees {tree})")
    click.echo(f"  average JCT   {res['avg_jct_s']:.3f} s   (no in-network aggregation {res['avg_jct_none_s']:.3f} s, "
               f"every job exclusive {res['avg_jct_ideal_s']:.3f} s)")
    click.echo(f"  JCTScore      {res['jct_score']:.3f}")
    click.echo(f"  in-network    {res['innet_fraction']:.1%} of AllReduce bytes")


@cli.group()
def db() -> None:
    """The tuning database (SQLite, PostgreSQL or the HTTP service)."""


@db.command("serve")
@click.option("--db", "db_url", help="Store behind the service (default: the local SQLite file).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token-file", type=click.Path(dir_okay=False), help="Require this bearer token for writes.")
def db_serve(db_url: str | None, host: str, port: int, token_file: str | None) -> None:
    """Serve a tuning database over HTTP (OpenAPI at /docs).

    A port in use, an unreadable token file or a database that cannot be opened is an error before
    anything is served.
    """
    from tvmsched.tuning_db import default_url
    from tvmsched.tuning_db.service import serve

    serve(db_url or default_url(), host=host, port=port, token_file=token_file)


@db.command("stats")
@click.option("--db", "db_url", help="Database URL (default: the local SQLite file).")
@click.option("--json", "as_json", is_flag=True)
def db_stats(db_url: str | None, as_json: bool) -> None:
    """Count workloads and tuning records."""
    from tvmsched.tuning_db import open_store

    stats = open_store(db_url).stats()
    click.echo(json.dumps(stats) if as_json else f"workloads {stats['workloads']}, records {stats['records']}")


@db.command("import")
@click.argument("work_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--db", "db_url", help="Database URL (default: the local SQLite file).")
@click.option("--db-token-file", type=click.Path(dir_okay=False), help="Bearer token for a database service.")
@click.option("--units", type=int, required=True, help="Compute units the records were measured with.")
@click.option("--unit-kind", type=click.Choice(["cpu_thread", "gpu_sm", "gpu_sm_grid"]), required=True)
def db_import(work_dir: str, db_url: str | None, db_token_file: str | None, units: int, unit_kind: str) -> None:
    """Import a MetaSchedule JSON database (database_workload.json + database_tuning_record.json)."""
    from tvmsched.tuning_db import import_ms_json, open_store

    store = open_store(db_url, token=_read_token(db_token_file))
    try:
        counts = import_ms_json(store, work_dir, units=units, unit_kind=unit_kind)
    except FileNotFoundError:
        from tvmsched.tuning_db.ms_json import WORKLOAD_FILE

        raise TvmschedError(f"{work_dir} is not a MetaSchedule JSON database: it has no {WORKLOAD_FILE}") from None
    click.echo(f"imported {counts['workloads']} workloads, {counts['records']} records from {work_dir}")


@db.command("export")
@click.argument("work_dir", type=click.Path(file_okay=False))
@click.option("--db", "db_url", help="Database URL (default: the local SQLite file).")
def db_export(work_dir: str, db_url: str | None) -> None:
    """Export to MetaSchedule's JSON database format in WORK_DIR."""
    from tvmsched.tuning_db import export_ms_json, open_store

    counts = export_ms_json(open_store(db_url), work_dir)
    click.echo(f"exported {counts['workloads']} workloads, {counts['records']} records to {work_dir}")


def _parse_units(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise TvmschedError(f"--units {text!r} is not a comma-separated list of integers") from None


def _open_database(db_url: str | None, token_file: str | None, target: str):
    from tvmsched.pipeline import open_tuning_database
    from tvmsched.lower.targets import make_target

    return open_tuning_database(db_url, make_target(target), token=_read_token(token_file))


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise TvmschedError(f"cannot read the token file {path}: {err.strerror}") from None
    if not token:
        raise TvmschedError(f"the token file {path} is empty")
    return token


def _print_tuning_summary(tuning: dict) -> None:
    from tvmsched.cli.inspect_artifact import tuning_workloads

    layers = tuning["layers"]  # one entry per PrimFunc; PrimFuncs sharing a workload share its outcome
    counts = {s: sum(v["status"] == s for v in layers.values()) for s in ("tuned", "cached", "default-kept", "fallback", "skipped")}
    trials = sum(v["trials"] for v in layers.values())
    rate = f" in {tuning['tuning_seconds']:.0f} s ({tuning['trials_per_minute']:.1f} trials/min)" if tuning.get("tuning_seconds") else ""
    shared = f" for {tuning['workloads']} distinct workloads in {tuning['layer_count']} layers" if "workloads" in tuning else ""
    from_records = sum(v["status"] == "cached" and v.get("kernel") == "tuned" for v in layers.values())
    cached = f"{counts['cached']} from the database"
    if counts["cached"]:
        cached += f" ({from_records} run a record's kernel, the others measured faster with the default)"
    skipped = ""
    if counts["skipped"]:
        why = "had no record" if tuning.get("records_only") else "skipped at the --tune-minutes deadline"
        skipped = f", {counts['skipped']} {why}"
    click.echo(
        f"tuning: {counts['tuned']} layers tuned, {cached}, {counts['default-kept']} kept the faster default schedule, "
        f"{counts['fallback']} fell back to the default schedule{skipped}; {trials} new trials{rate}{shared}"
    )
    for name, v in tuning_workloads(tuning).items():
        if v["status"] == "fallback":
            click.echo(f"  fallback: {name}: {v['message'] or 'no valid record'}")


def _read_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as err:
        raise TvmschedError(f"cannot read inputs from {path}: {one_line(err)}") from None


def _reference_model(path: str, manifest) -> str | bytes:
    """The ONNX model to check an artifact against: the file, or, for an artifact compiled with a batch size, the
    file rewritten for that many rows as the compiler did (its inputs' shapes from the artifact)."""
    if manifest.batch_size is None:
        return path
    import onnx

    from tvmsched.frontend import batching

    try:
        model = onnx.load(path)
    except Exception as err:  # noqa: BLE001 (protobuf and OS errors alike: not an ONNX file we can read)
        raise TvmschedError(f"cannot read {path} as an ONNX model: {one_line(err)}") from None
    shapes = {b.name: manifest.tensors[b.tensor].shape for b in manifest.inputs}
    return batching.rebatch(model, manifest.batch_size, shapes).model.SerializeToString()


def _check_against_onnxruntime(model_path: str, inputs: dict, outputs: dict, tol: float = 1e-4, echo=click.echo,
                               session=None, precision: str = "fp32") -> dict:
    """Outputs against onnxruntime (`session`, default a new one of `model_path`): |out - ref| <= tol + tol * |ref|
    elementwise (numpy's isclose), NaN where onnxruntime has NaN; an fp16 artifact's output instead within
    max|out - ref| <= 2e-2 * max(1, max|ref|) (tvmsched.lower.precision.FP16_TOLERANCE). A model onnxruntime cannot run,
    or one with other outputs, is a user error."""
    from tvmsched.lower.precision import FP16_TOLERANCE, fp16_bound

    from tvmsched.cli.compare import onnxruntime_session, runtime_threads

    if session is None:
        session = onnxruntime_session(model_path, runtime_threads("cpu"))
    try:
        names = [o.name for o in session.get_outputs()]
        if sorted(names) != sorted(outputs):
            raise TvmschedError(f"{model_path} has outputs {sorted(names)}, the artifact {sorted(outputs)}: not the same model")
        reference = dict(zip(names, session.run(names, inputs)))
    except TvmschedError:
        raise
    except Exception as err:  # noqa: BLE001  (onnxruntime raises its own types for models it cannot run)
        raise TvmschedError(f"onnxruntime cannot run {model_path} to check against: {one_line(err)}") from None
    errors, mismatched = {}, []
    for name in names:
        out, ref = np.asarray(outputs[name]), np.asarray(reference[name])
        if out.shape != ref.shape:
            mismatched.append(f"{name} has shape {out.shape}, onnxruntime {ref.shape}")
            continue
        finite = np.isfinite(out) & np.isfinite(ref)
        errors[name] = float(np.max(np.abs(out - ref)[finite], initial=0.0))
        if precision == "fp16":
            close = (np.abs(out - ref) <= fp16_bound(ref)) | (np.isnan(out) & np.isnan(ref))
        else:
            close = np.isclose(out, ref, rtol=tol, atol=tol, equal_nan=True)
        if not close.all():
            mismatched.append(f"{name}: {int((~close).sum())} of {close.size} elements")
    ok = not mismatched
    rule = f"{FP16_TOLERANCE:g} * max(1, max|ref|), fp16" if precision == "fp16" else f"rtol=atol={tol}"
    echo(f"check vs onnxruntime: max abs error {max(errors.values(), default=0.0):.3g} ({rule}) -> "
         f"{'OK' if ok else 'MISMATCH'}")
    if not ok:
        raise TvmschedError(f"outputs differ from onnxruntime beyond {rule} ({'; '.join(mismatched)})")
    if precision == "fp16":
        return {"max_abs_error": max(errors.values(), default=0.0), "bound": rule, "ok": ok}
    return {"max_abs_error": max(errors.values(), default=0.0), "rtol": tol, "atol": tol, "ok": ok}


def main(argv: list[str] | None = None) -> int:
    """Entry point: one stderr line and exit 2 on user errors, never a traceback (TVMSCHED_DEBUG=1 shows it)."""
    try:
        cli.main(args=argv, prog_name="tvmsched", standalone_mode=False)
    except TvmschedError as err:
        click.echo(f"error: {printable(str(err).strip())}", err=True)
        return 2
    except click.exceptions.Exit as exit_:
        return exit_.exit_code
    except click.ClickException as err:
        click.echo(f"error: {printable(err.format_message())}", err=True)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # skip TVM's worker-pool destructors, which complain when interrupted
    except Exception as err:  # a bug or an unexpected TVM failure: still one line
        if os.environ.get("TVMSCHED_DEBUG"):
            raise
        click.echo(f"error: internal error ({type(err).__name__}): {printable(one_line(err))} (TVMSCHED_DEBUG=1 shows the traceback)",
                   err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
