"""The planner's bytes are the bytes the layers create; its plans fit the budget, prefer float32,
and a budget nothing fits is refused with the figures per table."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding import DistributedEmbedding  # noqa: E402
from sok_tutorial.embedding.placement import replica_bytes  # noqa: E402
from sok_tutorial.embedding.planner import PlanError, TableSpec, plan, price  # noqa: E402

OPTIMIZERS = {"adam": lambda: sok.optimizers.Adam(0.01), "lazyadam": lambda: sok.optimizers.LazyAdam(0.01),
              "sgd": lambda: sok.optimizers.SGD(0.1),
              "rowwise_adagrad": lambda: sok.optimizers.RowWiseAdagrad(0.1)}


@pytest.mark.parametrize("sharding,dtype,optimizer,dynamic", [
    ("replicated", "float32", "adam", False),
    ("replicated", "bfloat16", "sgd", True),
    ("row", "float32", "adam", True),
    ("row", "bfloat16", "adam", False),
    ("row", "float32", "lazyadam", True),
    ("table", "float32", "sgd", False),
    ("table", "float16", "rowwise_adagrad", True),
    ("column", "float32", "adam", True),
    ("column", "bfloat16", "lazyadam", False),
])
def test_estimated_bytes_are_the_bytes_a_built_layer_holds_per_replica(strategy_of, sharding, dtype, optimizer,
                                                                        dynamic):
    n, slot_sizes = 2, (700, 300, 250, 50)
    spec = TableSpec("t", rows=sum(slot_sizes), dim=11, ids_per_sample=4, optimizer=optimizer, dynamic=dynamic,
                     slot_sizes=slot_sizes)
    placement = price(spec, sharding, dtype, n, global_batch=64)
    with strategy_of(n).scope():
        layer = DistributedEmbedding("sum", embedding_vec_size=11, slot_num=len(slot_sizes), max_nnz=1,
                                     use_hashtable=dynamic, slot_sizes=list(slot_sizes), name="t",
                                     **placement.layer_kwargs())
        layer.build()
        opt = OPTIMIZERS[optimizer]()
        opt.build(layer.trainable_variables)
    assert layer.num_shards == (1 if sharding == "replicated" else n)
    assert replica_bytes([layer], opt) == placement.bytes_per_replica


@pytest.mark.parametrize("sharding,optimizer,options", [
    ("replicated", "adam", {"eviction_policy": "lru"}),
    ("row", "lazyadam", {"eviction_policy": "lfu", "min_count": 2}),
    ("table", "sgd", {"eviction_policy": "ttl", "ttl": 5, "bucket_capacity": 16}),
    ("column", "adam", {"track_changes": True}),
    ("row_column", "adam", {"eviction_policy": "ttl", "ttl_seconds": 60.0, "eviction_log": 100}),
    ("row", "sgd", {"min_count": 3, "sketch_width": 100}),
])
def test_a_forgetting_table_s_estimated_bytes_are_the_bytes_its_layer_holds(strategy_of, sharding, optimizer,
                                                                            options):
    n, slot_sizes = (4, None) if sharding == "row_column" else (2, (700, 300, 250, 50))
    spec = TableSpec("t", rows=1300, dim=11, ids_per_sample=4, optimizer=optimizer, dynamic=True,
                     slot_sizes=slot_sizes, lifecycle=options)
    placement = price(spec, sharding, "float32", n, global_batch=64)
    with strategy_of(n).scope():
        layer = DistributedEmbedding("sum", embedding_vec_size=11, slot_num=len(slot_sizes or [1]), max_nnz=1,
                                     use_hashtable=True, slot_sizes=list(slot_sizes) if slot_sizes else None,
                                     name="t", **placement.layer_kwargs())
        layer.build()
        opt = OPTIMIZERS[optimizer]()
        opt.build(layer.trainable_variables)
    assert replica_bytes([layer], opt) == placement.bytes_per_replica
    if "eviction_policy" in options:  # whole buckets, and no open-addressing index beside the bucketed one
        assert placement.rows_per_replica % options.get("bucket_capacity", 8) == 0
        assert not any(w.path.endswith("/slots") for w in layer.weights)


def test_a_spec_s_lifecycle_options_are_checked_when_it_is_made():
    with pytest.raises(ValueError, match="lifecycle=.*expected a dict of the table's options"):
        TableSpec("t", rows=100, dim=4, dynamic=True, lifecycle={"evict": "lru"})
    with pytest.raises(ValueError, match="need a dynamic table"):
        TableSpec("t", rows=100, dim=4, lifecycle={"eviction_policy": "lru"})
    with pytest.raises(ValueError, match="eviction_policy"):
        TableSpec("t", rows=100, dim=4, dynamic=True, lifecycle={"eviction_policy": "fifo"})


@pytest.mark.parametrize("dtype,optimizer,dynamic", [("float32", "adam", True), ("bfloat16", "lazyadam", False)])
def test_a_grid_s_estimated_bytes_are_the_bytes_its_layer_holds(strategy_of, dtype, optimizer, dynamic):
    spec = TableSpec("t", rows=1001, dim=11, ids_per_sample=4, optimizer=optimizer, dynamic=dynamic)
    placement = price(spec, "row_column", dtype, 4, global_batch=64)
    assert (placement.rows_per_replica, placement.width_per_replica, placement.column_shards) == (501, 6, 2)
    with strategy_of(4).scope():
        layer = DistributedEmbedding("sum", embedding_vec_size=11, slot_num=1, max_nnz=1, use_hashtable=dynamic,
                                     name="t", **placement.layer_kwargs())
        layer.build()
        opt = OPTIMIZERS[optimizer]()
        opt.build(layer.trainable_variables)
    layout = layer.table.layout
    assert (layout.rows, layout.columns) == (2, 2) and replica_bytes([layer], opt) == placement.bytes_per_replica


def test_the_planner_takes_a_grid_where_it_moves_less_than_column_wise_and_row_wise_where_allowed():
    wide = TableSpec("wide", rows=100_000, dim=10)  # column-wise on 4: 3 + 3 + 2 + 2 columns, 12 moved per key
    chosen = plan([wide], 4, 1 << 30, global_batch=4096, shardings=("column", "row_column"))["wide"]
    assert chosen.sharding == "row_column" and chosen.layer_kwargs()["column_shards"] == 2  # 2 x 5: 10 per key
    # row-wise moves no more (10 per key) and keeps a smaller key index per replica than a grid
    assert plan([wide], 4, 1 << 30, global_batch=4096, shardings=("row", "row_column"))["wide"].sharding == "row"
    assert plan([wide], 2, 1 << 30, global_batch=4096, shardings=("row_column", "row"))["wide"].sharding == "row"


def _tables():
    return [TableSpec("items", rows=400_000, dim=32), TableSpec("users", rows=50_000, dim=32),
            TableSpec("genres", rows=20, dim=8, ids_per_sample=3)]


def test_a_roomy_budget_replicates_small_tables_and_every_plan_fits():
    roomy = plan(_tables(), num_replicas=4, memory_per_replica=1 << 30, global_batch=4096)
    assert roomy["genres"].sharding == "replicated"
    for budget in (1 << 30, 128 << 20, 48 << 20):
        p = plan(_tables(), 4, budget, global_batch=4096, dtypes=("float32", "bfloat16"))
        assert p.bytes_per_replica <= budget
    tight = plan(_tables(), 4, 48 << 20, global_batch=4096, dtypes=("float32", "bfloat16"))
    assert tight["items"].sharding != "replicated" and tight["genres"].storage_dtype == "float32"


def test_bfloat16_only_when_float32_cannot_fit():
    float32_only = plan(_tables(), 4, 128 << 20, global_batch=4096)
    assert {p.storage_dtype for p in float32_only} == {"float32"}
    smallest_float32 = sum(min(price(t, s, "float32", 4, 4096).bytes_per_replica for s in ("row", "table"))
                           for t in _tables())
    squeezed = plan(_tables(), 4, smallest_float32 - 1, global_batch=4096, dtypes=("float32", "bfloat16"))
    assert "bfloat16" in {p.storage_dtype for p in squeezed} and squeezed.bytes_per_replica < smallest_float32


def test_the_dry_run_prints_a_row_per_table_and_the_total():
    text = str(plan(_tables(), 2, 1 << 30, global_batch=1024))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["table", "placement", "dtype"] and len(lines) == 2 + 3 + 1
    assert [line.split()[0] for line in lines[2:5]] == ["items", "users", "genres"]
    assert "budget 1,024.00 MiB per replica, 2 replicas" in lines[-1]


def test_a_budget_nothing_fits_says_by_how_much_per_table():
    with pytest.raises(PlanError) as info:
        plan(_tables(), 2, 10 << 20, global_batch=1024)
    message = str(info.value)
    assert "memory_per_replica=10,485,760 bytes" in message and "more" in message
    for name in ("items", "users", "genres"):
        assert f"{name} " in message


@pytest.mark.parametrize("call, message", [
    (lambda: TableSpec("x", rows=0, dim=4), r"x: rows=0"),
    (lambda: TableSpec("x", rows=10, dim=4, optimizer="rmsprop"), r"x: optimizer='rmsprop' is invalid"),
    (lambda: TableSpec("x", rows=10, dim=4, ids_per_sample=0), r"x: ids_per_sample=0"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, dtypes=("int8",)), r"dtypes='int8' is invalid"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, shardings=("diagonal",)), r"shardings='diagonal'"),
    (lambda: plan(_tables() + _tables()[:1], 2, 1 << 30, global_batch=64), r"distinct names"),
    (lambda: plan(_tables(), 0, 1 << 30, global_batch=64), r"num_replicas=0"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, dtypes=()), r"dtypes=\[\] is invalid: expected at least one"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, shardings=[]), r"shardings=\[\] is invalid"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, shardings="row"), r"shardings='row' is invalid: .* list"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, link_gbps=0), r"link_gbps=0 is invalid"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, link_gbps=-5.0), r"link_gbps=-5.0 is invalid"),
    (lambda: plan(_tables(), 2, 1 << 30, global_batch=64, memory_gbps=float("nan")), r"memory_gbps=nan is invalid"),
    (lambda: TableSpec("x", rows=10, dim=4, slot_sizes=(4, 4)), r"x: slot_sizes=\(4, 4\) is invalid.*rows=10"),
    (lambda: TableSpec("x", rows=10, dim=4, slot_sizes=(10, 0)), r"x: slot_sizes=\(10, 0\) is invalid"),
])
def test_bad_input_is_refused_naming_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()
