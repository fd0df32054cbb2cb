"""One artifact compiled at several batch sizes (issue 39, steps 1 to 3; docs/batching.md): the weights stored once, a
program per size, every size answering each row as onnxruntime does alone; the engine Runtime holding a stream per size
on each slot and choosing the size of each launch; preferred batch sizes that must be compiled ones."""

import dataclasses
import zipfile

import numpy as np
import pytest

from tests.helpers import assert_user_error, wait_until
from tvmsched import models
from tvmsched.artifact.format import Artifact
from tvmsched.errors import TvmschedError
from tvmsched.runtime import Executor, Runtime

ort = pytest.importorskip("onnxruntime")

SIZES = [1, 2, 4, 8]
ZOO = {"mlp": SIZES, "resnet18-small": [1, 2, 4], "bert-tiny": [1, 2, 4]}  # bert-tiny keeps Reshape [1, 128, 2, 64]


@pytest.fixture(scope="module")
def mlp_sizes(compiled):
    return compiled("mlp", batch_size=SIZES)


def _alone(name: str, inputs: dict, row: int) -> dict:
    session = ort.InferenceSession(models.build(name).SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {k: v[row : row + 1] for k, v in inputs.items()})))


def _row_by_row(alone: Executor, x: np.ndarray) -> np.ndarray:
    """mlp's output for the rows of `x`, each run alone at batch size 1."""
    return np.concatenate([alone.run({"input": x[i : i + 1]})["output"] for i in range(len(x))])


def test_one_artifact_holds_every_size_with_the_weights_stored_once(compiled, mlp_sizes):
    artifact = Artifact.load(mlp_sizes)
    manifest = artifact.manifest
    assert manifest.batch_sizes == tuple(SIZES) and manifest.batch_size == 8
    single = Artifact.load(compiled("mlp", batch_size=8))
    assert artifact.weights.keys() == single.weights.keys()  # every size reads the same arrays: stored once
    with zipfile.ZipFile(mlp_sizes) as archive, zipfile.ZipFile(compiled("mlp", batch_size=8)) as one:
        assert archive.getinfo("weights.npz").file_size == one.getinfo("weights.npz").file_size
    for variant in manifest.variants:  # each smaller size: its own kernels in the one library, measured at compile
        assert all(c.kernel.startswith(f"b{variant.batch_size}_") for layer in variant.layers for c in layer.candidates)
        assert variant.latency_us is not None and variant.latency_us > 0
        assert all(manifest.tensors[b.tensor].shape[1:] == variant.tensors[b.tensor].shape[1:] for b in variant.inputs)


@pytest.mark.parametrize("name,size", [(name, size) for name, sizes in ZOO.items() for size in sizes])
def test_every_size_answers_every_row_as_onnxruntime_does_alone_and_the_same_bits_at_any_position(compiled, name, size):
    executor = Executor(str(compiled(name, batch_size=ZOO[name])), batch_size=size)
    assert executor.manifest.batch_size == size
    inputs = executor.random_inputs(size)
    outputs = executor.run(inputs)
    for row in range(size):
        for output, want in _alone(name, inputs, row).items():
            np.testing.assert_allclose(outputs[output][row : row + 1], want, rtol=1e-4, atol=1e-5, err_msg=f"row {row}")
    row = {k: v[:1] for k, v in executor.random_inputs(99).items()}
    seen = []
    for position in range(size):
        padded = {k: np.zeros_like(v) for k, v in inputs.items()}  # beside zero rows (padding), then beside others
        for neighbours in (padded, executor.random_inputs(position)):
            for k in neighbours:
                neighbours[k][position] = row[k][0]
            seen.append({k: v[position] for k, v in executor.run(neighbours).items()})
    assert all(np.array_equal(got[k], seen[0][k]) for got in seen for k in got)


def _alone_at(runs: dict[int, float], rows: int) -> int:
    """The size a request of `rows` rows launches at with nothing else queued (docs/batching.md), from each size's
    run: the smallest size that holds it, or the fastest larger one when that runs at least 5% faster."""
    low = min(size for size in runs if size >= rows)
    faster = [size for size in runs if size > low and runs[size] < 0.95 * runs[low]]
    return min(faster, key=runs.get) if faster else low


