from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from data_gen.criteo import CAT_NAMES, CONT_NAMES, scaled_cardinalities, write_criteo_parquet  # noqa: E402
from data_gen.sok_samples import write_random_samples  # noqa: E402
from sok_tutorial.data import HashBucket, ParquetLoader, resolve_files  # noqa: E402
from sok_tutorial.data.tfrecord import tfrecord_dataset, write_tfrecords  # noqa: E402


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf") / "criteo"
    write_criteo_parquet(path, 3000, cardinalities=scaled_cardinalities(0.001), num_parts=2, row_group_size=500,
                         progress=False)
    return path


@pytest.fixture(scope="module")
def sok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf") / "sok"
    write_random_samples(path, 600, 400, 8, 3, use_sparse_mask=True, num_parts=2, progress=False)
    return path


def _loader(path, **kw):
    kw.setdefault("fill_nan", 0.0)
    return ParquetLoader(path, kw.pop("batch_size", 512), ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES, **kw)


def test_batches_match_the_element_spec(criteo):
    loader = _loader(criteo)
    features, labels = next(iter(loader))
    spec_features, spec_labels = loader.element_spec
    assert set(features) == set(spec_features)
    for name, tensor in features.items():
        assert spec_features[name].is_compatible_with(tensor), name
    assert labels.dtype == tf.float32 and labels.shape == (512, 1)
    assert features["C1"].dtype == tf.int64 and features["I1"].dtype == tf.float32
    assert loader.partial_batch_size == 3000 % 512 and loader.has_partial_batch


