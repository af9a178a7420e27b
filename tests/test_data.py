"""Calibration data: every accepted layout, validation errors that name the file, and the
promise that the user's files are never written."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import builders
from pytest_ptq.curves import plot_acc_error
from pytest_ptq.data import PTQDataWarning, load_data
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.sensitivity import get_sensitivity_of_nodes


@pytest.fixture(scope="module")
def qm(zoo):
    return QuantModel(zoo.qdq("qdq"))


def _distinct(n, shape=(1, 3, 16, 16)):
    """Samples whose index is readable from their values: sample k is filled around k."""
    rng = np.random.default_rng(5)
    return [(k + 0.01 * rng.standard_normal(shape)).astype(np.float32) for k in range(n)]


def _assert_samples(data, arrays):
    assert len(data) == len(arrays)
    for k, want in enumerate(arrays):
        got = data.sample(k)["x"]
        assert got.shape == (1, 3, 16, 16) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want.reshape(1, 3, 16, 16))


def test_folder_layout_loads_in_numeric_order(qm, tmp_path):
    arrays = _distinct(12)
    builders.save_folder({"x": arrays}, tmp_path)
    names = sorted(p.name for p in (tmp_path / "x").iterdir())
    assert names.index("10.npy") < names.index("2.npy")  # a plain sort would get it wrong
    _assert_samples(load_data(tmp_path, qm), arrays)


def test_samples_saved_without_batch_dim_get_one(qm, tmp_path):
    arrays = _distinct(3)
    builders.save_folder({"x": [a[0] for a in arrays]}, tmp_path)
    _assert_samples(load_data(tmp_path, qm), arrays)


@pytest.mark.parametrize("batched", [True, False])
def test_stacked_npy_per_input(qm, tmp_path, batched):
    arrays = _distinct(5)
    stacked = np.stack(arrays) if batched else np.concatenate(arrays)  # (5, 1, 3, H, W) or (5, 3, H, W)
    np.save(tmp_path / "x.npy", stacked)
    _assert_samples(load_data(tmp_path, qm), arrays)


def test_single_npz(qm, tmp_path):
    arrays = _distinct(4)
    np.savez(tmp_path / "calib.npz", x=np.stack(arrays))
    _assert_samples(load_data(tmp_path / "calib.npz", qm), arrays)


def test_mapping(qm):
    arrays = _distinct(3)
    _assert_samples(load_data({"x": arrays}, qm), arrays)


def test_any_mapping_and_a_list_of_feed_dicts_load_like_a_dict(qm, tmp_path):
    # np.load's archive and a read-only view were refused as "must be a path"
    import types

    arrays = _distinct(3)
    np.savez(tmp_path / "calib.npz", x=np.stack(arrays))
    with np.load(tmp_path / "calib.npz") as archive:
        _assert_samples(load_data(archive, qm), arrays)
    _assert_samples(load_data(types.MappingProxyType({"x": arrays}), qm), arrays)
    _assert_samples(load_data([{"x": a} for a in arrays], qm), arrays)  # what a CalibrationDataReader yields
    with pytest.raises(PTQError, match=r"feed dict 1 holds inputs \['y'\], the first one \['x'\]"):
        load_data([{"x": arrays[0]}, {"y": arrays[1]}], qm)
    with pytest.raises(PTQError, match=r"must be a folder, an .npz file, a mapping .*; pass \{'<input name>': array\} "
                                       "with the samples"):
        load_data(np.stack(arrays), qm)


def test_data_num_takes_the_first_samples(qm, tmp_path):
    arrays = _distinct(11)
    builders.save_folder({"x": arrays}, tmp_path)
    _assert_samples(load_data(tmp_path, qm, data_num=3), arrays[:3])
    with pytest.warns(PTQDataWarning, match="50 calibration samples were asked for, but .* holds 11; all 11 are used"):
        _assert_samples(load_data(tmp_path, qm, data_num=50), arrays)
    with pytest.raises(PTQError, match="data_num must be at least 1"):
        load_data(tmp_path, qm, data_num=0)


def test_a_data_num_warning_names_the_users_line_and_an_engines_own_limit(zoo, tmp_path):
    from pytest_ptq.engine import Engine

    builders.save_folder({"x": _distinct(6)}, tmp_path)
    engine = Engine(str(zoo.qdq("qdq")), tmp_path, data_num=2)
    with pytest.warns(PTQDataWarning, match=r"4 calibration samples were asked for, but 2 of the 6 in .* were kept "
                                            r"\(an earlier data_num\); all 2 are used") as told:
        get_sensitivity_of_nodes(engine, node_type="weight", data_num=4)
    # the test's own line, not a line inside the package (it named sensitivity.py)
    assert [w.filename for w in told] == [__file__]


def test_two_inputs_folder(zoo, tmp_path):
    qm2 = QuantModel(zoo.qdq("two_inputs"))
    data = builders.samples(3, names=("x", "y"))
    builders.save_folder(data, tmp_path)
    loaded = load_data(tmp_path, qm2)
    for k in range(3):
        s = loaded.sample(k)
        np.testing.assert_array_equal(s["x"], data["x"][k])
        np.testing.assert_array_equal(s["y"], data["y"][k])


def _folder(tmp_path, arrays=None, name="x"):
    builders.save_folder({name: arrays if arrays is not None else _distinct(3)}, tmp_path)
    return tmp_path / name


def test_wrong_input_name_names_the_folder(qm, tmp_path):
    _folder(tmp_path, name="images")
    with pytest.raises(PTQError, match=r"model input 'x' \(it has \['images'\]\)"):
        load_data(tmp_path, qm)


def test_extra_input_folder_is_named(qm, tmp_path):
    _folder(tmp_path)
    _folder(tmp_path, name="extra")
    with pytest.raises(PTQError, match="'extra', which is not an input"):
        load_data(tmp_path, qm)


@pytest.mark.parametrize("bad,match", [
    (np.zeros((3, 16), np.float32), "has shape \\(3, 16\\) but the model expects rank 4"),
    (np.zeros((1, 3, 15, 16), np.float32), "dim 2 differs"),
    (np.zeros((1, 3, 16, 16), np.int64), "dtype int64 but the model expects float32"),
])
def test_bad_sample_names_the_file(qm, tmp_path, bad, match):
    d = _folder(tmp_path)
    np.save(d / "1.npy", bad)
    with pytest.raises(PTQError, match=match) as err:
        load_data(tmp_path, qm)
    assert str(d / "1.npy") in str(err.value)


def test_text_samples_are_named_as_not_numbers(qm, tmp_path):
    np.savez(tmp_path / "d.npz", x=np.array(["a.png", "b.png"]))
    with pytest.raises(PTQError, match=r"'.*d.npz:x\[0\]' for input 'x' holds <U5 values, not numbers"):
        load_data(tmp_path / "d.npz", qm)


def test_missing_input_advice_follows_the_layout(qm, tmp_path):
    np.savez(tmp_path / "d.npz", images=np.zeros((2, 1, 3, 16, 16), np.float32))
    with pytest.raises(PTQError, match=r"\['images'\]\); add an array 'x' .* to the archive"):
        load_data(tmp_path / "d.npz", qm)
    with pytest.raises(PTQError, match=r"\['images'\]\); add a key 'x' to the mapping"):
        load_data({"images": _distinct(2)}, qm)


def test_held_out_data_is_called_held_out(zoo, qm, tmp_path):
    """Held-out data read by an analysis is named as such in its messages, not as calibration data."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.verdict import three_configs

    cal = tmp_path / "cal"
    builders.save_folder({"x": _distinct(2)}, cal)
    held = _folder(tmp_path / "held")
    np.save(held / "1.npy", np.zeros((1, 3, 15, 16), np.float32))
    with pytest.raises(PTQError, match=r"^held-out sample '.*1.npy' for input 'x' has shape") as err:
        engine = Engine(zoo.qdq("qdq"), cal)
        three_configs(engine, parse_outputs(None, engine.qmodel), heldout=tmp_path / "held")
    assert "calibration" not in str(err.value)


