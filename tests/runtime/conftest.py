"""Fixtures the engine-Runtime tests share (modules with an `mlp` fixture of their own keep theirs)."""

import pytest

from tvmsched.runtime import Executor


@pytest.fixture(scope="module")
def mlp(compiled):
    return str(compiled("mlp"))  # shared, read only


@pytest.fixture(scope="module")
def mlp_run(mlp):
    """(inputs, outputs of a direct run on one executor)."""
    executor = Executor(mlp)
    inputs = executor.random_inputs(3)
    return inputs, executor.run(inputs)
