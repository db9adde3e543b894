"""DLRM, its interaction, the throughput callback's TensorBoard output, profiling, parameter counts."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from data_gen.criteo import CAT_NAMES, CONT_NAMES, held_out_block, write_criteo_parquet  # noqa: E402
from sok_tutorial.data import HashBucket, ParquetLoader  # noqa: E402
from sok_tutorial.data.tfrecord import tfrecord_dataset, write_tfrecords  # noqa: E402
from sok_tutorial.models import DLRM  # noqa: E402
from sok_tutorial.models.dlrm import pairwise_interaction  # noqa: E402
from sok_tutorial.training import ThroughputLogger, parameter_report  # noqa: E402
from sok_tutorial.training.profiler import ProfileSteps, op_breakdown, phase_totals, trace_files  # noqa: E402

CARDS = [50 + 7 * i for i in range(26)]


def _features(batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {n: tf.constant(rng.integers(0, c, batch)) for n, c in zip(CAT_NAMES, CARDS)}
    out.update({n: tf.constant(rng.exponential(5.0, batch).astype("float32")) for n in CONT_NAMES})
    return out


def _scalars(log_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})  # keep every event
    events.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]


# ----------------------------------------------------------------------------- interaction
def _pairs_numpy(v: np.ndarray) -> np.ndarray:
    f = v.shape[1]
    return np.stack([np.einsum("bd,bd->b", v[:, i], v[:, j]) for i in range(f) for j in range(i)], axis=1)


@pytest.mark.parametrize("pad_to, width", [(None, 351), (16, 352), (8, 352), (32, 352), (100, 400)])
def test_interaction_matches_numpy_and_pads_with_zeros(pad_to, width):
    v = np.random.default_rng(1).normal(size=(5, 27, 4)).astype("float32")
    got = pairwise_interaction(tf.constant(v), pad_to=pad_to).numpy()
    assert got.shape == (5, width)
    np.testing.assert_allclose(got[:, :351], _pairs_numpy(v), rtol=1e-5, atol=1e-5)
    assert not got[:, 351:].any()


def test_interaction_gradient_equals_autodiff_of_the_plain_formula():
    v = tf.constant(np.random.default_rng(2).normal(size=(3, 6, 5)).astype("float32"))
    weights = tf.constant(np.random.default_rng(3).normal(size=(15, 1)).astype("float32"))
    rows, cols = np.tril_indices(6, k=-1)

    def plain(t):  # autodiff through matmul + gather
        return tf.gather(tf.reshape(tf.matmul(t, t, transpose_b=True), [-1, 36]), rows * 6 + cols, axis=1)

    grads = []
    for fn in (pairwise_interaction, plain):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = tf.reduce_sum(tf.matmul(fn(v), weights) ** 2)
        grads.append(tape.gradient(y, v).numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- model
@pytest.mark.parametrize("embedding", ["sok", "keras"])
def test_dlrm_shapes_and_both_feature_layouts(embedding):
    model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding_dim=8, bottom_mlp=[16], top_mlp=[32, 16],
                 embedding=embedding, pad_interaction_to=16)
    features = _features(6)
    logits = model(features)
    assert logits.shape == (6, 1) and logits.dtype == tf.float32 and np.isfinite(logits.numpy()).all()
    stacked = {"categorical": tf.stack([features[n] for n in CAT_NAMES], 1),
               "continuous": tf.stack([features[n] for n in CONT_NAMES], 1)}
    np.testing.assert_allclose(model(stacked).numpy(), logits.numpy(), rtol=1e-6)
    clone = DLRM.from_config(model.get_config())
    assert clone.get_config() == model.get_config()


def test_dlrm_sok_and_keras_tables_count_the_same_parameters():
    reports = {}
    for embedding in ("sok", "keras"):
        model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding_dim=8, bottom_mlp=[16], top_mlp=[32, 16],
                     embedding=embedding)
        model(_features(2))
        reports[embedding] = parameter_report(model)
    dense = (13 * 16 + 16) + (16 * 8 + 8) + ((8 + 351) * 32 + 32) + (32 * 16 + 16) + (16 + 1)
    for report in reports.values():
        assert report["embedding_parameters"] == sum(CARDS) * 8
        assert report["dense_parameters"] == dense
        assert report["embedding_bytes"] == 4 * sum(CARDS) * 8 and report["dense_bytes"] == 4 * dense


@pytest.mark.parametrize("pad_to, top", [(16, [32, 16]), (None, [])])
def test_sliced_interaction_gives_the_whole_batch_outputs_and_gradients(pad_to, top):
    features, labels = _features(24, seed=4), tf.constant(np.random.default_rng(5).random((24, 1)) < 0.3, tf.float32)
    results = []
    for size in (None, 5, 8):  # whole; 5 slices of 4-5 (uneven); 3 of 8
        model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding_dim=8, bottom_mlp=[16], top_mlp=top,
                     pad_interaction_to=pad_to, interaction_slice=size)
        keras.utils.set_random_seed(7)
        model(features)
        if results:  # the same weights as the whole-batch model
            model.set_weights(results[0][2])
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
        results.append((logits.numpy(), grads, model.get_weights()))
    whole = results[0]
    for logits, grads, _ in results[1:]:
        np.testing.assert_allclose(logits, whole[0], rtol=1e-5, atol=1e-6)
        assert len(grads) == len(whole[1])
        for got, want in zip(grads, whole[1]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_interaction_slice_default_and_config():
    from sok_tutorial.models.dlrm import CPU_SLICE, resolve_slice

    model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, interaction_slice=256)
    assert DLRM.from_config(model.get_config()).interaction_slice == 256
    assert DLRM(CARDS, CAT_NAMES, CONT_NAMES).interaction_slice == "auto"
    gpus = tf.config.list_logical_devices("GPU")
    assert resolve_slice("auto") == (None if gpus else CPU_SLICE)
    assert resolve_slice(None) is None and resolve_slice(64) == 64

    @tf.function
    def placed(device):
        with tf.device(device):
            return resolve_slice("auto", tf.identity(tf.zeros([4, 2])))

    assert placed("/CPU:0") == CPU_SLICE  # the device the tensors are on decides
    assert resolve_slice("auto", type("OnGPU", (), {"device": "/job:localhost/device:GPU:0"})()) is None


@pytest.mark.parametrize("value", [0, -512, 2.5, "whole", True])
def test_interaction_slice_rejects_bad_values(value):
    with pytest.raises(ValueError, match="interaction_slice"):
        DLRM(CARDS, CAT_NAMES, CONT_NAMES, interaction_slice=value)


def test_dlrm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="embedding"):
        DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding="dense")
    with pytest.raises(ValueError, match="cardinalities"):
        DLRM(CARDS[:3], CAT_NAMES, CONT_NAMES)
    with pytest.raises(ValueError, match="cardinalities\\[2\\]"):
        DLRM([5, 5, 0] + CARDS[3:], CAT_NAMES, CONT_NAMES)


def test_dlrm_with_sok_tables_trains_only_touched_rows():
    from sok_tutorial.optimizers import Adam

    model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding_dim=4, bottom_mlp=[8], top_mlp=[8])
    model.compile(optimizer=Adam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    features = {n: tf.zeros([16], tf.int64) for n in CAT_NAMES} | {n: tf.ones([16]) for n in CONT_NAMES}
    model(features)
    before = model.embedding.embedding_variable.numpy().copy()
    model.fit(features, tf.ones([16, 1]), epochs=1, batch_size=16, verbose=0)
    changed = np.flatnonzero(np.any(model.embedding.embedding_variable.numpy() != before, axis=1))
    np.testing.assert_array_equal(changed, model.offsets)  # key 0 of every feature, nothing else


# ----------------------------------------------------------------------------- callbacks
def _tiny_fit(log_dir, steps_per_execution: int = 1, callbacks=()):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse", steps_per_execution=steps_per_execution)
    logger = ThroughputLogger(batch_size=16, every=5, warmup=3, log_dir=log_dir)
    x = np.random.default_rng(0).normal(size=(640, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=16, epochs=2, callbacks=[logger, *callbacks], verbose=0)
    return logger


def test_throughput_logger_writes_tensorboard_scalars(tmp_path):
    logger = _tiny_fit(tmp_path / "tb")
    steps = [s for s, _ in logger.history]
    assert steps == list(range(8, 81, 5))  # 2 epochs x 40 steps, after 3 warm-up steps
    written = _scalars(tmp_path / "tb", "samples_per_s")
    assert [s for s, _ in written] == steps
    np.testing.assert_allclose([r for _, r in written], [r for _, r in logger.history], rtol=1e-6)
    assert logger.rate() > 0 and logger.mean() > 0


def test_throughput_logger_counts_every_step_under_steps_per_execution(tmp_path):
    logger = _tiny_fit(None, steps_per_execution=4)
    assert logger._step == 80
    # Keras reports every 4th step: timing starts at step 4, windows close at the first report
    # at least 5 steps on
    assert [s for s, _ in logger.history][:3] == [12, 20, 28]


def test_profile_steps_writes_a_trace_the_breakdown_attributes(tmp_path):
    profiler = ProfileSteps(tmp_path / "tb", start=3, steps=2)
    model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding_dim=4, bottom_mlp=[8], top_mlp=[8])
    model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
    features = _features(256)
    model.fit(features, tf.ones([256, 1]), batch_size=32, epochs=1, callbacks=[profiler], verbose=0)
    assert profiler.traced == 2 and profiler.seconds > 0 and trace_files(tmp_path / "tb")
    rows = op_breakdown(tmp_path / "tb", steps=2)
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-9
    parts = {(r["phase"], r["part"]) for r in rows}
    assert {("forward", "interaction"), ("backward", "interaction"), ("forward", "embedding"),
            ("forward", "top_0")} <= parts
    phases = phase_totals(rows)
    assert phases["optimizer"] > 0 and phases["backward"] > 0


@pytest.mark.parametrize("optimizer", ["SGD", "Adagrad", "RowWiseAdagrad", "LazyAdam", "Ftrl"])
def test_every_sparse_optimizers_ops_are_the_optimizer_phase(optimizer):
    """Each optimizer of `sok_tutorial.optimizers` names its ops' scope one the breakdown knows."""
    import sok_tutorial as sok
    from sok_tutorial.training.profiler import OPTIMIZER_SCOPES, _classify

    name = getattr(sok.optimizers, optimizer)(0.1).name
    assert _classify(f"{name}/Gather:ResourceGather", OPTIMIZER_SCOPES)[0] == "optimizer", name