def test_corrupt_npy_names_the_file(qm, tmp_path):
    d = _folder(tmp_path)
    (d / "2.npy").write_bytes(b"\x93NUMPY garbage \x00\x01\x02" * 7)
    with pytest.raises(PTQError, match="not a readable .npy") as err:
        load_data(tmp_path, qm)
    assert str(d / "2.npy") in str(err.value)


def test_ragged_samples_saved_as_an_object_array_are_told_to_go_one_file_a_sample(tmp_path):
    """np.save and np.savez keep samples of different lengths as a pickled object array: they
    read "not a readable .npy array (ValueError); re-save it with numpy.save", which is what
    the user did. Nothing is unpickled; the layout the sentence names loads them."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, t, 16)).astype(np.float32) for t in (5, 12, 7)]
    ragged = np.empty(len(xs), dtype=object)
    ragged[:] = xs
    (tmp_path / "stacked").mkdir()
    np.save(tmp_path / "stacked" / "x.npy", ragged, allow_pickle=True)
    np.savez(tmp_path / "data.npz", x=ragged)
    for data, where in [("stacked", "file '{}'".format(tmp_path / "stacked" / "x.npy")),
                        ("data.npz", "data '{}', key 'x',".format(tmp_path / "data.npz"))]:
        with pytest.raises(PTQError) as err:
            load_data(tmp_path / data)
        text = str(err.value)
        assert text.startswith(f"calibration {where} holds an object array") and "readable" not in text, text
        assert "samples of different shapes" in text and "DIR/<input>/0.npy" in text and "\n" not in text
    builders.save_folder({"x": xs}, tmp_path / "per")
    loaded = load_data(tmp_path / "per")
    for k, want in enumerate(xs):
        np.testing.assert_array_equal(loaded.sample(k)["x"], want)


def test_missing_and_empty_folders(qm, tmp_path):
    with pytest.raises(PTQError, match="does not exist") as err:
        load_data(tmp_path / "nowhere", qm)
    assert str(tmp_path / "nowhere") in str(err.value)
    (tmp_path / "x").mkdir()
    with pytest.raises(PTQError, match="holds no .npy files") as err:
        load_data(tmp_path, qm)
    assert str(tmp_path / "x") in str(err.value)


@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_nan_or_inf_names_the_file(zoo, tmp_path, bad_value):
    arrays = _distinct(4)
    arrays[2][0, 1, 3, 3] = bad_value
    d = _folder(tmp_path, arrays)
    data = load_data(tmp_path, QuantModel(zoo.qdq("qdq")))
    data.sample(1)
    with pytest.raises(PTQError, match="holds 1 NaN/Inf values") as err:
        data.sample(2)
    assert str(d / "2.npy") in str(err.value)
    # the same sentence reaches the user of an analysis, not an onnxruntime traceback
    with pytest.raises(PTQError, match="2.npy"):
        get_sensitivity_of_nodes(zoo.qdq("qdq"), calibrated_data=tmp_path, node_type="activation")


def _fingerprint(paths):
    return {str(p): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths}


def test_user_files_are_never_written(zoo, tmp_path):
    user = tmp_path / "user"
    data_dir = builders.save_folder(builders.samples(3), user / "calib")
    model = user / "model.onnx"
    model.write_bytes(zoo.qdq("default").read_bytes())
    fmodel = user / "float.onnx"
    fmodel.write_bytes(zoo.float("default").read_bytes())
    files = sorted(p for p in user.rglob("*") if p.is_file())
    before = _fingerprint(files)
    get_sensitivity_of_nodes(model, ["cosine-similarity", "mse"], data_dir, node_type="weight",
                             float_model=fmodel)
    plot_acc_error(tmp_path / "out", data_dir, model, quantize_node=["weight", "activation"],
                   float_model=fmodel, progress=False)
    assert sorted(p for p in user.rglob("*") if p.is_file()) == files
    assert _fingerprint(files) == before


def test_a_scalar_input_stays_a_scalar(tmp_path):
    # y = Relu(Conv(x) * gain), gain a rank-0 input (as a sample rate or a threshold is)
    from onnx import TensorProto, helper, numpy_helper

    from pytest_ptq.engine import Engine

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Mul", ["c", "gain"], ["m"], name="mul"),
         helper.make_node("Relu", ["m"], ["y"], name="relu")], "scalar_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("gain", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    fpath = builders.save_model(graph, tmp_path / "float.onnx")
    data = {"x": [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(3)],
            "gain": [np.array(g, np.float32) for g in (0.5, 1.0, 2.0)]}
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data)
    folder = builders.save_folder(data, tmp_path / "calib")
    qm = QuantModel(str(qpath))
    for loaded in (load_data(folder), load_data(folder, qm), load_data(data, qm)):
        assert [loaded.sample(k)["gain"].shape for k in range(3)] == [(), (), ()]
    for source in (folder, data):  # the engine, against plain sessions on the file and the float model
        engine = Engine(str(qpath), source, float_model=str(fpath))
        for k in range(3):
            feeds = {"x": data["x"][k], "gain": data["gain"][k]}
            np.testing.assert_allclose(engine.run(k, "all")["y"], builders.run_model(qpath, [feeds])[0]["y"],
                                       atol=1e-6)
            np.testing.assert_allclose(engine.run(k, ())["y"], builders.run_model(fpath, [feeds])[0]["y"],
                                       atol=1e-5)


def test_an_input_name_with_a_slash_saved_as_folders_is_told_to_use_an_npz(tmp_path):
    """DIR/<input>/<i>.npy for an input named 'serving_default/input_1:0' nests a folder: the
    sentence names it and the layout that holds such a name."""
    (tmp_path / "data" / "serving_default" / "input_1:0").mkdir(parents=True)
    np.save(tmp_path / "data" / "serving_default" / "input_1:0" / "0.npy", np.zeros((1, 3), np.float32))
    with pytest.raises(PTQError, match=r"holds no \.npy files but a folder of them \('serving_default/input_1:0'\): "
                                       r"an input name with a '/'.*save the data as an \.npz"):
        load_data(tmp_path / "data")


def test_integer_samples_beyond_the_input_type_are_refused_not_wrapped(tmp_path):
    """An int64 sample for an int32 input was cast silently, and values beyond int32 wrapped
    around to other token ids."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "emb")
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="matmul")], "ids_input",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])], [emb, w])
    fpath = builders.save_model(graph, tmp_path / "float.onnx")
    data = {"ids": [rng.integers(0, 10, (1, 4)).astype(np.int32) for _ in range(3)]}
    qm = QuantModel(str(builders.quantize(fpath, tmp_path / "qdq.onnx", data)))
    fits = load_data({"ids": [a.astype(np.int64) for a in data["ids"]]}, qm).sample(1)["ids"]
    assert fits.dtype == np.int32 and np.array_equal(fits, data["ids"][1])
    wide = [a.astype(np.int64) for a in data["ids"]]
    wide[2][0, 1] = 2**32 + 3  # as int32: 3, another id
    with pytest.raises(PTQError, match=r"sample .* for input 'ids' holds values \d+\.\.4294967299 \(int64\), beyond "
                                       r"the int32 the model takes"):
        load_data({"ids": wide}, qm).sample(2)


