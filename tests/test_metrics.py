"""Each metric against an independent numpy formula, pooling, and sort order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_ptq.errors import PTQError
from pytest_ptq.metrics import METRICS, Pooled, Reference, Scratch, by_output, compare, get_metrics
from pytest_ptq.outputs import OutputSpec


def _log_softmax(a):
    a = a - a.max(axis=-1, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=-1, keepdims=True))


NUMPY = {
    "cosine-similarity": lambda r, t: float((r * t).sum() / np.sqrt((r * r).sum() * (t * t).sum())),
    "mse": lambda r, t: float(((t - r) ** 2).mean()),
    "mre": lambda r, t: float(np.abs(t - r).sum() / np.abs(r).sum()),
    "sqnr": lambda r, t: float(10 * np.log10((r ** 2).sum() / ((t - r) ** 2).sum())),
    "chebyshev": lambda r, t: float(np.abs(t - r).max()),
    "l1": lambda r, t: float(np.abs(t - r).mean()),
    "kl": lambda r, t: float((np.exp(_log_softmax(r)) * (_log_softmax(r) - _log_softmax(t))).sum(-1).mean()),
    "correlation": lambda r, t: float(np.corrcoef(r.ravel(), t.ravel())[0, 1]),
}


def _pair(seed, shape=(4, 3, 10)):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(shape).astype(np.float32)
    return ref, (ref + 0.2 * rng.standard_normal(shape)).astype(np.float32)


def test_every_metric_has_a_numpy_formula():
    assert set(NUMPY) == set(METRICS)


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_metric_equals_numpy(name):
    ref, test = _pair(0)
    r, t = ref.astype(np.float64), test.astype(np.float64)
    assert compare(ref, test, [name])[name] == pytest.approx(NUMPY[name](r, t), rel=1e-9)


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_pooled_over_updates_equals_the_concatenation(name):
    (r1, t1), (r2, t2) = _pair(1, (2, 3, 10)), _pair(2, (5, 3, 10))
    m = get_metrics(name)[0]
    state = m.new()
    m.update(state, r1, t1)
    m.update(state, r2, t2)
    r = np.concatenate([r1, r2]).astype(np.float64)
    t = np.concatenate([t1, t2]).astype(np.float64)
    assert m.value(state) == pytest.approx(NUMPY[name](r, t), rel=1e-9)
    # and it is not simply the mean of the two per-call values
    one, two = compare(r1, t1, [name])[name], compare(r2, t2, [name])[name]
    if name not in ("chebyshev",):
        assert m.value(state) != pytest.approx((one + two) / 2, rel=1e-6)


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_a_pool_of_outputs_scores_each_over_all_samples_and_takes_the_worst(name):
    # two outputs (one a slice of a tensor) over three samples in two parts, merged
    m = get_metrics(name)[0]
    specs = [OutputSpec("a", "x"), OutputSpec("b[0]", "y", (slice(0, 1),))]
    samples = [(_pair(10 + i, (2, 3, 10)), _pair(20 + i, (2, 3, 10))) for i in range(3)]
    parts = Pooled(m, specs, per_sample=True), Pooled(m, specs, per_sample=True)
    for i, ((rx, tx), (ry, ty)) in enumerate(samples):
        part = parts[0] if i < 2 else parts[1]
        if i == 1:
            part.add_prepared(Reference.of_outputs(specs, {"x": rx, "y": ry}, Scratch()), {"x": tx, "y": ty})
        else:
            part.add({"x": rx, "y": ry}, {"x": tx, "y": ty})
    merged = parts[0].copy()
    merged.merge(parts[1])
    assert len(parts[0].samples) == 2  # the copy took the merge, not the part copied

    def numpy_value(pick):
        return NUMPY[name](*(np.concatenate([pick(s)[k] for s in samples]).astype(np.float64) for k in (0, 1)))

    expected = {"a": numpy_value(lambda s: s[0]), "b[0]": numpy_value(lambda s: tuple(v[:1] for v in s[1]))}
    assert merged.per_output() == pytest.approx(expected, rel=1e-9)
    assert merged.value() == pytest.approx(min(expected.values(), key=m.sort_key), rel=1e-9)
    own = [min((NUMPY[name](*(v.astype(np.float64) for v in x)), NUMPY[name](*(v[:1].astype(np.float64) for v in y))),
               key=m.sort_key) for x, y in samples]
    assert merged.samples == pytest.approx(own, rel=1e-9)
    assert by_output([merged, Pooled(get_metrics("mse")[0], specs)]) == {
        "a": {name: merged.per_output()["a"], "mse": 0.0}, "b[0]": {name: merged.per_output()["b[0]"], "mse": 0.0}}


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_a_prepared_reference_gives_each_tensor_its_own_numpy_value(name):
    # one reference compared with several tensors of other sizes' scratch, as a ranking does:
    # the sums kept for the reference must not carry one tensor's figures into the next
    m = get_metrics(name)[0]
    scratch = Scratch()
    small = Reference(_pair(3, (2, 5))[0], scratch)
    ref, _ = _pair(4)
    prepared = Reference(ref[:, 1:, ::2], scratch)  # a view, not contiguous
    for seed in (5, 6, 7):
        _, test = _pair(seed)
        test = test[:, 1:, ::2]
        m.update(m.new(), small, _pair(seed, (2, 5))[1])  # the shared buffers hold another pair between
        state = m.new()
        m.update(state, prepared, test)
        expected = NUMPY[name](ref[:, 1:, ::2].astype(np.float64), test.astype(np.float64))
        assert m.value(state) == pytest.approx(expected, rel=1e-9)
    assert ref[:, 1:, ::2].tolist() == prepared.array.tolist()  # the reference itself is untouched


def test_a_prepared_reference_refuses_a_tensor_of_another_size():
    m = get_metrics("cosine-similarity")[0]
    with pytest.raises(ValueError, match="6 values compared with a tensor of 1"):
        m.update(m.new(), Reference(np.ones(6, np.float32), Scratch()), np.ones(1, np.float32))


def test_correlation_pools_far_from_zero_without_cancelling():
    """States merged as the rankings merge them (one per sample), on values 1e4 from zero with a
    spread of 1: raw sums of squares would lose the spread to float64 cancellation."""
    rng = np.random.default_rng(0)
    refs = [1e4 + rng.standard_normal(300) for _ in range(3)]
    tests = [r + 0.5 * rng.standard_normal(300) for r in refs]
    m = get_metrics("correlation")[0]
    pooled = m.new()
    for r, t in zip(refs, tests):
        one = m.new()
        m.update(one, r, t)
        m.merge(pooled, one)
    assert m.value(pooled) == pytest.approx(np.corrcoef(np.concatenate(refs), np.concatenate(tests))[0, 1], rel=1e-12)
    assert compare(refs[0], refs[0] + 1e3, ["correlation", "cosine-similarity"])["correlation"] == pytest.approx(1.0)
    constant = np.full(5, 3.0)
    assert compare(constant, constant + 1, ["correlation"])["correlation"] == 1.0  # no variation to lose
    assert compare(constant, np.arange(5.0), ["correlation"])["correlation"] == 0.0


def test_identical_and_zero_tensors():
    a = np.arange(1, 7, dtype=np.float32)
    same = compare(a, a, list(METRICS))
    assert same["cosine-similarity"] == pytest.approx(1.0)
    assert same["mse"] == same["mre"] == same["chebyshev"] == same["l1"] == 0.0
    assert same["sqnr"] == math.inf and abs(same["kl"]) < 1e-12
    zero = np.zeros(4, np.float32)
    assert compare(zero, zero)["cosine-similarity"] == 1.0
    assert compare(zero, a[:4])["cosine-similarity"] == 0.0


def test_an_infinite_quantized_value_is_undefined_without_a_warning():
    """A variance quantized to zero and then divided by makes an activation infinite (magika's
    LayerNorm under aimet-onnx): the ratio metrics are NaN, which sorts worst, and numpy's
    inf/inf warning is not leaked."""
    ref = np.arange(1, 7, dtype=np.float32)
    test = ref.copy()
    test[2] = np.inf
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compare(ref, test, ["cosine-similarity", "sqnr", "mre"])
    assert all(math.isnan(v) for v in got.values())


def test_the_same_infinity_in_both_is_undefined_without_a_warning():
    """An attention mask of -inf in the reference and the quantized output: mse, mre, sqnr,
    chebyshev and l1 subtracted inf from inf with numpy's warning (a failure under -W error)."""
    import warnings

    ref = np.array([1.0, -np.inf, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compare(ref, ref + [0.1, 0.0, 0.0], list(METRICS))
    assert all(math.isnan(v) for v in got.values()), got


@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_every_metric_reads_a_non_finite_quantized_output_as_the_worst_without_a_warning(bad):
    """chebyshev read a NaN output as 0.0, a perfect score (Python's max(0.0, nan) is 0.0):
    a chebyshev contract passed and the node that broke the output ranked best; correlation
    and kl leaked numpy's warning on an infinite one, a traceback under -W error. Pooled with
    a clean sample, in either order, too."""
    import warnings

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 8))
    test = ref + 0.01
    test[0, 3] = bad
    for metric in get_metrics(list(METRICS)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            one = compare(ref, test, [metric.name])[metric.name]
            clean, broken = metric.new(), metric.new()
            metric.update(clean, ref[1:], test[1:])
            metric.update(broken, ref[:1], test[:1])
            pooled = [metric.new(), metric.new()]
            for state, parts in zip(pooled, ((clean, broken), (broken, clean))):
                for part in parts:
                    metric.merge(state, part)
        for value in (one, *(metric.value(p) for p in pooled)):
            # undefined (NaN) or infinitely bad: never better than the clean sample alone
            assert math.isnan(value) or metric.worse(value, metric.value(clean)), (metric.name, value)
            assert metric.sort_key(value) <= metric.sort_key(metric.value(clean)), metric.name


def test_sort_key_puts_the_worst_first():
    values = [0.99, 0.5, 0.9999, math.nan]
    cos, mse = get_metrics(["cosine-similarity", "mse"])
    assert sorted(values[:3], key=cos.sort_key) == [0.5, 0.99, 0.9999]  # similarity ascending
    assert sorted(values[:3], key=mse.sort_key) == [0.9999, 0.99, 0.5]  # error descending
    assert math.isnan(sorted(values, key=cos.sort_key)[0])  # an undefined value is flagged first
    assert cos.worst(values[:3]) == 0.5 and mse.worst(values[:3]) == 0.9999
    # an output gone NaN is the worst of several: dropped, it left a node's headline at the others'
    assert math.isnan(cos.worst(values)) and math.isnan(mse.worst(values))
    assert cos.worse(0.5, 0.9) and mse.worse(0.9, 0.5)


def test_names_and_aliases():
    assert [m.name for m in get_metrics(["cosine", "MSE", "mae", "max-abs"])] == [
        "cosine-similarity", "mse", "l1", "chebyshev"]
    assert [m.name for m in get_metrics(None)] == ["cosine-similarity"]
    with pytest.raises(PTQError, match="unknown metric 'cosin-similarity'.*'cosine-similarity'"):
        get_metrics(["cosin-similarity"])
    with pytest.raises(PTQError, match="no metric given"):
        get_metrics([])


def test_compare_takes_one_metric_name_and_refuses_empty_arrays():
    # "mse" was split into letters ("unknown metric 'm'"); empty arrays read as a perfect match
    r, t = np.arange(4.0), np.arange(4.0) + 0.5
    assert compare(r, t, "mse") == {"mse": pytest.approx(0.25)}
    assert compare(r, t, ("mse", "l1")) == {"mse": pytest.approx(0.25), "l1": pytest.approx(0.5)}
    for name in METRICS:
        with pytest.raises(PTQError, match=r"compare needs arrays holding values, got two of shape \[0\]"):
            compare(np.zeros(0), np.zeros(0), name)


def test_a_metric_named_twice_is_one_metric():
    from pytest_ptq.metrics import get_metrics

    assert [m.name for m in get_metrics(["mse", "mse", "cosine-similarity", "cos"])] == ["mse", "cosine-similarity"]


def test_a_similarity_never_reads_above_one():
    """Two constant tensors of different values: rounding read their cosine 1.0000000000000224."""
    ref, test = np.full(1000, 0.3, np.float32), np.full(1000, 0.3019608, np.float32)
    got = compare(ref, test, ["cosine-similarity", "correlation"])
    assert got == {"cosine-similarity": 1.0, "correlation": 1.0}
