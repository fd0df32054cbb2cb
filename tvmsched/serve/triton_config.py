"""A model folder in Triton's layout: `NAME/config.pbtxt` and version folders `NAME/<n>/model.tvms` (docs/batching.md,
"Serving as Triton users configure it").

config.pbtxt is parsed with Triton's model_config.proto (vendored in proto/, compiled at build time into a descriptor
set that is loaded into a pool of its own, apart from tritonclient's messages in the same process). The latest version
folder is served (Triton's default version policy). What tvmsched implements:

    name                      the folder's name (as Triton requires)
    backend: "tvmsched"       (or platform: "tvmsched")
    max_batch_size            0 for a model not compiled for a batch, else 1 to its largest compiled batch size; clients
                              send up to this many rows and the metadata shows dims without the batch
    input, output             name, data_type and dims, checked against the artifact; left out: filled from it
                              (Triton's auto-complete)
    dynamic_batching          preferred_batch_size (each a compiled size), max_queue_delay_microseconds,
                              priority_levels and default_priority_level (level 1 is real-time, every other level
                              best-effort), default_queue_policy { timeout_action, default_timeout_microseconds,
                              allow_timeout_override, max_queue_size }
    instance_group            count (streams on each device), kind (KIND_AUTO, or the server's device kind), gpus (the
                              server's device numbers to run a replica on: `count` streams on each; a group naming
                              none runs on every device; no instance_group: the server places the model on one
                              device, docs/multi-device.md)
    default_model_filename    the artifact's file name in a version folder (default model.tvms)
    parameters                qos_ms (the latency target), priority (realtime or best_effort), warmup (true/false)

Any other field set is refused with one line giving the field and FILE:LINE (never silently ignored); so is a file that
does not parse.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from tvmsched.errors import TvmschedError, printable
from tvmsched.serve.tensors import V2_TYPES

CONFIG = "config.pbtxt"
DEFAULT_FILENAME = "model.tvms"
# the fields tvmsched implements, by message path ("" is ModelConfig itself)
SUPPORTED = {
    "": {"name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching", "instance_group",
         "default_model_filename", "parameters"},
    "input": {"name", "data_type", "dims"},
    "output": {"name", "data_type", "dims"},
    "dynamic_batching": {"preferred_batch_size", "max_queue_delay_microseconds", "priority_levels",
                         "default_priority_level", "default_queue_policy"},
    "dynamic_batching.default_queue_policy": {"timeout_action", "default_timeout_microseconds",
                                              "allow_timeout_override", "max_queue_size"},
    "instance_group": {"name", "kind", "count", "gpus"},
    "parameters.value": {"string_value"},  # (a map: its entries' values are walked)
}
PARAMETERS = ("qos_ms", "priority", "warmup")


def is_triton_folder(folder: Path) -> bool:
    return (folder / CONFIG).is_file()


@functools.cache
def _message_class():
    """ModelConfig from the vendored model_config.proto's descriptor set, in a pool of its own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    import tvmsched.serve

    # built beside the generated stubs (an editable install keeps them apart from this source folder)
    found = [Path(folder) / "model_config.desc" for folder in tvmsched.serve.__path__]
    path = next((p for p in found if p.is_file()), found[0])
    if not path.is_file():
        raise TvmschedError(f"Triton's model configuration is not built ({path.name} missing): run `make setup` or "
                            "reinstall tvmsched (pip install .)")
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def parse(path: Path):
    """(ModelConfig, its text) of a config.pbtxt (one line naming FILE:LINE when it does not parse)."""
    from google.protobuf import text_format

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TvmschedError(f"cannot read {path}: {printable(str(err))}") from None
    config = _message_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        line = err.GetLine() or 1
        reason = re.sub(r"^\d+:\d+ : ", "", str(err))
        raise TvmschedError(f"{path}:{line}: {printable(' '.join(reason.split()))}") from None
    _refuse_unsupported(config, text, path)
    return config, text


def _refuse_unsupported(config, text: str, path: Path) -> None:
    def walk(message, prefix: str, after: int) -> None:
        for field, value in message.ListFields():
            where = f"{prefix}.{field.name}" if prefix else field.name
            line = _line_of(text, field.name, after)
            if field.name not in SUPPORTED.get(prefix, set()):
                raise TvmschedError(f"{path}:{line}: {where} is not supported by the tvmsched backend (supported: "
                                    f"{', '.join(sorted(SUPPORTED.get(prefix, ())))})")
            if field.message_type is None:
                continue
            if field.message_type.GetOptions().map_entry:  # a map: its values (messages) are walked
                items, where = [v for v in value.values() if hasattr(v, "ListFields")], f"{where}.value"
            else:
                items = value if field.is_repeated else [value]
            for item in items:
                walk(item, where, line)

    walk(config, "", 0)