def test_a_suffix_in_capitals_is_a_sample_and_what_cannot_be_read_as_one_is_refused(qm, tmp_path):
    """Every file of a sample folder is a sample or refused, never skipped: the samples used
    would differ from those given, with nothing said."""
    arrays = _distinct(4)
    builders.save_folder({"x": arrays}, tmp_path)
    (tmp_path / "x" / "3.npy").rename(tmp_path / "x" / "3.NPY")
    _assert_samples(load_data(tmp_path, qm), arrays)
    for make, name in ((lambda p: os.mkfifo(p), "4.npy"), (lambda p: os.symlink("/dev/zero", p), "4.npy"),
                       (lambda p: os.symlink("gone.npy", p), "4.npy"), (lambda p: p.mkdir(), "4.npy")):
        make(tmp_path / "x" / name)
        with pytest.raises(PTQError, match="is not a regular file") as err:
            load_data(tmp_path, qm)
        assert str(tmp_path / "x" / name) in str(err.value)
        p = tmp_path / "x" / name
        p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
    np.save(tmp_path / "x.npy", np.stack(arrays))  # the same input stacked beside its folder
    with pytest.raises(PTQError, match="has both a folder 'x' and a file 'x.npy' for input 'x'"):
        load_data(tmp_path, qm)


def test_held_out_data_that_are_the_calibration_data_are_refused(tmp_path):
    import shutil

    from pytest_ptq.cli import main

    data = builders.samples(4)
    builders.save_folder(data, tmp_path / "calib")
    q = builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data)
    calib = load_data(tmp_path / "calib")
    shutil.copytree(tmp_path / "calib", tmp_path / "copy")
    (tmp_path / "link").symlink_to(tmp_path / "calib")
    for same in ("calib", "copy", "link"):
        with pytest.raises(PTQError, match=rf"the held-out data '.*{same}' are the calibration data '.*calib': figures "
                           "on them would be labelled held out"):
            load_data(tmp_path / same, role="held-out", calibration=calib)
    builders.save_folder(builders.samples(4, seed=9), tmp_path / "held")
    assert len(load_data(tmp_path / "held", role="held-out", calibration=calib)) == 4
    # every face that takes held-out data
    assert main(["runall", str(q), str(tmp_path / "calib"), "--heldout", str(tmp_path / "copy"), "--quiet",
                 "-s", str(tmp_path / "out")]) == 2
    assert main(["suggest", str(q), str(tmp_path / "calib"), "--heldout", str(tmp_path / "link"), "--quiet",
                 "--no-save"]) == 2
    assert main(["check-data", str(q), str(tmp_path / "calib"), "--holdout", str(tmp_path / "copy")]) == 2


