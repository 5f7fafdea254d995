"""Every cell of a ``compute_comms`` CSV held to the compute cells' rules (issue 31): ASCII
digits, stage and microbatch numbers below 10**9, a stage its rank computes, a microbatch only
where the operation takes one; the same for the cells a compute-only file drops (REDUCE_GRAD,
UNSHARD, RESHARD). Each hostile cell is one line and exit 2 through the console script's entry
point (one process for every case: :func:`fuzz_cases.run_batch`)."""

from __future__ import annotations

from fuzz_cases import problems, run_batch

PROGRAM = ["0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD",
           "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD"]
COMPUTE_ONLY = ["0F0,0F1,0B0,0B1,0REDUCE_GRAD", "1F0,1B0,1F1,1B1,1REDUCE_GRAD"]


def _with(rows: list[str], rank: int, cell: str) -> str:
    edited = list(rows)
    edited[rank] += "," + cell
    return "\n".join(edited) + "\n"


def test_hostile_cells_are_refused_in_one_line(tmp_path):
    cases = {
        "reduce a stage of another rank": (_with(PROGRAM, 0, "1REDUCE_GRAD"), "rank 0: 1REDUCE_GRAD names stage 1, which runs on rank 1"),
        "unshard a stage of another rank": (_with(PROGRAM, 1, "0UNSHARD"), "rank 1: 0UNSHARD names stage 0, which runs on rank 0"),
        "unshard with a microbatch": (_with(PROGRAM, 0, "0UNSHARD5"), "UNSHARD names a stage and no microbatch"),
        "11-digit stage": (_with(PROGRAM, 0, "1" * 11 + "REDUCE_GRAD"), "the stage number has 11 digits"),
        "fullwidth digits": (_with(PROGRAM, 0, "\uff10REDUCE_GRAD"), "cannot parse action"),
        "fullwidth compute": (_with(PROGRAM, 0, "\uff10F\uff10"), "cannot parse action"),
        "compute-only: another rank's": (_with(COMPUTE_ONLY, 0, "1REDUCE_GRAD"), "rank 0: 1REDUCE_GRAD names stage 1, which runs on rank 1"),
        "compute-only: a microbatch": (_with(COMPUTE_ONLY, 1, "1RESHARD2"), "RESHARD names a stage and no microbatch"),
    }
    argvs = []
    for i, (text, _) in enumerate(cases.values()):
        path = tmp_path / f"case{i}.csv"
        path.write_text(text, encoding="utf-8")
        argvs.append(["simulate", "--csv", str(path), "--json"])
    for (label, (_, why)), outcome in zip(cases.items(), run_batch(argvs, tmp_path, bound_s=10)):
        assert outcome.code == 2 and not problems(outcome), (label, outcome)
        assert why in outcome.stderr, (label, outcome.stderr)
    valid = tmp_path / "valid.csv"
    valid.write_text("\n".join(PROGRAM) + "\n")
    assert run_batch([["simulate", "--csv", str(valid), "--json"]], tmp_path)[0].code == 0
