"""Seed 001's story on the real models, with the plugin's Python helpers.

The YAML contracts beside this file hold the accuracy contracts; these tests show the same
checks from Python (the ``ptq`` fixture and marker) and pin the middle of the story: the
sensitivity ranking of the naive model names the nodes that the fix changes.
"""

import json
from pathlib import Path

import pytest
from tasks import class_agreement, text_mask_iou

FIXES = json.loads((Path(__file__).parent / "fixes.json").read_text())
CLS = ".cache/ppocr_mobile_v2_cls"
DET = ".cache/ppocrv4_det"


# data_num as in the YAML contracts: the same analysis (engine, float reference, the report's
# sensitivity table) then serves both
@pytest.mark.ptq(model=f"{CLS}/fixed_model.onnx", data=f"{CLS}/calibration_data", data_num=16,
                 holdout=f"{CLS}/heldout_data", float_model=f"{CLS}/float_model.onnx")
def test_classifier_fix_meets_the_contract(ptq):
    ptq.assert_outputs(0.99)
    ptq.assert_accuracy(class_agreement, min_ratio=0.9)


@pytest.mark.ptq(model=f"{DET}/fixed_model.onnx", data=f"{DET}/calibration_data", data_num=4,
                 holdout=f"{DET}/heldout_data", float_model=f"{DET}/float_model.onnx")
def test_detector_fix_meets_the_contract(ptq):
    ptq.assert_outputs(0.95)
    ptq.assert_accuracy(text_mask_iou, min_ratio=0.9)


@pytest.mark.xfail(strict=True, reason="naive per-tensor int8: the classifier's direction agrees with "
                                       "float on 77.5% of held-out crops, below the contract's 90%")
@pytest.mark.ptq(model=f"{CLS}/calibrated_model.onnx", data=f"{CLS}/calibration_data", data_num=16,
                 holdout=f"{CLS}/heldout_data", float_model=f"{CLS}/float_model.onnx")
def test_naive_classifier_falls_short(ptq):
    ptq.assert_accuracy(class_agreement, min_ratio=0.9)


@pytest.mark.parametrize("model, data_num, top", [("ppocr_mobile_v2_cls", 16, 10), ("ppocrv4_det", 4, 10)])
def test_ranking_names_the_culprits(ptq_session, model, data_num, top):
    """The first nodes the remedy search kept come from the top of the naive model's ranking."""
    here = Path(__file__).parent / ".cache" / model
    analysis = ptq_session.analysis(here / "calibrated_model.onnx", here / "calibration_data",
                                    here / "float_model.onnx", data_num)
    ranking = []
    for kind in ("weight", "activation"):
        ranking += list(analysis.sensitivity(node_type=kind).items())
    ranking.sort(key=lambda item: item[1]["cosine-similarity"])
    top_nodes = [name for name, _ in ranking[:top]]
    culprits = FIXES[model]["nodes"][:3]
    assert set(culprits) <= set(top_nodes), (culprits, top_nodes)