@pytest.mark.parametrize("name,match", [
    ("4.npz", "'.*4.npz' is not a .npy sample"),
    ("4.bin", "'.*4.bin' is not a .npy sample"),
    ("4.png", "'.*4.png' is an image, not the array the model takes"),
])
def test_a_sample_saved_in_another_form_beside_npy_samples_is_refused_not_left_out(qm, tmp_path, name, match):
    # 0..3.npy and 4.npz ran on 4 of the 5 samples given, with nothing said
    arrays = _distinct(5)
    builders.save_folder({"x": arrays[:4]}, tmp_path)
    (tmp_path / "x" / name).write_bytes(arrays[4].tobytes())
    (tmp_path / "x" / "README.txt").write_text("what these samples are")  # notes stay allowed
    with pytest.raises(PTQError, match=match + ".*sample 4 would be left out"):
        load_data(tmp_path, qm)
    (tmp_path / "x" / name).unlink()
    # beside the samples they are of, originals and sidecars are no samples left out
    for kept in ("2.png", "labels.pkl", "3.bin"):
        (tmp_path / "x" / kept).write_bytes(b"kept beside")
    _assert_samples(load_data(tmp_path, qm), arrays[:4])


def test_the_sample_number_is_the_run_of_digits_that_tells_the_files_apart(qm, tmp_path):
    # 'cam1_0.npy', 'cam1_1.npy' read as two files for sample 1
    arrays = _distinct(11)
    (tmp_path / "x").mkdir()
    for k, a in enumerate(arrays):
        np.save(tmp_path / "x" / f"2024_cam1_frame{k}.npy", a)
    _assert_samples(load_data(tmp_path, qm), arrays)
    for f in (tmp_path / "x").iterdir():  # a run that varies first wins: the frame, not the version
        f.rename(f.with_name(f.name.replace("2024_cam1_frame", "f").replace(".npy", "_v2.npy")))
    _assert_samples(load_data(tmp_path, qm), arrays)