def test_the_runtime_holds_a_stream_per_size_and_every_answer_agrees_with_the_batch_1_run(mlp_sizes):
    alone = Executor(str(mlp_sizes), batch_size=1)
    rng = np.random.default_rng(7)
    name = alone.manifest.inputs[0].name
    shape = alone.manifest.tensors[alone.manifest.inputs[0].tensor].shape[1:]
    burst = [rng.standard_normal((rows, *shape)).astype(np.float32) for rows in [1] * 40 + [3, 2, 5, 1, 8] * 4]
    rt = Runtime()
    try:
        model = rt.load(str(mlp_sizes), name="mlp")
        assert [task.name for task in model.tasks] == ["mlp", "mlp@b1", "mlp@b2", "mlp@b4"]  # the largest first, then a stream per smaller size
        # one request at a time, nothing else queued: the smallest size that holds its rows (padded), or a larger one
        # that ran at least 5% faster outright at load
        runs = {size: s["run_us"] for size, s in rt.stats()["mlp"]["sizes"].items()}
        for rows in (1, 3, 8, 2, 5):
            size = _alone_at(runs, rows)
            before = rt.stats()["mlp"]["sizes"][size]["launches"]
            x = rng.standard_normal((rows, *shape)).astype(np.float32)
            got = rt.submit("mlp", {name: x}).result(timeout=60)["output"]
            assert got.shape == (rows, 10) and rt.stats()["mlp"]["sizes"][size]["launches"] == before + 1, (rows, runs)
        futures = [rt.submit("mlp", {name: x}) for x in burst]  # a burst: packed at whatever sizes the queue fills
        answers = [f.result(timeout=60)["output"] for f in futures]
        stats = rt.stats()["mlp"]
    finally:
        rt.shutdown()
    for x, got in zip(burst, answers):
        want = np.concatenate([alone.run({name: x[i : i + 1]})["output"] for i in range(len(x))])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # run --check's tolerance
    assert set(stats["sizes"]) == set(SIZES) and all(s["run_us"] > 0 for s in stats["sizes"].values())
    assert sum(rows * count for rows, count, _ in stats["batches"]) == sum(len(x) for x in burst) + 19


def test_each_size_figure_follows_its_launches_and_a_size_none_chooses_runs_again(mlp_sizes):
    """refresh_sizes=True: one-row requests sent one at a time launch at the size the figures choose; the
    figures follow the launches (each size's, the 25th percentile of its last 32 runs), and once the model has
    launched 128 times each size none chose runs once, so that a size measured slow at load is measured again. With
    refresh_sizes=False (the default) the figures measured at load stay and the sizes not chosen never run."""
    alone = Executor(str(mlp_sizes), batch_size=1)
    x = np.random.default_rng(13).standard_normal((140, 784)).astype(np.float32)
    for refresh in (False, True):
        rt = Runtime()
        try:
            with pytest.raises(TvmschedError, match=r"^refresh_sizes must be True or False, not 'false'$"):
                rt.load(str(mlp_sizes), name="mlp", refresh_sizes="false")  # (a string would be taken as True)
            rt.load(str(mlp_sizes), name="mlp", refresh_sizes=refresh)
            loaded = {size: s["run_us"] for size, s in rt.stats()["mlp"]["sizes"].items()}
            for i in range(len(x)):
                np.testing.assert_allclose(rt.submit("mlp", {"input": x[i : i + 1]}).result(timeout=60)["output"],
                                           alone.run({"input": x[i : i + 1]})["output"], rtol=1e-4, atol=1e-5)
            sizes = rt.stats()["mlp"]["sizes"]
        finally:
            rt.shutdown()
        launched = {size: s["launches"] for size, s in sizes.items()}
        now = {size: s["run_us"] for size, s in sizes.items()}
        assert sum(launched.values()) == len(x), launched
        if refresh:
            assert min(launched.values()) >= 1 and now != loaded, (launched, loaded, now)
        else:
            assert sorted(launched.values()) == [0, 0, 0, len(x)] and now == loaded, (launched, loaded, now)


