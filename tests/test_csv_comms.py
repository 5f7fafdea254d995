"""torch's compute_comms CSV: each rank's program written, read back, and checked against its schedule.

torch itself loading and training from these files is in test_torch_program.py.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

import pipesched
from pipesched import ConfigError, CSVFormatError
from pipesched.runtime.program.program import lower_all
from pipesched.schedule_files import csv_text, load_csv_file, parse_csv


def _built(ranks=4, microbatches=8):
    for family in pipesched.families():
        try:
            yield pipesched.build_schedule(family.name, ranks, microbatches)
        except ConfigError:
            pass


@pytest.mark.parametrize("schedule", list(_built()), ids=lambda s: s.name)
def test_every_family_round_trips_through_its_program(schedule):
    text = csv_text(schedule, "compute_comms")
    back = parse_csv(text)
    assert [back.rank_entries(r) for r in range(back.ranks)] == [schedule.rank_entries(r) for r in range(schedule.ranks)]
    assert (back.placement, back.pipelines, back.microbatches) == (schedule.placement, schedule.pipelines, schedule.microbatches)
    rows = text.splitlines()
    assert rows == [",".join(p.cells()) for p in lower_all(schedule)]
    assert all(cell for row in rows for cell in row.split(","))  # torch's loader takes no empty cell
    assert csv_text(back, "compute_comms") == text


def test_compute_only_stays_the_default_and_both_formats_read_back():
    schedule = pipesched.build_schedule("zb-h1", 2, 4)
    assert csv_text(schedule) == schedule.to_csv()
    assert "SEND" not in csv_text(schedule) and "0SEND_F0" in csv_text(schedule, "compute_comms")
    assert parse_csv(csv_text(schedule)).orders == schedule.orders
    with pytest.raises(ConfigError, match="--format 'both' is not known: use one of compute_only, compute_comms"):
        csv_text(schedule, "both")


ONE_F_ONE_B = csv_text(pipesched.build_schedule("1f1b", 2, 4), "compute_comms")


@pytest.mark.parametrize(
    "edit, message",
    [
        (("0RECV_B0,", ""), "rank 1 sends the input gradient of stage 1 microbatch 0 to rank 0, which never receives it"),
        (("1SEND_B0,", ""), "rank 0 receives the input gradient of stage 1 microbatch 0 from rank 1, which never sends it"),
        (("0F0,0SEND_F0", "0SEND_F0,0F0"), "rank 0 sends the activation of stage 0 microbatch 0 before the action"),
        (("0SEND_F0,", "0SEND_B0,"), "0SEND_B0 carries no message"),
        ((",0REDUCE_GRAD", ""), "rank 0 never reduces the gradients of stages [0]"),
        (("0REDUCE_GRAD", "0REDUCE_GRAD0"), "REDUCE_GRAD names a stage and no microbatch"),
        (("1RECV_F0", "1RECV_F"), "RECV_F needs a microbatch"),
        (("1RECV_F1,", ""), "rank 0 sends the activation of stage 0 microbatch 1 to rank 1, which never receives it"),
        (("0RECV_B0,0B0", "0B0,0RECV_B0"), "rank 0 runs 0B0 before receiving its input"),
        (("1F1,", "1F1,1X1,"), "row 2 (rank 1), cell"),
    ],
)
def test_a_program_that_is_not_its_schedules_is_refused_naming_why(edit, message):
    old, new = edit
    assert old in ONE_F_ONE_B
    with pytest.raises(CSVFormatError) as err:
        parse_csv(ONE_F_ONE_B.replace(old, new, 1))
    assert message in str(err.value)


def test_a_receive_posted_before_the_send_it_waits_behind_is_a_hang():
    rows = ONE_F_ONE_B.splitlines()
    cells = rows[0].split(",")
    cells.remove("0RECV_B0")
    rows[0] = ",".join(["0RECV_B0"] + cells)
    with pytest.raises(CSVFormatError, match="program hangs: rank 0 waits at 0RECV_B0"):
        parse_csv("\n".join(rows) + "\n")


def test_gathers_are_instructions_checked_like_the_others():
    assert ONE_F_ONE_B.startswith("0UNSHARD,0F0,") and ",0REDUCE_GRAD,0RESHARD" in ONE_F_ONE_B
    without = ONE_F_ONE_B.replace("0UNSHARD,", "", 1)
    with pytest.raises(CSVFormatError, match="rank 0 runs 0F0 while stage 0 is not gathered"):
        parse_csv(without)
    with pytest.raises(CSVFormatError, match="0RESHARD while stage 0 is not gathered"):
        parse_csv(ONE_F_ONE_B.replace("0REDUCE_GRAD,0RESHARD", "0REDUCE_GRAD,0RESHARD,0RESHARD", 1))
    with pytest.raises(CSVFormatError, match="1UNSHARD names stage 1, which runs on rank 1"):
        parse_csv(ONE_F_ONE_B.replace("0UNSHARD,", "0UNSHARD,1UNSHARD,", 1))


def test_export_compute_comms_then_simulate_draw_and_train_read_it_back(tmp_path):
    target = tmp_path / "zbv.csv"
    out = run_cli("export", "zb-v", "-p", "2", "-m", "4", "--format", "compute_comms", "-o", str(target))
    assert out.returncode == 0, out.stderr
    assert target.read_text().startswith("0UNSHARD,3UNSHARD,0F0,0SEND_F0,")
    assert load_csv_file(target).orders == pipesched.build_schedule("zb-v", 2, 4).orders
    loaded = run_cli("simulate", "--csv", str(target), "--json")
    built = run_cli("simulate", "zb-v", "-p", "2", "-m", "4", "--json")
    assert loaded.returncode == 0, loaded.stderr
    assert {**json.loads(loaded.stdout), "schedule": "zb-v"} == json.loads(built.stdout)
    drawn = run_cli("draw", "--csv", str(target), "-o", str(tmp_path / "zbv.svg"))
    assert drawn.returncode == 0, drawn.stderr
    trained = run_cli("train", "--csv", str(target), "--ranks", "2", "--microbatches", "6")
    assert trained.returncode == 2 and "zbv.csv has 4 microbatches but --microbatches is 6" in trained.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["export", "1f1b", "--format", "comms"], "--format 'comms' is not known: use one of compute_only, compute_comms"),
        (["export", "1f1b", "--format", "compute_comms", "--torchtitan", "-o", "x.csv"], "--torchtitan needs --format compute_only"),
    ],
)
def test_bad_format_flags_are_one_line_and_exit_2(args, message):
    out = run_cli(*args)
    assert out.returncode == 2 and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_bad_compute_comms_file_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(ONE_F_ONE_B.replace("0RECV_B0,", "", 1))
    out = run_cli("simulate", "--csv", str(path))
    assert out.returncode == 2
    assert out.stderr.startswith("pipesched: error: the compute_comms CSV's communication is not its schedule's")
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_compute_only_order_with_torchs_reductions_reads_as_its_compute_actions():
    schedule = pipesched.build_schedule("1f1b", 2, 3)
    rows = [row + ",0REDUCE_GRAD" if r == 0 else row + ",1REDUCE_GRAD" for r, row in enumerate(schedule.to_csv().splitlines())]
    assert parse_csv("\n".join(rows) + "\n").orders == schedule.orders


def test_a_compute_only_order_keeps_the_gathers_it_places_and_refuses_them_misplaced():
    schedule = pipesched.build_schedule("1f1b", 2, 3)
    rows = [f"{r}UNSHARD,{row},{r}RESHARD" for r, row in enumerate(schedule.to_csv().splitlines())]
    read = parse_csv("\n".join(rows) + "\n")
    assert read.orders == schedule.orders
    # each rank gathers its stage before its first action and frees it after its last, as written
    assert [p.cells()[0] for p in lower_all(read)] == ["0UNSHARD", "1UNSHARD"]
    assert all(p.cells()[-1].endswith("RESHARD") for p in lower_all(read))
    with pytest.raises(CSVFormatError, match="rank 1 runs 1F0 while stage 1 is not gathered"):
        parse_csv("\n".join([rows[0], rows[1].replace("1UNSHARD,", "")]) + "\n")