def test_a_calibration_data_reader_or_an_iterator_of_feed_dicts_is_read_once(qm):
    from onnxruntime.quantization import CalibrationDataReader

    arrays = _distinct(3)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rewind()

        def get_next(self):
            return next(self.it, None)

        def rewind(self):
            self.it = iter({"x": a} for a in arrays)

    reader = Reader()
    list(iter(reader.get_next, None))  # the quantizer read it to the end
    _assert_samples(load_data(reader, qm), arrays)
    assert reader.get_next() is not None  # rewound for its next use
    _assert_samples(load_data(({"x": a} for a in arrays), qm), arrays)

    class OneShot:  # no rewind: read to the end, it yields nothing
        def get_next(self):
            return None

    with pytest.raises(PTQError, match="reader OneShot yielded no sample .* give it a rewind"):
        load_data(OneShot(), qm)
    with pytest.raises(PTQError, match=r"yielded array\(.*\), not a feed dict"):
        load_data(iter(arrays), qm)

    def endless():
        while True:
            yield {"x": arrays[0]}

    assert len(load_data(endless(), qm, data_num=2)) == 2  # read as far as asked, not forever

    class Stuck(Reader):  # a user's reader whose rewind() fails: what it still yields is read
        def rewind(self):
            raise NotImplementedError("this reader cannot rewind")

    stuck = Stuck.__new__(Stuck)
    stuck.it = iter({"x": a} for a in arrays)
    _assert_samples(load_data(stuck, qm), arrays)  # read from where it stands