def test_two_slots_each_hold_every_size_and_both_serve_a_burst(mlp_sizes):
    alone = Executor(str(mlp_sizes), batch_size=1)
    rng = np.random.default_rng(11)
    burst = [rng.standard_normal((rows, 784)).astype(np.float32) for rows in [1, 2, 3, 1, 5, 8, 1, 4] * 12]
    rt = Runtime()
    try:
        tasks = rt.load(str(mlp_sizes), name="mlp", streams=2).tasks
        assert [task.name for task in tasks] == ["mlp", "mlp#1", "mlp@b1", "mlp#1@b1", "mlp@b2", "mlp#1@b2", "mlp@b4",
                                                 "mlp#1@b4"]  # each slot: the largest size, then one per smaller size
        slots = [[task for task in tasks if ("#1" in task.name) == second] for second in (False, True)]

        def served_by(slot: int) -> tuple[list, int]:
            """The burst's answers with the other slot paused (a launch it took waits for its resume), and the launches
            `slot` completed meanwhile."""
            def completed() -> int:
                return sum(task.counts()["completed"] for task in slots[slot])

            for task in slots[1 - slot]:
                task.preempt()
            before = completed()
            futures = [rt.submit("mlp", {"input": x}) for x in burst]
            wait_until(lambda: sum(f.done() for f in futures) >= len(burst) - 8, f"slot {slot} serves the burst")
            served = completed() - before
            for task in slots[1 - slot]:
                task.resume()
            return [f.result(timeout=60)["output"] for f in futures], served

        runs = [served_by(0), served_by(1)]
    finally:
        rt.shutdown()
    for answers, _ in runs:
        for x, got in zip(burst, answers):
            np.testing.assert_allclose(got, _row_by_row(alone, x), rtol=1e-4, atol=1e-5)
    assert all(served > 0 for _, served in runs), [served for _, served in runs]  # each slot serves with its own sizes


def test_preferred_batch_sizes_must_be_compiled_sizes_and_a_preferred_size_launches_without_waiting(mlp_sizes, compiled):
    rt = Runtime()
    try:
        with pytest.raises(TvmschedError, match=r"^model mlp: preferred_batch_size 3 is not one of its compiled batch "
                                                r"sizes \(1, 2, 4, 8\)$"):
            rt.load(str(mlp_sizes), name="mlp", preferred_batch_sizes=(3,))
        with pytest.raises(TvmschedError, match="preferred_batch_size 2 is not possible: the model is not compiled"):
            rt.load(str(compiled("mlp")), name="plain", preferred_batch_sizes=(2,))
        assert rt.models == {} and rt.stats().keys() == {"_device", "_scheduler"}  # nothing stayed loaded
        # a delay far past the test's deadline: two rows reach the preferred size, so they launch at once
        rt.load(str(mlp_sizes), name="mlp", max_queue_delay_us=60e6, preferred_batch_sizes=(2,))
        inputs = Executor(str(mlp_sizes), batch_size=1).random_inputs(0)
        first, second = (rt.submit("mlp", inputs) for _ in range(2))
        assert first.result(timeout=20)["output"].shape == second.result(timeout=20)["output"].shape == (1, 10)
        assert [rows for rows, _, _ in rt.stats()["mlp"]["batches"]] == [2]
    finally:
        rt.shutdown()


def _burst_answered_right(rt, name: str, burst: list, alone: Executor) -> None:
    futures = [rt.submit(name, {"input": x}) for x in burst]
    for x, future in zip(burst, futures):
        np.testing.assert_allclose(future.result(timeout=60)["output"], _row_by_row(alone, x), rtol=1e-4, atol=1e-5)


