"""The validator names what is broken; the deadlock check names who waits for what."""

from __future__ import annotations

import pytest

from pipesched import DeadlockError, Schedule, ScheduleError, validate


def csv(text: str) -> Schedule:
    return Schedule.from_csv(text)


def test_a_correct_schedule_passes():
    validate(csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("0F0,0B0,0F0\n1F0,1B0\n", "runs 0F0 twice"),
        ("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "stage 0 for microbatch 1"),
        ("0F0,0B0,0I0,0W0\n1F0,1B0\n", "both 0B0 and a split backward"),
        ("0F0,0I0\n1F0,1B0\n", "missing 0W0"),
        ("0B0,0F0\n1F0,1B0\n", "runs 0B0 before its forward 0F0"),
        ("0F0,0W0,0I0\n1F0,1B0\n", "runs 0W0 before 0I0"),
        ("0F0,0B0\n1F1,1B1\n", "rank 0 never runs 0F1"),
    ],
)
def test_structural_errors_name_rank_and_action(text, message):
    with pytest.raises(ScheduleError, match=message):
        validate(csv(text))


def test_crossed_backwards_deadlock_and_the_error_names_the_waiters():
    # rank 1 insists on the backward of microbatch 1 first, rank 0's backward of 0 waits on it,
    # while rank 1 waits for F1, which rank 0 only sends after its backward of 0.
    text = "0F0,0B0,0F1,0B1\n1F0,1F1,1B1,1B0\n"
    with pytest.raises(DeadlockError) as err:
        validate(csv(text))
    message = str(err.value)
    assert "rank 0 waits at 0B0 for 1B0 (rank 1)" in message
    assert "rank 1 waits at 1F1 for 0F1 (rank 0)" in message


def test_deadlock_is_a_schedule_error_and_a_value_error():
    assert issubclass(DeadlockError, ScheduleError)
    assert issubclass(ScheduleError, ValueError)


def test_a_finished_costed_run_is_the_deadlock_check_and_a_deadlock_still_raises():
    # whether ranks can move depends on which actions ended, never when: a run under any costs
    # that finished proves the programs free of deadlock, so validate makes no unit-cost run
    from pipesched import Costs, simulate
    from pipesched.validate import UNIT_RUN

    good = csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    simulate(good, Costs(F=1, B=2, W=1, comm=0.5))
    assert validate(good) is good and UNIT_RUN not in good.derived
    for costs in (None, Costs(F=1, B=2, W=1, comm=0.5)):
        with pytest.raises(DeadlockError, match="rank 1 waits at 1F1 for 0F1"):
            simulate(csv("0F0,0B0,0F1,0B1\n1F0,1F1,1B1,1B0\n"), costs)