@pytest.mark.parametrize("concat", [False, True])
def test_full_batches_give_a_static_batch_size(criteo, concat):
    # drop_last: every batch has batch_size rows, the signature says so (a traced model knows it)
    for drop_last, size in ((True, 512), (False, None)):
        loader = _loader(criteo, drop_last=drop_last, concat_categorical=concat, concat_continuous=concat)
        features, labels = loader.element_spec
        assert labels.shape[0] == size and {spec.shape[0] for spec in features.values()} == {size}
        batches = list(loader.to_tf_dataset())
        assert len(batches) == (3000 // 512 if drop_last else 3000 // 512 + 1)
        for got, spec in zip(tf.nest.flatten(batches[-1]), tf.nest.flatten(loader.element_spec)):
            assert spec.is_compatible_with(got)


def test_tensors_hold_the_file_values(criteo):
    loader = _loader(criteo, shuffle=False, batch_size=3000)
    features, labels = next(iter(loader))
    table = pa.concat_tables([pq.read_table(f) for f in resolve_files(criteo)])
    np.testing.assert_array_equal(features["C7"].numpy(), table["C7"].to_numpy())
    np.testing.assert_array_equal(labels.numpy()[:, 0], table["label"].to_numpy())
    np.testing.assert_array_equal(features["I3"].numpy(), np.nan_to_num(table["I3"].to_numpy(zero_copy_only=False)))


def test_ragged_slots_and_concatenated_continuous(criteo, sok):
    features, _ = next(iter(ParquetLoader(sok, 64, ["label"], list_names=["feature"])))
    ragged = features["feature"]
    assert isinstance(ragged, tf.RaggedTensor) and ragged.shape.as_list() == [64, 8, None]
    features, _ = next(iter(_loader(criteo, concat_continuous=True)))
    assert features["continuous"].shape == (512, 13) and "I1" not in features


def test_tf_dataset_passes_are_epochs(criteo):
    loader = _loader(criteo, seed=3)
    ds = loader.to_tf_dataset()
    first = np.concatenate([f["C1"].numpy() for f, _ in ds])
    second = np.concatenate([f["C1"].numpy() for f, _ in ds])
    assert len(first) == len(second) == 3000
    assert not np.array_equal(first, second) and np.array_equal(np.sort(first), np.sort(second))
    assert ds.element_spec == loader.element_spec


def _model(buckets: int) -> keras.Model:
    inputs = {n: keras.Input([], dtype="int64", name=n) for n in CAT_NAMES[:4]}
    inputs.update({n: keras.Input([], dtype="float32", name=n) for n in CONT_NAMES[:3]})
    x = keras.layers.Concatenate()([keras.layers.Embedding(buckets, 4)(inputs[n]) for n in CAT_NAMES[:4]]
                                   + [keras.ops.expand_dims(keras.ops.log1p(keras.ops.abs(inputs[n])), -1)
                                      for n in CONT_NAMES[:3]])
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, "relu")(x)))
    model.compile("adam", "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def test_model_fit_takes_the_loader_directly(criteo):
    train = ParquetLoader(criteo, 256, ["label"], cat_names=CAT_NAMES[:4], cont_names=CONT_NAMES[:3],
                          fill_nan=0.0, transforms=[HashBucket(64)])
    valid = ParquetLoader(criteo, 1000, ["label"], cat_names=CAT_NAMES[:4], cont_names=CONT_NAMES[:3],
                          fill_nan=0.0, transforms=[HashBucket(64)], shuffle=False)
    seen = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    history = _model(64).fit(train, validation_data=valid, epochs=2, callbacks=[Count()], verbose=0)
    assert len(seen) == 2 * len(train)  # every batch of both epochs, no more
    assert np.isfinite(history.history["loss"]).all() and "val_auc" in history.history
    assert train.epoch == 2


def test_custom_loop_under_mirrored_strategy(criteo):
    cpus = tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy([d.name for d in cpus[:1]])
    loader = ParquetLoader(criteo, 512, ["label"], cat_names=CAT_NAMES[:4], cont_names=CONT_NAMES[:3],
                           fill_nan=0.0, transforms=[HashBucket(64)], drop_last=True)
    with strategy.scope():
        model = _model(64)
    dist = strategy.experimental_distribute_dataset(loader.to_tf_dataset())
    steps = 0
    for features, labels in dist:
        strategy.run(lambda f, y: model(f, training=False), args=(features, labels))
        steps += 1
    assert steps == len(loader) == 3000 // 512


def test_tfrecord_round_trip_matches_parquet(tmp_path, criteo, sok):
    files = write_tfrecords(criteo, tmp_path / "tfr", label_names=["label"], cat_names=CAT_NAMES,
                            cont_names=CONT_NAMES, progress=False)
    assert len(files) == 2
    ds = tfrecord_dataset(files, 3000, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES)
    features, labels = next(iter(ds))
    table = pa.concat_tables([pq.read_table(f) for f in resolve_files(criteo)])
    np.testing.assert_array_equal(features["C20"].numpy(), table["C20"].to_numpy())
    np.testing.assert_array_equal(features["I1"].numpy(), np.nan_to_num(table["I1"].to_numpy(zero_copy_only=False)))
    np.testing.assert_array_equal(labels.numpy()[:, 0], table["label"].to_numpy())
    hashed = next(iter(tfrecord_dataset(files, 100, ["label"], cat_names=CAT_NAMES, hash_buckets=7)))[0]
    assert 0 <= hashed["C1"].numpy().min() and hashed["C1"].numpy().max() < 7
    sfiles = write_tfrecords(sok, tmp_path / "stf", label_names=["label"], list_names=["feature"], progress=False)
    got = next(iter(tfrecord_dataset(sfiles, 600, ["label"], list_names=["feature"], slots={"feature": 8})))[0]
    ref = pa.concat_tables([pq.read_table(f) for f in resolve_files(sok)])["feature"].to_pylist()
    assert got["feature"].to_list() == ref


def test_tfrecord_bad_input(tmp_path, criteo):
    with pytest.raises(FileNotFoundError, match="no TFRecord files"):
        tfrecord_dataset([], 10, ["label"])
    with pytest.raises(FileExistsError):
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "keep").write_text("1")
        write_tfrecords(criteo, tmp_path / "x", label_names=["label"], progress=False)