def test_real_time_requests_preempt_the_batched_launches_of_every_size_which_resume_and_answer_right(mlp_sizes, compiled):
    alone = Executor(str(mlp_sizes), batch_size=1)
    rng = np.random.default_rng(5)
    burst = [rng.standard_normal((rows, 784)).astype(np.float32) for rows in [1, 2, 3, 8, 1, 5, 4, 1] * 25]
    rt = Runtime()
    try:
        tasks = rt.load(str(mlp_sizes), name="be").tasks
        rt.load(str(compiled("mlp")), name="rt", priority="realtime")
        futures = [rt.submit("be", {"input": x}) for x in burst]
        during = 0  # real-time requests sent while the burst still ran (a loaded machine may finish it early)
        for x in burst[:40]:  # one at a time while the burst runs: each preempts the best-effort streams anew
            during += not all(f.done() for f in futures)
            np.testing.assert_allclose(rt.submit("rt", {"input": x[:1]}).result(timeout=60)["output"],
                                       alone.run({"input": x[:1]})["output"], rtol=1e-4, atol=1e-5)
        for x, future in zip(burst, futures):
            np.testing.assert_allclose(future.result(timeout=60)["output"], _row_by_row(alone, x), rtol=1e-4, atol=1e-5)
        preempted = {task.name: task.counts()["preemptions"] for task in tasks}
    finally:
        rt.shutdown()
    # each real-time request during the burst pauses every size's stream that runs then (the first one all four: the
    # burst has just been queued), so at least one each
    assert during > 0 and all(n > 0 for n in preempted.values()) and sum(preempted.values()) >= during, (during, preempted)


