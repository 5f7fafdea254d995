"""A group's rows (pipesched.advise.layout_rows): the members of a group share one schedule search
and the pricing shares what depends on the simulation or the stages' layers alone, so a member's
rows must be those it gets priced on its own."""

from pipesched.advise.layout_rows import pricer
from pipesched.advise.layout_search import LayoutProblem, costs_for
from pipesched.advise.search import advise
from pipesched.parallel_layout import ParallelLayout
from test_advise_whole_search import BATCH, FABRIC, GPUS, _families, _model


def _rows(members, problem, searched_with):
    found = advise(2, cost_model=searched_with, microbatches=4, refuse_slow=False,
                   families=_families("interleaved-1f1b", "zb-h1"),
                   price=pricer(members, problem.fabric, problem.replica_latency)).candidates
    return [c.priced for c in found]


def test_a_member_s_rows_are_those_it_gets_priced_alone():
    problem = LayoutProblem(GPUS, BATCH, FABRIC, ())
    layouts = [ParallelLayout(2, replicas, 8 // replicas) for replicas in (1, 2, 4, 8)]  # FSDP, HSDP, DDP
    members = [(layout, costs_for(problem, _model(), layout)) for layout in layouts]
    together = _rows(members, problem, members[0][1])  # the search holds the group to its first member
    assert len(together) > 2 and {len(rows) for rows in together} == {len(members)}
    for index, member in enumerate(members):
        assert [rows[index] for rows in together] == [rows[0] for rows in _rows([member], problem, members[0][1])]
