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
    parameters                qos_ms (the latency target), priority (realtime or best_effort), warmup (true/false),
                              refresh_sizes (true/false: the batch sizes' figures follow the launches, docs/batching.md)

Any other field set is refused with one line giving the field and FILE:LINE (never silently ignored); so is a file that
does not parse. The engine reads the folder and checks it (runtime/native/src/repository.cc, the same for the C++
server); this module parses config.pbtxt for it with protobuf's text format and hands it over as protobuf's JSON.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tvmsched.errors import TvmschedError, printable


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


def to_json(path: str, text: str) -> str:
    """config.pbtxt's text as protobuf's JSON of inference.ModelConfig (the engine's ToJson; one line naming FILE:LINE
    when it does not parse)."""
    from google.protobuf import json_format, text_format

    config = _message_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        line = err.GetLine() or 1
        reason = re.sub(r"^\d+:\d+ : ", "", str(err))
        raise TvmschedError(f"{path}:{line}: {printable(' '.join(reason.split()))}") from None
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def spec(name: str, folder: Path, devices: tuple[str, ...] = ("cpu",)):
    """The ModelSpec of a Triton-layout model folder, for a server on `devices` (their names, in order)."""
    from tvmsched.serve.repository import Repository

    return Repository(Path(folder).parent, devices).spec(name)