def test_switched_or_streamed_a_model_of_several_sizes_serves_its_largest_alone_padded(mlp_sizes, compiled):
    """resident=False (switched) or larger than the budget (streamed): the smaller sizes would read device weights the
    placement moves, so the model serves its largest size alone, each launch padded up to it, answered right."""
    alone = Executor(str(mlp_sizes), batch_size=1)
    rng = np.random.default_rng(9)
    burst = [rng.standard_normal((rows, 784)).astype(np.float32) for rows in [1, 3, 8, 2, 5] * 4]
    probe = Runtime()
    try:
        probe.load(str(mlp_sizes), name="mlp", resident=False)
        probe.submit("mlp", {"input": burst[0]}).result(timeout=60)  # switched in by its request
        footprint = probe.memory()["in_use"]
    finally:
        probe.shutdown()
    rt = Runtime(memory_budget=footprint * 3 // 2)  # holds one of the two at a time: they are switched in turn
    try:
        model = rt.load(str(mlp_sizes), name="mlp", resident=False)
        rt.load(str(compiled("mlp")), name="other", resident=False)
        assert [task.name for task in model.tasks] == ["mlp"] and rt.stats()["mlp"]["placement"] == "staged"
        other_x = rng.standard_normal((1, 784)).astype(np.float32)
        for x in burst:
            _burst_answered_right(rt, "mlp", [x], alone)
            np.testing.assert_allclose(rt.submit("other", {"input": other_x}).result(timeout=60)["output"],
                                       alone.run({"input": other_x})["output"], rtol=1e-4, atol=1e-5)
        assert {rows for rows, _, _ in rt.stats()["mlp"]["batches"]} == {1, 2, 3, 5, 8}  # rows brought per launch
        assert sum(event.stage == "evict" for event in rt.switch_events()) >= len(burst)
        assert rt.memory()["peak"] <= footprint * 3 // 2
    finally:
        rt.shutdown()
    streamed = Runtime(memory_budget=footprint * 9 // 10)
    try:
        model = streamed.load(str(mlp_sizes), name="mlp")
        assert [task.name for task in model.tasks] == ["mlp"] and streamed.stats()["mlp"]["placement"] == "streamed"
        _burst_answered_right(streamed, "mlp", burst, alone)
        assert streamed.memory()["peak"] <= footprint * 9 // 10
    finally:
        streamed.shutdown()


def _with_unit_candidates(path, out, slower: dict[int, float]):
    """The artifact at `path` with a second candidate in every layer at every size: the same kernel on 1 unit, declared
    `slower[size]` times the first's latency (the first declared at 10 µs on 2 units)."""
    artifact = Artifact.load(path)

    def program(manifest):
        layers = []
        for layer in manifest.layers:
            first = dataclasses.replace(layer.candidates[0], units=2, latency_us=10.0)
            second = dataclasses.replace(first, id=1, units=1, latency_us=10.0 * slower[manifest.batch_size])
            layers.append(dataclasses.replace(layer, candidates=(first, second)))
        return dataclasses.replace(manifest, layers=tuple(layers))

    manifest = dataclasses.replace(program(artifact.manifest),
                                   variants=tuple(program(v) for v in artifact.manifest.variants))
    dataclasses.replace(artifact, manifest=manifest).save(out)
    return out


def test_the_batch_size_is_chosen_with_the_candidates_the_policy_takes_at_each_size(mlp_sizes, compiled, tmp_path):
    """The partition policy on 2 units: a model loaded alone takes its 2-unit candidates, beside a second model its
    1-unit ones. Where 1 unit makes the larger sizes slow (declared 20x at 2, 4 and 8 rows, 1x at 1 row), eight queued
    rows run as eight launches of 1 row while the model has 1 unit, and packed (at 4 or 8 rows) while it has 2."""
    path = _with_unit_candidates(mlp_sizes, tmp_path / "units.tvms", {1: 1.0, 2: 20.0, 4: 20.0, 8: 20.0})
    alone = Executor(str(path), batch_size=1)
    rows = np.random.default_rng(3).standard_normal((8, 784)).astype(np.float32)
    rt = Runtime(policy="partition", total_units=2)

    def launches() -> dict[int, int]:
        return {size: s["launches"] for size, s in rt.stats()["mlp"]["sizes"].items()}

    def eight_queued_rows() -> dict[int, int]:
        """Launches per size of eight one-row requests queued together (held until the 8th: its largest size)."""
        before = launches()
        futures = [rt.submit("mlp", {"input": rows[i : i + 1]}) for i in range(8)]
        for i, future in enumerate(futures):
            np.testing.assert_allclose(future.result(timeout=60)["output"], alone.run({"input": rows[i : i + 1]})["output"],
                                       rtol=1e-4, atol=1e-5)
        return {size: n - before[size] for size, n in launches().items() if n != before[size]}

    def packed(launched: dict[int, int]) -> bool:  # (4 or 8 rows a launch, as the sizes measured at load compare)
        return 1 not in launched and sum(size * n for size, n in launched.items()) == 8

    try:
        rt.load(str(path), name="mlp", max_queue_delay_us=200_000)
        launched = eight_queued_rows()
        assert packed(launched), launched
        rt.load(str(compiled("mlp")), name="other")  # two models: each one's share is 1 unit
        assert eight_queued_rows() == {1: 8}
        rt.unload("other")
        launched = eight_queued_rows()
        assert packed(launched), launched
    finally:
        rt.shutdown()


def test_one_row_is_padded_into_a_larger_size_where_that_runs_faster_outright(mlp_sizes, compiled, tmp_path):
    """Declared 20x slower at 1 row on 1 unit (1x at 2, 4 and 8 rows): with a second model loaded (the partition
    policy's share is 1 unit) a lone one-row request runs padded, at the larger size predicted fastest."""
    path = _with_unit_candidates(mlp_sizes, tmp_path / "units.tvms", {1: 20.0, 2: 1.0, 4: 1.0, 8: 1.0})
    alone = Executor(str(path), batch_size=1)
    x = np.random.default_rng(5).standard_normal((1, 784)).astype(np.float32)
    rt = Runtime(policy="partition", total_units=2)
    try:
        rt.load(str(path), name="mlp")
        rt.load(str(compiled("mlp")), name="other")
        sizes = rt.stats()["mlp"]["sizes"]
        before = {size: s["launches"] for size, s in sizes.items()}
        np.testing.assert_allclose(rt.submit("mlp", {"input": x}).result(timeout=60)["output"],
                                   alone.run({"input": x})["output"], rtol=1e-4, atol=1e-5)
        launched = {size: s["launches"] - before[size] for size, s in rt.stats()["mlp"]["sizes"].items()}
        fastest = min((2, 4, 8), key=lambda size: sizes[size]["run_us"])
        assert launched == {1: 0, 2: 0, 4: 0, 8: 0} | {fastest: 1}, (launched, sizes)
        assert rt.stats()["mlp"]["batches"][0][:2] == (1, 1)  # it brought 1 row (the rest padding)
    finally:
        rt.shutdown()


def _loaded_for_admission(rt, mlp_sizes) -> int:
    """mlp at several sizes loaded with a latency target of 3.5 runs of 8 rows; the number of one-row requests of
    which the last is the first that admission refuses while the model's streams are paused: the first whose
    prediction from the sizes' runs (measured again at load) passes the target."""
    rt.load(str(mlp_sizes), name="mlp")
    target_ms = 3.5 * rt.stats()["mlp"]["sizes"][8]["run_us"] / 1e3
    rt.unload("mlp")
    rt.load(str(mlp_sizes), name="mlp", qos_ms=target_ms)
    runs = {size: s["run_us"] for size, s in rt.stats()["mlp"]["sizes"].items()}  # (measured again at this load)
    predicted = lambda rows: min(-(-rows // size) * run for size, run in runs.items())
    first_refused = next(rows for rows in range(2, 100) if predicted(rows) > target_ms * 1e3)
    assert first_refused > 8, (first_refused, runs)
    return first_refused


def _refused_with_rows_ahead(rt, x, ahead: int) -> None:
    refused = rt.submit("mlp", {"input": x[-1:]})  # (the future holds the refusal)
    with pytest.raises(TvmschedError, match=rf"^model mlp: the request would finish in about .* ms "
                                            rf"\({ahead} rows ahead of it\), past its latency target"):
        refused.result(timeout=0)


def test_admission_of_a_model_of_several_sizes_counts_the_rows_its_batches_run(mlp_sizes):
    """One-row requests queued while the model's streams are paused. Admission predicts as the batcher runs them, the
    queued rows and its own at the size that drains them soonest (a count of requests times a run, as for a model of
    one size, would refuse the fifth): the first refused is the first whose prediction passes the target, past a
    launch of 8, and every admitted one is answered."""
    rt = Runtime()
    try:
        first_refused = _loaded_for_admission(rt, mlp_sizes)
        x = np.random.default_rng(9).standard_normal((first_refused, 784)).astype(np.float32)
        alone = Executor(str(mlp_sizes), batch_size=1)
        for _ in range(2):  # again once the batcher has taken them all: the rows ahead are counted as they go, too
            rt.preempt("mlp")
            admitted = [rt.submit("mlp", {"input": x[i : i + 1]}) for i in range(first_refused - 1)]
            _refused_with_rows_ahead(rt, x, first_refused - 1)
            rt.resume("mlp")
            for i, future in enumerate(admitted):
                np.testing.assert_allclose(future.result(timeout=60)["output"], alone.run({"input": x[i : i + 1]})["output"],
                                           rtol=1e-4, atol=1e-5)
        assert rt.stats()["mlp"]["refused"] == 2
    finally:
        rt.shutdown()


def test_rows_of_requests_that_expire_in_the_queue_are_no_longer_ahead(mlp_sizes):
    """Requests queued with a timeout that passes while the streams are paused fail with one line (REJECT, the
    default) and leave the rows admission counts: as many new ones are admitted as before, and the next is refused
    with exactly their rows ahead."""
    rt = Runtime()
    try:
        first_refused = _loaded_for_admission(rt, mlp_sizes)
        x = np.random.default_rng(9).standard_normal((first_refused, 784)).astype(np.float32)
        rt.preempt("mlp")
        late = [rt.submit("mlp", {"input": x[i : i + 1]}, start_within_us=1000) for i in range(first_refused - 1)]
        for future in late:
            with pytest.raises(TvmschedError, match="did not start within its deadline"):
                future.result(timeout=60)
        admitted = [rt.submit("mlp", {"input": x[i : i + 1]}) for i in range(first_refused - 1)]
        _refused_with_rows_ahead(rt, x, first_refused - 1)
        rt.resume("mlp")
        for future in admitted:
            future.result(timeout=60)
        stats = rt.stats()["mlp"]
        assert stats["timed_out"] == first_refused - 1 and stats["refused"] == 1, stats
    finally:
        rt.shutdown()


def test_a_variant_whose_batch_size_is_not_below_the_largest_is_a_corrupt_artifact(mlp_sizes, tmp_path):
    artifact = Artifact.load(mlp_sizes)
    variants = artifact.manifest.variants
    bad = dataclasses.replace(variants[0], batch_size=8)  # as large as the manifest's own
    tampered = dataclasses.replace(artifact, manifest=dataclasses.replace(artifact.manifest, variants=(bad, *variants[1:])))
    tampered.save(tmp_path / "bad.tvms")
    with pytest.raises(TvmschedError, match=r"is a corrupt artifact: bad manifest or weights \(manifest.variants' batch "
                                            r"sizes are not distinct sizes below batch_size, in order\)$"):
        Executor(str(tmp_path / "bad.tvms"))
    with pytest.raises(TvmschedError, match=r"is not compiled at batch size 3 \(its sizes: 1, 2, 4, 8\)$"):
        Executor(str(mlp_sizes), batch_size=3)


def test_the_cli_compiles_several_sizes_into_one_artifact_and_inspect_lists_them(cli, tmp_path):
    model = tmp_path / "mlp.onnx"
    import onnx

    onnx.save(models.build("mlp"), model)
    out = tmp_path / "mlp.tvms"
    done = cli("compile", model, "--batch-sizes", "4,1,2", "-o", out)
    assert done.returncode == 0, done.stderr
    shown = cli("inspect", out).stdout
    assert "batch sizes 1, 2, 4 (every input's first dimension; one program each, the weights stored once)" in shown
    for size in (1, 2, 4):
        assert f"  batch {size:>4}: run " in shown
    checked = cli("run", out, "--check", model)  # the largest size, against onnxruntime on the model rewritten for it
    assert checked.returncode == 0 and "-> OK" in checked.stdout, checked.stderr
    assert_user_error(cli("compile", model, "--batch-sizes", "0,2", "-o", tmp_path / "x.tvms"), "--batch-sizes")


@pytest.mark.parametrize("name,size", [("mlp", 4), ("mlp", 8), ("bert-tiny", 2)])
def test_cuda_kernels_give_a_row_the_same_bits_at_any_position_beside_any_rows(name, size):
    """The CUDA default schedules at a batch size, checked without a GPU through their serial twins (TIR's meaning is
    sequential: tests/test_gpu_schedule.py's method): for every layer whose input and output hold the batch first, a
    row's output is the same bits at every position of the batch, beside random rows or zero (padding) rows."""
    from tests.test_gpu_schedule import _run_on_cpu, _serial
    from tvmsched.frontend import batching
    from tvmsched.lower import kernels
    from tvmsched.pipeline import lower_model

    rebatched = batching.rebatch(models.build(name), size)
    _, funcs, target = lower_model(rebatched.model, "cuda", rebatched.input_shapes)
    scheduled = kernels.default_schedule(funcs, target)
    rng = np.random.default_rng(3)
    checked = 0
    for f, func in scheduled.items():
        params = [[int(d) for d in p.shape] for p in funcs[f].params]
        if not (params[0] and params[0][0] == size and params[-1] and params[-1][0] == size) or "float" not in str(
                funcs[f].params[0].dtype):
            continue
        twin = _serial(func)
        dtypes = [str(p.dtype) for p in funcs[f].params[:-1]]
        batched = [i for i, shape in enumerate(params[:-1]) if shape and shape[0] == size]  # the operands holding rows
        fixed = [rng.standard_normal(shape).astype(dtype) for shape, dtype in zip(params[:-1], dtypes)]
        rows = {i: rng.standard_normal(params[i][1:]).astype(dtypes[i]) for i in batched}  # the row, in each of them
        seen = []
        for position in range(size):
            for padding in (False, True):
                args = list(fixed)
                for i in batched:
                    args[i] = np.zeros(params[i], dtypes[i]) if padding else rng.standard_normal(params[i]).astype(dtypes[i])
                    args[i][position] = rows[i]
                seen.append(_run_on_cpu(twin, args)[position])
        assert all(np.array_equal(s, seen[0]) for s in seen), f
        checked += 1
    assert checked >= 2
