"""Run features compose with layouts, by test (issue 39, item 7): one launch of ``-s zb-auto``
with metrics, TensorBoard, the report, evaluation, clipping, recomputation, checkpoints, bf16 and
document packing all at once, resumed for one more step, asserted feature by feature against
the one-process run of the same features (tests/feature_layout_cases.py).

The suite runs one layout, ``--tp 2`` (four ranks; with ``--dp-shard`` the layout of the
last dead combinations, and the one whose tensors are split inside a layer); all five (pp, dp,
dp_shard, tp and HSDP = dp x dp_shard) cost about five times that, over the suite's budget:
``python benchmarks/feature_layouts.py`` runs every layout with the same checks. No pair is
refused: every feature composes with every layout."""

from __future__ import annotations

import pytest

from conftest import concurrently

pytest.register_assert_rewrite("feature_layout_cases")
from feature_layout_cases import CHECKS, launch, reference, write_inputs  # noqa: E402

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(900)]
SUITE_LAYOUT = "tp"


@pytest.fixture(scope="module")
def launched(tmp_path_factory, forked_cli) -> dict:
    """The suite's layout, first run and resumed, beside the one-process run (each command forked
    from one process that imported torch: conftest.forked_cli)."""
    folder = tmp_path_factory.mktemp("feature_layouts")
    config, tokens = write_inputs(folder)
    jobs = {"reference": lambda: reference(forked_cli, folder, config, tokens),
            SUITE_LAYOUT: lambda: launch(forked_cli, folder, SUITE_LAYOUT, config, tokens)}
    return dict(zip(jobs, concurrently(lambda job: job(), list(jobs.values()), workers=2)))


@pytest.mark.parametrize("feature", CHECKS)
def test_every_feature_holds_on_the_layout_with_all_the_others_on(launched, feature):
    CHECKS[feature](launched[SUITE_LAYOUT], launched["reference"])