def test_a_batch_given_to_a_batch_one_model_is_told_as_such(qm):
    with pytest.raises(PTQError, match=r"holds a batch of 4 but the model takes one at a time \(\[1, 3, 16, 16\]\)"):
        load_data({"x": [np.concatenate(_distinct(4))]}, qm)


def test_data_for_an_input_with_a_stored_value_is_told_it_stays_as_calibrated(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pytest_ptq.model import QuantModel as QM

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sc", "zp"], ["xd"]),
             helper.make_node("Mul", ["xd", "s"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "sc"),
             numpy_helper.from_array(np.array(0, np.uint8), "zp"),
             numpy_helper.from_array(np.array([2.0], np.float32), "s")]
    graph = helper.make_graph(nodes, "g", [x, s], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    model = QM(str(tmp_path / "m.onnx"))
    with pytest.raises(PTQError, match="samples for 's', an input of .* with a stored value .* remove it from the data"):
        load_data({"x": [np.ones((1, 4), np.float32)], "s": [np.ones(1, np.float32)]}, model)


def _conv_pair_with_input(tmp_path, edit):
    """conv_net's float model and its quantize_static file, each with ``edit(input's tensor
    type)`` applied, and their samples."""
    import onnx

    data = builders.samples(3)
    f = builders.conv_net(tmp_path / "f.onnx")
    q = builders.quantize(f, tmp_path / "q.onnx", data)
    for path in (f, q):
        model = onnx.load(path)
        edit(model.graph.input[0].type.tensor_type)
        onnx.save(model, path)
    return f, q, data


def test_a_batch_declared_as_minus_one_is_left_open_as_onnxruntime_reads_it(tmp_path):
    # Paddle's exports (PP-OCR's classifier) write dim_value -1 for a dynamic batch: batch-1
    # samples were refused ("expects [-1, 3, 16, 16] (dim 0 differs)")
    from pytest_ptq.engine import Engine

    f, q, data = _conv_pair_with_input(tmp_path, lambda t: setattr(t.shape.dim[0], "dim_value", -1))
    engine = Engine(str(q), data, float_model=str(f))
    feeds = {"x": data["x"][1]}
    np.testing.assert_array_equal(engine.run(1, "all")["prob"], builders.run_model(q, feeds)["prob"])
    with pytest.raises(PTQError, match=r"expects rank 4 \(\[\?, 3, 16, 16\]\)"):
        load_data({"x": [np.zeros((16, 16), np.float32)]}, QuantModel(str(q)))


def test_an_input_that_declares_no_shape_takes_samples_of_any_rank(tmp_path):
    # a value info with a type and no shape field means "any rank" (legal ONNX); it was read as
    # rank 0 and every sample refused ("the model expects rank 0 ([])")
    from pytest_ptq.datacheck import check_data

    f, q, data = _conv_pair_with_input(tmp_path, lambda t: t.ClearField("shape"))
    node = "c2_QuantizeLinear"
    from pytest_ptq.engine import Engine

    engine = Engine(str(q), data, float_model=str(f), optimization="disable")
    got = get_sensitivity_of_nodes(engine, ["mse"], node_type="activation", interested_nodes=[node])
    feeds = [{"x": a} for a in data["x"]]
    ref = np.concatenate([o["prob"].ravel() for o in builders.run_model(builders.rewire(q, float_model=f), feeds)])
    test = np.concatenate([o["prob"].ravel() for o in builders.run_model(builders.rewire(q, keep={node}, float_model=f),
                                                                           feeds)])
    want = np.mean((test.astype(np.float64) - ref) ** 2)
    # the error's RMS moves by at most the float32 summation-order difference (test_sensitivity's DELTA)
    assert want > 0 and abs(np.sqrt(got[node]["mse"]) - np.sqrt(want)) <= 2e-7
    # check-data takes any rank too, and samples of several sizes run one at a time, not refused
    report = check_data(str(q), data, heldout=builders.samples(2, seed=9))
    assert report.quantized is not None and not [x for x in report.findings if x.severity == "error"]
    mixed = {"x": data["x"][:2] + builders.samples(1, size=20)["x"]}
    shape = next(x for x in check_data(str(q), mixed).findings if x.check == "shape")
    assert shape.severity == "info" and "declares no shape for 'x'" in shape.message



def test_samples_of_different_ranks_for_an_input_of_no_shape_are_told_without_a_shape_it_lacks(tmp_path):
    """A Q/DQ pair before ReduceMean(keepdims=0) takes any rank, and the model declares none:
    samples of ranks 3 and 2 were told to take "the model's input shape", which it does not
    declare. The finding names the ranks (numpy's), and what it says runs them does: the
    ranking of the pair matches a plain session on each sample."""
    import onnx
    from onnx import TensorProto, helper

    from pytest_ptq.datacheck import check_data
    from pytest_ptq.engine import Engine

    inits, nodes = [], []
    x = builders.add_pair(inits, nodes, "x", 0.02, np.uint8(128))
    nodes.append(helper.make_node("ReduceMean", [x], ["y"], keepdims=0, name="mean"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    q = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), q)
    rng = np.random.default_rng(0)
    data = {"x": [rng.standard_normal(s).astype(np.float32) for s in ((1, 3, 4), (1, 3, 4), (1, 5))]}
    shape = next(f for f in check_data(str(q), data).findings if f.check == "shape")
    ranks = sorted({a.ndim for a in data["x"]})
    assert f"samples have different ranks ({ranks[0]} and {ranks[1]}" in shape.message, shape.message
    assert "declares no shape for 'x'" in shape.message and "model's input shape" not in shape.fix, shape.fix
    assert len(shape.samples) == 1 and shape.severity == "warning"
    # the rankings run each sample: x_Q's error as a plain session gives it, pair kept or bypassed
    feeds = [{"x": a} for a in data["x"]]
    got = get_sensitivity_of_nodes(Engine(str(q), data), ["mse"], node_type="activation")
    test = np.array([builders.run_model(q, f)["y"] for f in feeds], np.float64)
    ref = np.array([builders.run_model(builders.rewire(q), f)["y"] for f in feeds], np.float64)
    want = np.mean((test - ref) ** 2)
    assert want > 0 and got["x_Q"]["mse"] == pytest.approx(want, rel=1e-4)

def test_a_dimension_declared_zero_is_a_size_as_onnxruntime_reads_it():
    from onnx import TensorProto, helper

    from pytest_ptq.model.graph import declared_dims

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    value.type.tensor_type.shape.dim[0].dim_value = -1
    value.type.tensor_type.shape.dim[2].dim_value = 0
    value.type.tensor_type.shape.dim[3].dim_param = "w"
    assert declared_dims(value) == [None, 3, 0, None]
    assert declared_dims(helper.make_tensor_value_info("s", TensorProto.FLOAT, None)) is None


def test_a_sample_empty_in_every_input_is_refused_and_an_empty_past_is_not(tmp_path):
    """A sample of shape [1, 0, 8] in every input calibrates nothing, and every metric on it
    read perfect (stages printed 1.000000 and passed); a decoder's empty past beside tokens
    holding values is a normal sample and runs as a plain session runs it."""
    from onnx import TensorProto, helper, numpy_helper

    from pytest_ptq.datacheck import check_data
    from pytest_ptq.engine import Engine

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past", "x"], ["c"], axis=1, name="concat"),
         helper.make_node("MatMul", ["c", "w"], ["m"], name="matmul"),
         helper.make_node("Relu", ["m"], ["y"], name="relu")], "with_past",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, "P", 8]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", 8])], [w])
    fpath = builders.save_model(graph, tmp_path / "float.onnx")

    def arrays(past, tokens, n=3):
        return [rng.standard_normal((1, past, 8)).astype(np.float32) for _ in range(n)], \
            [rng.standard_normal((1, tokens, 8)).astype(np.float32) for _ in range(n)]

    past, x = arrays(2, 3)
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", {"past": past, "x": x})
    qm = QuantModel(str(qpath))
    past, x = arrays(0, 3)
    first = {"past": past, "x": x}
    engine = Engine(str(qpath), first)
    for k in range(3):
        np.testing.assert_allclose(engine.run(k, "all")["y"],
                                   builders.run_model(qpath, [{"past": past[k], "x": x[k]}])[0]["y"], atol=1e-6)
    past, x = arrays(0, 0)
    folder = builders.save_folder({"past": past[:1] + first["past"][1:], "x": x[:1] + first["x"][1:]},
                                  tmp_path / "calib")
    with pytest.raises(PTQError, match=r"calibration sample '.*past/0\.npy, .*x/0\.npy' holds no values \(every "
                                       r"input has a dimension of size 0\); drop it"):
        load_data(folder, qm)
    findings = [f for f in check_data(str(qpath), str(folder)).findings if f.check == "empty"]
    assert [(f.severity, len(f.samples)) for f in findings] == [("error", 1)]


