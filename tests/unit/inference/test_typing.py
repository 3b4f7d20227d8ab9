"""mypy infers the port's output type from the spec alone (tests/typing/inference_types.py, strict).

One mypy run over the typed module plus one misuse: the module's ``assert_type`` checks all pass and
the only errors are the misuse's, so the inferred types are the real ones, not ``Any``.
"""

from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[3]
TYPED = ROOT / "tests" / "typing" / "inference_types.py"

MISUSE = """

async def wrong(inference: Inference) -> str:
    score = await inference.model(FRAUD_SCORER).predict({"amount": 1.0})
    return score.label
"""


def test_the_output_type_is_inferred_from_the_spec_with_no_annotation(tmp_path: Path) -> None:
    checked = tmp_path / "inference_types_misused.py"
    checked.write_text(TYPED.read_text() + MISUSE)
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--strict", str(checked)])
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out + err
    first_misuse_line = len(TYPED.read_text().splitlines()) + 1
    assert all(int(line.split(":")[1]) > first_misuse_line for line in errors), out
    assert any('"FraudScore" has no attribute "label"' in line for line in errors), out