def test_op_breakdown_without_a_trace_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no plugins/profile"):
        op_breakdown(tmp_path)


# ----------------------------------------------------------------------------- data for the notebook
def test_held_out_rows_come_from_the_same_model_and_differ(tmp_path):
    train = write_criteo_parquet(tmp_path / "train", 3000, progress=False)
    valid = write_criteo_parquet(tmp_path / "valid", 1000, first_block=held_out_block(3000), progress=False)
    import pandas as pd

    a, b = (pd.concat([pd.read_parquet(f) for f in sorted((tmp_path / d).glob("*.parquet"))])
            for d in ("train", "valid"))
    assert train.metadata["generator"]["first_block"] == 0 and valid.metadata["generator"]["first_block"] == 1
    assert len(set(map(tuple, a[CAT_NAMES].values)) & set(map(tuple, b[CAT_NAMES].values))) == 0
    assert abs(a["label"].mean() - b["label"].mean()) < 0.06  # same planted model, same click rate
    with pytest.raises(ValueError, match="first_block"):
        write_criteo_parquet(tmp_path / "bad", 10, first_block=-1, progress=False)


def test_both_pipelines_stack_columns_alike(tmp_path):
    write_criteo_parquet(tmp_path / "pq", 2000, progress=False)
    files = write_tfrecords(tmp_path / "pq", tmp_path / "tfr", label_names=["label"], cat_names=CAT_NAMES,
                            cont_names=CONT_NAMES, progress=False)
    native = tfrecord_dataset(files, 500, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                              concat_categorical=True, concat_continuous=True)
    loader = ParquetLoader(tmp_path / "pq", 500, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                           shuffle=False, fill_nan=0.0, concat_categorical=True, concat_continuous=True)
    (nf, nl), (lf, ll) = next(iter(native)), next(iter(loader))
    assert set(nf) == set(lf) == {"categorical", "continuous"}
    np.testing.assert_array_equal(nf["categorical"].numpy(), lf["categorical"].numpy())
    np.testing.assert_allclose(nf["continuous"].numpy(), lf["continuous"].numpy())
    np.testing.assert_array_equal(nl.numpy(), ll.numpy())
    assert loader.element_spec[0]["categorical"].shape.as_list() == [None, 26]
    hashed = ParquetLoader(tmp_path / "pq", 500, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                           fill_nan=0.0, concat_categorical=True, transforms=[HashBucket(10)])
    assert int(tf.reduce_max(next(iter(hashed))[0]["categorical"])) < 10
    with pytest.raises(ValueError, match="concat_categorical"):
        ParquetLoader(tmp_path / "pq", 500, ["label"], cont_names=CONT_NAMES, concat_categorical=True)