def test_an_evaluation_function_editing_its_feeds_changes_no_other_pass_nor_the_callers_arrays(zoo, tmp_path):
    """Samples of a stacked .npz or of arrays in memory were views: an evaluation function
    centring its feeds in place (x -= 0.5) shifted the quantized pass's inputs again, every
    later check's and the caller's own arrays, and a later accuracy check passed a model it
    failed alone."""
    from pytest_ptq.analysis import Analysis, AnalysisKey
    from pytest_ptq.engine import Engine

    arrays = [a * 0.1 for a in _distinct(4)]
    kept = [a.copy() for a in arrays]
    np.savez(tmp_path / "calib.npz", x=np.concatenate(arrays))

    def centred(run, data):
        means = []
        for feeds in data:
            feeds["x"] -= 0.5
            means.append(np.mean([v.mean() for v in run(feeds).values()]))
        return float(np.mean(means))

    def expected(path):  # the same figure from plain sessions on inputs centred once
        return float(np.mean([np.mean([v.mean() for v in r.values()])
                              for r in builders.run_model(path, [{"x": a - 0.5} for a in kept])]))

    analysis = Analysis(AnalysisKey(str(zoo.qdq()), str(tmp_path / "calib.npz"), str(zoo.float())), tmp_path)
    want = (pytest.approx(expected(zoo.float()), abs=1e-5), pytest.approx(expected(zoo.qdq()), abs=1e-5))
    assert analysis.accuracy(centred)[:2] == want and analysis.accuracy(centred)[:2] == want
    engine = Engine(str(zoo.qdq()), {"x": arrays})
    assert centred(lambda feeds: engine.run(feeds, "all"), engine.data) == want[1]
    for a, k in zip(arrays, kept):
        np.testing.assert_array_equal(a, k)


@pytest.mark.parametrize("name", ["x.npy", "missing"])
def test_load_data_refuses_what_is_not_data_in_the_sentence_of_the_start_up_check(tmp_path, name):
    """load_data had its own 'neither a folder nor an .npz' rule and sentence beside
    params.data_path's (the start-up check of --ptq-data): one rule, one sentence."""
    from pytest_ptq import params

    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, np.zeros((2, 3), np.float32))
    with pytest.raises(PTQError) as said:
        params.data_path(path, "held-out data")
    with pytest.raises(PTQError) as exc:
        load_data(path, role="held-out")
    assert str(exc.value) == str(said.value)
