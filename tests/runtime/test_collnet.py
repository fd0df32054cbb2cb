"""The CollNet/SHARP communicator: what can be checked without NCCL here, and the real group on a GPU."""

import importlib
import os

import pytest
import torch
import torch.distributed as dist

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives import collnet

HAS_NCCL_GPU = dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """An empty library search path: only what a test writes there can be found."""
    monkeypatch.setattr(collnet, "_LIB_DIRS", ())
    monkeypatch.setattr(collnet.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    monkeypatch.delenv("NCCL_NET_PLUGIN", raising=False)
    monkeypatch.delenv("HPCX_NCCL_RDMA_SHARP_PLUGIN_DIR", raising=False)
    return tmp_path


def test_import_leaves_environment_alone(monkeypatch):
    monkeypatch.delenv(collnet.ENV, raising=False)
    importlib.reload(collnet)
    assert collnet.ENV not in os.environ


@pytest.mark.skipif(HAS_NCCL_GPU, reason="NCCL and a CUDA device are present")
def test_unavailable_without_nccl_says_why():
    ok, reason = collnet.collnet_available()
    assert ok is False
    assert "NCCL" in reason or "CUDA" in reason or "torch.distributed" in reason
    assert "\n" not in reason


@pytest.mark.skipif(HAS_NCCL_GPU, reason="NCCL and a CUDA device are present")
def test_group_raises_the_same_reason_in_one_line(monkeypatch):
    monkeypatch.delenv(collnet.ENV, raising=False)
    _, reason = collnet.collnet_available()
    with pytest.raises(TvmschedError) as err:
        collnet.collnet_group([0, 1])
    assert str(err.value).endswith(reason)
    assert "\n" not in str(err.value)
    assert collnet.ENV not in os.environ  # nothing was touched on the way out


def test_plugin_names_follow_nccl(monkeypatch):
    monkeypatch.delenv("NCCL_NET_PLUGIN", raising=False)
    assert collnet._plugin_candidates() == ["libnccl-net.so"]
    monkeypatch.setenv("NCCL_NET_PLUGIN", "sharp,/opt/x/libp.so,libnccl-net-ib.so")
    assert collnet._plugin_candidates() == ["sharp", "libnccl-net-sharp.so", "/opt/x/libp.so", "libnccl-net-ib.so"]
    monkeypatch.setenv("NCCL_NET_PLUGIN", "None")
    assert collnet._plugin_candidates() == []
    path, reason = collnet._find_plugin()
    assert path is None and "NCCL_NET_PLUGIN=none" in reason


def test_plugin_without_collnet_symbol_is_refused(plugin_dir):
    (plugin_dir / "libnccl-net.so").write_bytes(b"\x7fELF ncclNetPlugin_v9 only")
    path, reason = collnet._find_plugin()
    assert path is None
    assert str(plugin_dir / "libnccl-net.so") in reason and "no CollNet" in reason


def test_plugin_with_collnet_symbol_is_found(plugin_dir, monkeypatch):
    assert collnet._find_plugin()[0] is None
    assert "no NCCL net plugin" in collnet._find_plugin()[1]
    lib = plugin_dir / "libnccl-net-sharp.so"
    lib.write_bytes(b"\x7fELF ncclNetPlugin_v9 ncclCollNetPlugin_v9")
    monkeypatch.setenv("NCCL_NET_PLUGIN", "sharp")
    assert collnet._find_plugin() == (str(lib), str(lib))


def test_env_is_set_only_inside_and_restored(monkeypatch):
    monkeypatch.setenv(collnet.ENV, "0")
    with collnet._env(collnet.ENV, "1"):
        assert os.environ[collnet.ENV] == "1"
    assert os.environ[collnet.ENV] == "0"
    monkeypatch.delenv(collnet.ENV)
    with pytest.raises(RuntimeError), collnet._env(collnet.ENV, "1"):
        raise RuntimeError("creation failed")
    assert collnet.ENV not in os.environ


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_NCCL_GPU, reason="needs NCCL and a CUDA device")
def test_collnet_group_on_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv(collnet.ENV, raising=False)
    ok, reason = collnet.collnet_available()
    if not ok:  # a GPU without the SHARP plugin: the refusal is the contract
        with pytest.raises(TvmschedError, match="no in-network"):
            collnet.collnet_group()
        return
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            device_id=device)
    try:
        pg = collnet.collnet_group()
        assert collnet.ENV not in os.environ
        config = pg._get_backend(device).options.config
        if hasattr(type(config), "collnet_enable"):
            assert config.collnet_enable == 1
        x = torch.ones(4, device=device)
        dist.all_reduce(x, group=pg)  # one node: NCCL falls back to ring, the group still works
        assert x.tolist() == [1.0] * 4
        dist.destroy_process_group(pg)
    finally:
        dist.destroy_process_group()