@pytest.mark.parametrize("optimizer", ["SGD", "RowWiseAdagrad"])
def test_keys_deduplicated_in_the_pipeline_train_the_dlrm_as_the_plain_features(optimizer):
    """``dataset.map(model.deduplicate)``: the same losses and the same tables as the features themselves."""
    import sok_tutorial as sok
    from sok_tutorial.training.step import make_sok_step

    features, labels = _features(64, seed=3), tf.constant(np.random.default_rng(4).integers(0, 2, (64, 1)), tf.float32)

    def run(deduplicated: bool) -> tuple[list[float], np.ndarray]:
        keras.utils.set_random_seed(0)
        model = DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding_dim=4, bottom_mlp=[8], top_mlp=[8])
        dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(16)
        if deduplicated:
            dataset = dataset.map(model.deduplicate).prefetch(1)
        batches = list(dataset)
        model(batches[0][0])
        step = make_sok_step(model, getattr(sok.optimizers, optimizer)(0.1), global_batch_size=16)
        losses = [float(step(f, y)) for f, y in batches]
        return losses, model.embedding.embedding_variable.numpy()

    (plain_losses, plain), (losses, table) = run(False), run(True)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(table, plain, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="deduplicate needs embedding='sok'"):
        DLRM(CARDS, CAT_NAMES, CONT_NAMES, embedding="keras").deduplicate(features)
