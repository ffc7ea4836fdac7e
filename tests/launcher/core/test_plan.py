from hypothesis import given
from hypothesis import strategies as st

from launcher.adapters.preset_files import load_catalog, make_shape
from launcher.core.plan import Infeasible, Plan, plan_batch, shrink_ladder


@given(
    gb=st.integers(1, 1 << 16),
    devices=st.integers(1, 4096),
    max_micro=st.integers(1, 64),
)
def test_plan_invariant(gb, devices, max_micro):
    plan = plan_batch(gb, devices, max_micro)
    if gb % devices:
        assert isinstance(plan, Infeasible) and "not divisible" in plan.reason
        return
    assert isinstance(plan, Plan)
    assert plan.devices * plan.micro_batch * plan.grad_accum == gb
    assert 1 <= plan.micro_batch <= max_micro
    # Largest micro-batch: no larger divisor of the per-device batch fits under the maximum.
    per_device = gb // devices
    assert not any(per_device % b == 0 for b in range(plan.micro_batch + 1, min(per_device, max_micro) + 1))


@given(gb=st.integers(1, 1 << 14), devices=st.integers(1, 512), cap=st.integers(1, 16))
def test_grad_accum_cap(gb, devices, cap):
    plan = plan_batch(gb, devices, 4, max_grad_accum=cap)
    if isinstance(plan, Plan):
        assert plan.grad_accum <= cap
    elif gb % devices == 0:
        assert "micro-steps" in plan.reason


def test_examples():
    assert plan_batch(32, 32, 16) == Plan(32, 1, 1)
    assert plan_batch(32, 8, 16) == Plan(8, 4, 1)
    assert plan_batch(32, 8, 2) == Plan(8, 2, 2)
    assert plan_batch(512, 128, 3) == Plan(128, 2, 2)
    assert isinstance(plan_batch(100, 128, 16), Infeasible)


def test_shrink_ladder_order_and_feasibility():
    rungs = shrink_ladder(make_shape("tpu7x-2x2x2", 4), 64, 16, catalog=load_catalog())
    assert [(r.shape.preset.name, r.shape.slices, r.feasible) for r in rungs] == [
        ("tpu7x-2x2x2", 4, True),  # 64 devices
        ("tpu7x-2x2x2", 3, False),  # 48: does not divide 64
        ("tpu7x-2x2x2", 2, True),  # 32
        ("tpu7x-2x2x1", 4, False),  # 32, but single-host multislice
        ("tpu7x-2x2x1", 3, False),
        ("tpu7x-2x2x2", 1, True),  # 16
        ("tpu7x-2x2x1", 2, False),
        ("tpu7x-2x2x1", 1, True),  # 8
    ]
    assert "not divisible by 48" in rungs[1].plan.reason
    # Several slices of a single-host preset are no GKE shape: multislice needs multi-host node pools.
    assert "multislice needs multi-host slices" in rungs[3].plan.reason
    feasible = [(r.plan.micro_batch, r.plan.grad_accum) for r in rungs if r.feasible]
    assert feasible == [(1, 1), (2, 1), (4, 1), (8, 1)]


def test_shrink_ladder_follows_fallbacks_transitively_largest_first():
    rungs = shrink_ladder(make_shape("tpu7x-4x4x4", 2), 256, 16, catalog=load_catalog())
    names = [(r.shape.preset.name, r.shape.slices) for r in rungs]
    assert names[0] == ("tpu7x-4x4x4", 2)
    # 2x4x4 and 2x2x2 are reached through the fallback chain 4x4x4 -> 2x4x4 -> 2x2x2 -> 2x2x1.
    assert {n for n, _ in names} == {"tpu7x-4x4x4", "tpu7x-2x4x4", "tpu7x-2x2x2", "tpu7x-2x2x1"}
    devices = [r.shape.devices for r in rungs]
    assert devices == sorted(devices, reverse=True)
    # On a tie the requested preset comes first.
    assert names.index(("tpu7x-4x4x4", 1)) < names.index(("tpu7x-2x4x4", 2))
    for r in rungs:
        assert r.shape.devices <= rungs[0].shape.devices
        if r.feasible:
            assert r.plan.global_batch == 256


def test_tensor_parallelism_divides_the_devices_into_data_parallel_ranks():
    # 128 devices, tensor 4: 32 ranks of 4 devices share the batch, 16 sequences each.
    plan = plan_batch(512, 128, 16, model_parallel=4)
    assert plan == Plan(128, 16, 1, 4) and plan.dp_ranks == 32 and plan.global_batch == 512
    # 24 sequences cannot split over 16 devices, but can over 4 ranks of 4.
    assert isinstance(plan_batch(24, 16, 16), Infeasible)
    assert plan_batch(24, 16, 16, model_parallel=4) == Plan(16, 6, 1, 4)
    assert "does not divide 6 devices" in plan_batch(8, 6, 16, model_parallel=4).reason
    rungs = shrink_ladder(make_shape("tpu7x-2x2x2", 4), 48, 16, catalog=load_catalog(), model_parallel=4)
    assert [
        (r.shape.slices, r.plan.micro_batch)
        for r in rungs
        if r.feasible and r.shape.preset.name == "tpu7x-2x2x2"
    ] == [
        (4, 3),
        (3, 4),
        (2, 6),
        (1, 12),
    ]