def _line_of(text: str, name: str, after: int) -> int:
    """The first line at or after `after` (1-based) where field `name` is set (its name, then ':' or '{')."""
    pattern = re.compile(rf"(^|[\s{{,;]){re.escape(name)}\s*[:{{\[<]")
    lines = text.splitlines()
    for number in range(max(after, 1), len(lines) + 1):
        if pattern.search(lines[number - 1].split("#", 1)[0]):
            return number
    return max(after, 1)


def _line_of_value(text: str, value: str) -> int:
    """The first line where the quoted string `value` appears (a parameter's key, a tensor's name), else 1."""
    for number, line in enumerate(text.splitlines(), 1):
        if f'"{value}"' in line.split("#", 1)[0] or f"'{value}'" in line.split("#", 1)[0]:
            return number
    return 1


def latest_version(folder: Path) -> tuple[str, Path]:
    """(version, its folder): the highest numbered version folder (Triton's default version policy)."""
    versions = sorted((int(p.name), p) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise TvmschedError(f"model folder {folder} has a {CONFIG} but no version folder (such as {folder}/1)")
    number, where = versions[-1]
    return str(number), where


def spec(name: str, folder: Path, devices: tuple[str, ...] = ("cpu",)):
    """The ModelSpec of a Triton-layout model folder, checked against its artifact's manifest (read and verified by the
    engine, its code not loaded) and against the server's `devices` (their names, in order)."""
    from tvmsched.artifact.format import Manifest
    from tvmsched.serve.repository import ModelSpec

    path = folder / CONFIG
    config, text = parse(path)

    def fail(field: str, message: str, key: str | None = None) -> TvmschedError:
        """One line at the line setting `field` (or the parameter whose key is `key`)."""
        line = _line_of_value(text, key) if key else _line_of(text, field, 1)
        return TvmschedError(f"{path}:{line}: {message}")

    if config.name and config.name != name:
        raise fail("name", f"name {config.name!r} is not the model folder's name {name!r}")
    backend = config.backend or config.platform
    if backend != "tvmsched":
        raise fail("backend" if config.backend else "platform",
                   f"backend must be \"tvmsched\", not {backend!r}" if backend else 'backend: "tvmsched" is missing')
    version, where = latest_version(folder)
    artifact = where / (config.default_model_filename or DEFAULT_FILENAME)
    if not artifact.is_file():
        raise TvmschedError(f"model {name!r} version {version}: no artifact file at {artifact}")
    manifest = Manifest.verified(artifact)
    largest = manifest.batch_size or 0
    if config.max_batch_size < 0 or (config.max_batch_size > 0) != (largest > 0) or config.max_batch_size > largest:
        reason = (f"the artifact is compiled for up to {largest} rows: set max_batch_size from 1 to {largest}"
                  if largest else "the artifact is not compiled for a batch (tvmsched compile --batch-sizes)")
        raise fail("max_batch_size", f"max_batch_size {config.max_batch_size}: {reason}")
    _check_tensors(config, manifest, path, text)
    dynamic = config.dynamic_batching if config.HasField("dynamic_batching") else None
    if dynamic is not None and not largest:
        raise fail("dynamic_batching", "dynamic_batching needs a model compiled for a batch (max_batch_size > 0)")
    params = {key: value.string_value for key, value in config.parameters.items()}
    for key in params:
        if key not in PARAMETERS:
            raise fail("parameters", f"parameters {key!r} is not one the tvmsched backend reads "
                       f"({', '.join(PARAMETERS)})", key)
    priority = params.get("priority")
    if priority is not None and priority not in ("realtime", "best_effort"):
        raise fail("parameters", f"parameters priority is realtime or best_effort, not {priority!r}", "priority")
    if dynamic is not None and dynamic.default_priority_level:
        level = "realtime" if dynamic.default_priority_level == 1 else "best_effort"
        if dynamic.priority_levels and dynamic.default_priority_level > dynamic.priority_levels:
            raise fail("default_priority_level", f"default_priority_level {dynamic.default_priority_level} is above "
                       f"priority_levels {dynamic.priority_levels}")
        if priority is not None and priority != level:
            raise fail("default_priority_level", f"default_priority_level {dynamic.default_priority_level} "
                       f"({level}) disagrees with parameters priority {priority!r}")
        priority = level
    qos_ms = None
    if "qos_ms" in params:
        try:
            qos_ms = float(params["qos_ms"])
        except ValueError:
            qos_ms = -1.0
        if not qos_ms > 0 or qos_ms == float("inf"):
            raise fail("parameters", f"parameters qos_ms must be a positive number of milliseconds, not "
                       f"{params['qos_ms']!r}", "qos_ms")
    warmup = params.get("warmup", "true")
    if warmup not in ("true", "false"):
        raise fail("parameters", f"parameters warmup is true or false, not {warmup!r}", "warmup")
    streams, replicas = 1, ()
    if config.instance_group:
        per_device: dict[int, int] = {}  # device number -> streams (Triton: count instances on each device of gpus)
        for group in config.instance_group:
            if any(not 0 <= gpu < len(devices) for gpu in group.gpus):
                raise fail("gpus", f"instance_group gpus {list(group.gpus)}: the server has {len(devices)} "
                           f"device{'s' if len(devices) > 1 else ''} ({', '.join(devices)})")
            for gpu in set(group.gpus) or range(len(devices)):  # (none named: every device)
                per_device[gpu] = per_device.get(gpu, 0) + max(group.count, 1)
        if len(set(per_device.values())) > 1:
            counts = ", ".join(f"{devices[d]}: {n}" for d, n in sorted(per_device.items()))
            raise fail("count", f"instance_group counts differ between devices ({counts}): a model runs the same "
                       "streams on each of its devices")
        streams = next(iter(per_device.values()))
        if not 1 <= streams <= 64:
            raise fail("count", f"instance_group counts add up to {streams} streams; 1 to 64 are served")
        replicas = tuple(sorted(per_device)) if len(devices) > 1 else ()
    queue, max_queue = {}, None
    if dynamic is not None and dynamic.HasField("default_queue_policy"):
        policy = dynamic.default_queue_policy
        queue = {"timeout_action": "delay" if policy.timeout_action == 1 else "reject",
                 "default_timeout_us": int(policy.default_timeout_microseconds),
                 "allow_timeout_override": bool(policy.allow_timeout_override)}
        max_queue = int(policy.max_queue_size) or None
    if dynamic is not None and dynamic.max_queue_delay_microseconds > 60_000_000:
        raise fail("max_queue_delay_microseconds", "max_queue_delay_microseconds must be from 0 to 60000000")
    return ModelSpec(name, str(artifact), qos_ms, priority or "best_effort", warmup == "true", max_queue, streams,
                     float(dynamic.max_queue_delay_microseconds) if dynamic is not None else 0.0,
                     tuple(int(n) for n in dynamic.preferred_batch_size) if dynamic is not None else (),
                     version=version, queue_policy=queue, max_batch_size=config.max_batch_size,
                     instance_kinds=tuple(group.kind for group in config.instance_group), config_path=str(path),
                     devices=replicas)


def _check_tensors(config, manifest, path: Path, text: str) -> None:
    """The inputs and outputs the config declares are the artifact's (names, types, dims without the batch)."""
    data_type = _message_class().DESCRIPTOR.fields_by_name["input"].message_type.fields_by_name["data_type"].enum_type
    for side, declared, bindings in (("input", config.input, manifest.inputs), ("output", config.output, manifest.outputs)):
        known = {b.name: manifest.tensors[b.tensor] for b in bindings}
        for tensor in declared:
            line = _line_of_value(text, tensor.name) if tensor.name else _line_of(text, side, 1)
            spec = known.get(tensor.name)
            if spec is None:
                raise TvmschedError(f"{path}:{line}: {side} {tensor.name!r} is not one of the artifact's "
                                    f"({', '.join(known)})")
            want_type = "TYPE_" + V2_TYPES.get(np.dtype(spec.dtype), "INVALID")
            got_type = data_type.values_by_number[tensor.data_type].name if tensor.data_type in \
                data_type.values_by_number else str(tensor.data_type)
            if tensor.data_type and got_type != want_type:
                raise TvmschedError(f"{path}:{line}: {side} {tensor.name!r} is {want_type} in the artifact, not {got_type}")
            dims = list(spec.shape[1:] if manifest.batch_size else spec.shape)
            if tensor.dims and list(tensor.dims) != dims:
                raise TvmschedError(f"{path}:{line}: {side} {tensor.name!r} has dims {dims} in the artifact"
                                    f"{' (without the batch)' if manifest.batch_size else ''}, not {list(tensor.dims)}")
