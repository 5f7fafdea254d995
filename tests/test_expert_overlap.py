"""DualPipe's overlap made real (issue 40 item 3): under expert parallelism an ``OVERLAP_F_B``
pair's halves run interleaved at their all-to-alls, one half's exchange in flight while the other
computes (runtime/engine/pair_turns.py, docs/expert-parallel.md).

The promise is bitwise: each half runs the same operations in the same order as when the halves
run one after the other; only when each runs changes. So the comparison is ``torch.equal``, no
tolerance, in float64 and in float32 (where a changed summation order would show at once), on
Mixtral and DeepSeek-V3, with and without recomputation (a recomputed layer's forward, its
exchanges included, is part of the backward half). One 4-rank launch: dualpipev on 2 pipeline x
2 data-parallel ranks, ``--ep 2``. Two steps: the first (it learns the stage sizes, timing each
half apart) runs its pairs one after the other; the second interleaves them, and the weights it
reaches, its loss and its gradients are compared."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import make_batch  # noqa: E402

from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = pytest.mark.torch
STEPS = 2  # the first learns sizes with its pairs in turn, the second interleaves them
BATCHES = [make_batch(step, 8, 16) for step in range(STEPS)]
CASES = [("mixtral", torch.float64, None), ("mixtral", torch.float32, "all"),
         ("deepseek-v3", torch.float64, None), ("deepseek-v3", torch.float32, "all")]
# recomputed in float32 only: the tests' float64-throughout mode (hf_cases.Float64Throughout) and
# torch.utils.checkpoint's rebuild disagree on a tensor's metadata, interleaved or not


def _label(kind, dtype, recompute, interleave) -> str:
    return f"{kind} {str(dtype)[6:]} recompute={recompute} {'interleaved' if interleave else 'in turn'}"


class _Done:
    """An exchange already complete (the turns are the subject here, not the network)."""

    def wait(self) -> None:
        pass


def test_halves_alternate_at_each_exchange_and_every_wait_is_counted():
    from pipesched.runtime.engine.pair_turns import await_exchange, run_interleaved
    from pipesched.runtime.metering.exchange_waits import EXCHANGE_WAITS

    order, ended = [], []

    def half(name: str, exchanges: int):
        def body():
            for i in range(exchanges):
                order.append(f"{name}{i}")
                await_exchange(_Done())
            order.append(f"{name}{exchanges}")
            return name
        return body

    EXCHANGE_WAITS.reset()
    assert run_interleaved(half("F", 2), half("B", 1), 10, ended.append) == ("F", "B")
    # the forward first; each hands over once its exchange started; the backward done, F runs on
    assert order == ["F0", "B0", "F1", "B1", "F2"]
    assert ended == [2, 1] and EXCHANGE_WAITS.count == 3


def test_a_failing_half_lets_the_other_run_to_its_end_then_raises():
    from pipesched.runtime.engine.pair_turns import await_exchange, run_interleaved

    finished = []

    def forward():
        await_exchange(_Done())
        raise ValueError("the forward half failed")

    def backward():
        for _ in range(3):
            await_exchange(_Done())
        finished.append(True)

    with pytest.raises(ValueError, match="the forward half failed"):
        run_interleaved(forward, backward, 10, lambda half: None)
    assert finished == [True]


def test_the_forward_half_computes_under_the_callers_torch_function_modes():
    from hf_cases import Float64Throughout

    from pipesched.runtime.engine.pair_turns import run_interleaved

    with Float64Throughout():  # float32 asked for becomes float64: a mode is thread-local in torch
        made = run_interleaved(lambda: torch.ones(1, dtype=torch.float32).dtype, lambda: None, 10, lambda half: None)
    assert made[0] == torch.float64


@pytest.fixture(scope="module")
def launched():  # the tests using it are slow: a 4-rank launch
    from expert_cases import overlap_runs

    runs = [(_label(*case, interleave), *case, interleave) for case in CASES for interleave in (False, True)]
    return spawn(overlap_runs, 4, {"runs": runs, "batches": BATCHES, "steps": STEPS}, timeout_s=400)[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", CASES, ids=lambda case: " ".join(map(str, case)))
def test_interleaved_pairs_train_bitwise_as_pairs_run_in_turn(launched, case):
    in_turn, interleaved = launched[_label(*case, False)], launched[_label(*case, True)]
    assert in_turn["handed"] == 0  # nothing interleaved: each exchange waited for at once
    assert interleaved["handed"] > 0  # the halves alternated at their exchanges
    assert interleaved["losses"] == in_turn["losses"]
    for what in ("grads", "params"):
        assert interleaved[what].keys() == in_turn[what].keys()
        for name, value in in_turn[what].items():
            assert torch.equal(interleaved[what][name], value), (what, name)
